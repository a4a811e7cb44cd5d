"""Pickles and zip-packed torch files named .safetensors are refused with the rename advice (the
header check that lets a safetensors length starting with 0x80 or "PK" through is in test_loaders)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodes.core.tensors import ModelLoadError
from nodes.core.weights import read_index


@pytest.mark.parametrize(
    "start",
    [b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8", b"PK\x03\x04\x00\x00\x00\x00\x08\x00"],
    ids=["pickle", "zip"],
)
def test_pickles_named_safetensors_are_refused(start: bytes, tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    path.write_bytes(start + b"\x00" * 64)
    with pytest.raises(ModelLoadError, match="pickled PyTorch file named .safetensors"):
        read_index(path)


def write_header(path: Path, header: bytes, data: bytes = b"") -> Path:
    import struct

    path.write_bytes(struct.pack("<Q", len(header)) + header + data)
    return path


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        ({"dtype": "F32", "shape": [4, 4], "data_offsets": [0, 8]}, ("needs 64 bytes", "span 8")),
        ({"dtype": "F16", "shape": [2], "data_offsets": [8, 4]}, ("data_offsets [8, 4]",)),
        ({"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}, ("negative dimension",)),
        ({"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}, ("truncated",)),
    ],
    ids=["shape-mismatch", "reversed", "negative", "past-the-end"],
)
def test_tensor_offsets_must_match_shape_dtype_and_the_file(
    entry: dict[str, object], words: tuple[str, ...], tmp_path: Path
) -> None:
    import json

    path = write_header(tmp_path / "model.safetensors", json.dumps({"w": entry}).encode(), b"\0" * 8)
    with pytest.raises(ModelLoadError) as caught:
        read_index(path)
    assert str(path) in str(caught.value) and "download" in str(caught.value)
    for word in words:
        assert word in str(caught.value)


def test_hostile_headers_are_refused_with_a_model_load_error(tmp_path: Path) -> None:
    deep = write_header(tmp_path / "deep.safetensors", b"[" * 100_000 + b"]" * 100_000)
    with pytest.raises(ModelLoadError, match="nested too deeply"):
        read_index(deep)
    entry = b'"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}'
    listed = write_header(
        tmp_path / "list.safetensors", b'{"__metadata__": [1, 2], ' + entry + b"}", b"\0" * 8
    )
    with pytest.raises(ModelLoadError, match="'__metadata__' to be an object of strings, found a list"):
        read_index(listed)
    good = write_header(
        tmp_path / "good.safetensors", b'{"__metadata__": {"a": "b"}, ' + entry + b"}", b"\0" * 8
    )
    assert read_index(good).tensors["w"].shape == (2,)
