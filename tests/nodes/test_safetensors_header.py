"""A safetensors file is recognised by its header, even when the header's length happens to begin
with byte 0x80 (the first byte of a pickle); real pickles and zip-packed torch files named
.safetensors are still refused with the rename advice."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch

from nodes.weights import ModelLoadError, read_index


def _safetensors_with_header_length(path: Path, low_byte: int) -> int:
    """Write a one-tensor safetensors file whose header length ends in ``low_byte``."""
    data = torch.zeros(2).numpy().tobytes()
    header = {"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, len(data)]}}
    raw = json.dumps(header).encode()
    raw += b" " * ((low_byte - len(raw)) % 256)  # safetensors allows trailing spaces in the header
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return len(raw)


def test_header_length_starting_with_0x80_is_read(tmp_path: Path) -> None:
    path = tmp_path / "lora.safetensors"
    assert _safetensors_with_header_length(path, 0x80) % 256 == 0x80
    assert path.read_bytes()[:1] == b"\x80"
    assert read_index(path).shape("w") == (2,)


@pytest.mark.parametrize("start", [b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8", b"PK\x03\x04\x00\x00\x00\x00\x08\x00"])
def test_pickles_named_safetensors_are_refused(start: bytes, tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    path.write_bytes(start + b"\x00" * 64)
    with pytest.raises(ModelLoadError, match="pickled PyTorch file named .safetensors"):
        read_index(path)
