"""Tensors are read from safetensors files with plain reads into memory of their own, never through
a mapping of the file (whose pages counted as the process's memory while a UNet loaded): the same
values, dtypes and shapes as the safetensors package gives, and a clear error for a file that ends
inside a tensor."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from nodes.core.tensors import ModelLoadError
from nodes.core.weights import load_tensors, read_index


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "model.a.weight": torch.randn(3, 5, generator=g).half(),
        "model.b.weight": torch.randn(7, generator=g).bfloat16(),
        "model.c.weight": torch.randn(2, 2, 2, generator=g),
        "model.ids": torch.arange(77, dtype=torch.int64).reshape(1, 77),
        "model.mask": torch.tensor([True, False, True]),
        "model.fp8": torch.randn(4, 4, generator=g).to(torch.float8_e4m3fn),
        "model.scale": torch.tensor(0.5),
        "model.empty": torch.zeros(0, 3),
        "other.weight": torch.ones(2),
    }


def test_reads_every_dtype_as_the_safetensors_package_does(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    save_file(_tensors(), str(path))
    expected = {
        k.removeprefix("model."): v for k, v in load_file(str(path)).items() if k.startswith("model.")
    }
    got = load_tensors(read_index(path), "model.")
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert got[key].dtype == value.dtype and got[key].shape == value.shape, key
        assert torch.equal(got[key].reshape(-1).view(torch.uint8), value.reshape(-1).view(torch.uint8)), key
    got["a.weight"].add_(1)  # memory of its own: writable, and the file is unchanged
    assert torch.equal(load_file(str(path))["model.a.weight"], _tensors()["model.a.weight"])


def test_the_file_is_not_mapped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "m.safetensors"
    save_file(_tensors(), str(path))

    def no_mapping(*args: object, **kwargs: object) -> None:
        raise AssertionError("safe_open maps the whole file into the process")

    monkeypatch.setattr("safetensors.safe_open", no_mapping)
    monkeypatch.setattr("nodes.core.weights.safe_open", no_mapping)  # the name weights imported
    assert torch.equal(load_tensors(read_index(path), "other.")["weight"], torch.ones(2))


def test_a_file_that_ends_inside_a_tensor_says_so(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    save_file({"w": torch.ones(64)}, str(path))
    index = read_index(path)
    path.write_bytes(path.read_bytes()[:-16])  # cut after the header was read
    with pytest.raises(ModelLoadError, match=r"m.safetensors: file ends inside tensor 'w'"):
        load_tensors(index)
