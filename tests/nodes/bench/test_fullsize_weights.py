"""The full-size benchmarks' weight writer: streamed safetensors files read back exactly (by the
safetensors package and memory-mapped), and the two files of a family benchmark hold the same model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from nodes.bench.fullsize_weights import (
    mapped_state,
    meta_module,
    random_state,
    write_safetensors,
    write_state,
)


def bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.reshape(-1).view(torch.uint8)


def test_streamed_file_reads_back_exactly(tmp_path: Path) -> None:
    state = {
        "w": torch.randn(5, 7).to(torch.bfloat16),
        "f8": torch.randn(3, 4).to(torch.float8_e4m3fn),
        "ids": torch.arange(6).reshape(2, 3),
        "scalar": torch.tensor(0.25),
        "empty": torch.empty(0, dtype=torch.float8_e4m3fn),
    }
    path = write_state(tmp_path / "s.safetensors", state)
    for name, read in (("safetensors", load_file(str(path))), ("mapped", mapped_state(path))):
        assert list(read) == list(state), name
        for key, value in state.items():
            assert read[key].dtype == value.dtype and torch.equal(bits(read[key]), bits(value))
    mapped = mapped_state(path)
    mapped.release()  # pages dropped from the resident set are read again, unchanged
    assert torch.equal(mapped["ids"], state["ids"])


def test_writer_refuses_tensors_that_do_not_match_the_header(tmp_path: Path) -> None:
    shapes = {"a": ((2, 2), torch.float32)}
    with pytest.raises(ValueError, match=r"'a' \(3,\) does not match"):
        write_safetensors(tmp_path / "bad.safetensors", shapes, [("a", torch.zeros(3))])


def test_random_state_is_seeded_per_tensor_and_keeps_norm_scales_near_one() -> None:
    from diffusers import SD3Transformer2DModel

    from nodes.bench.dit_family_runs import FAMILIES

    module = meta_module(SD3Transformer2DModel, FAMILIES["sd35_medium"].tiny)
    first, second = dict(random_state(module, torch.float32)), dict(random_state(module, torch.float32))
    assert all(torch.equal(first[k], second[k]) for k in first)
    assert set(first) == set(module.state_dict())
    norm = first["transformer_blocks.0.attn.norm_q.weight"]
    assert 0.9 < float(norm.mean()) < 1.1 and float(first["proj_out.weight"].std()) < 0.05


def test_family_bench_files_hold_the_same_model(tmp_path: Path) -> None:
    """Loom's load of the original-layout file equals the diffusers folder's tensors (both from the
    one random state): the full-size run compares the two sides on the same weights."""
    from nodes.bench.dit_family_runs import write_weights
    from nodes.load.handles import open_diffusion_model

    torch.set_num_threads(1)
    single, diffusers_dir = write_weights("sd35_medium", False, tmp_path, torch.bfloat16)
    reference = load_file(str(diffusers_dir / "diffusion_pytorch_model.safetensors"))
    loaded = open_diffusion_model(single).load().state_dict()
    assert set(loaded) == set(reference)
    assert all(torch.equal(loaded[k].to(torch.bfloat16), reference[k]) for k in reference)
