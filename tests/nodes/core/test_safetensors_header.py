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
