"""Hostile GGUF headers: every count, length and nesting depth is checked against the bytes left
in the file before anything is iterated, so a 104-byte file that claims 2^40 array elements (or a
string of 2^60 bytes, 2^40 tensors, a tensor past the end) fails at once with a ModelLoadError
instead of growing memory without bound."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
import torch

from nodes.core.tensors import ModelLoadError
from nodes.core.weights import read_index
from nodes.quant.gguf import read_gguf_index, write_gguf

UINT8, UINT32, STRING, ARRAY, UINT64 = 0, 4, 8, 9, 10


def gguf_string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def gguf_file(tmp_path: Path, body: bytes, *, tensors: int = 0, kvs: int = 1, pad_to: int = 0) -> Path:
    data = b"GGUF" + struct.pack("<IQQ", 3, tensors, kvs) + body
    data += b"\0" * max(0, pad_to - len(data))
    path = tmp_path / "hostile.gguf"
    path.write_bytes(data)
    return path


def refused(path: Path, *words: str) -> str:
    with pytest.raises(ModelLoadError) as caught:
        read_index(path)
    message = str(caught.value)
    assert path.name in message and "download" in message, message
    for word in words:
        assert word in message, message
    return message


def test_an_array_claiming_2_to_the_40_elements_fails_at_once(tmp_path: Path) -> None:
    # the 104-byte file: one metadata ARRAY of UINT8 whose length says 2^40, the file ending after it
    body = gguf_string("general.architecture.bogus.array.key") + struct.pack("<IIQ", ARRAY, UINT8, 2**40)
    path = gguf_file(tmp_path, body, pad_to=104)
    assert path.stat().st_size == 104
    refused(path, "1099511627776", "bytes")


def test_an_array_of_strings_or_arrays_that_cannot_fit_fails_at_once(tmp_path: Path) -> None:
    strings = gguf_string("tokenizer.ggml.tokens") + struct.pack("<IIQ", ARRAY, STRING, 2**40)
    refused(gguf_file(tmp_path, strings, pad_to=200), "1099511627776")
    nested = gguf_string("a") + struct.pack("<IIQ", ARRAY, ARRAY, 2**40) + struct.pack("<IQ", UINT8, 0)
    refused(gguf_file(tmp_path, nested, pad_to=200), "1099511627776")


def test_arrays_nested_deeper_than_gguf_files_use_are_refused(tmp_path: Path) -> None:
    depth = 50_000  # a Python recursion per level in the gguf package's reader
    body = gguf_string("deep") + struct.pack("<I", ARRAY) + struct.pack("<IQ", ARRAY, 1) * depth
    body += struct.pack("<IQ", UINT8, 0)
    refused(gguf_file(tmp_path, body), "nested")


def test_a_string_longer_than_the_file_fails_at_once(tmp_path: Path) -> None:
    refused(gguf_file(tmp_path, struct.pack("<Q", 2**60) + b"key", pad_to=104), "1152921504606846976")
    value = gguf_string("general.name") + struct.pack("<IQ", STRING, 2**60)
    refused(gguf_file(tmp_path, value, pad_to=104), "1152921504606846976")


def test_counts_of_keys_and_tensors_are_checked_before_they_are_iterated(tmp_path: Path) -> None:
    refused(gguf_file(tmp_path, b"", kvs=2**40, pad_to=104), "1099511627776")
    refused(gguf_file(tmp_path, b"", tensors=2**40, kvs=0, pad_to=104), "1099511627776")


def test_tensor_infos_are_checked_against_the_file(tmp_path: Path) -> None:
    alignment = gguf_string("general.alignment") + struct.pack("<II", UINT32, 32)
    many_dims = gguf_string("w") + struct.pack("<I", 2**31)
    refused(gguf_file(tmp_path, alignment + many_dims, tensors=1, pad_to=200), "dimensions")
    huge = (
        gguf_string("w") + struct.pack("<I", 2) + struct.pack("<QQ", 2**40, 2**40) + struct.pack("<IQ", 0, 0)
    )
    refused(gguf_file(tmp_path, alignment + huge, tensors=1, pad_to=200), "'w'")
    past_end = gguf_string("w") + struct.pack("<I", 1) + struct.pack("<Q", 4) + struct.pack("<IQ", 0, 2**50)
    refused(gguf_file(tmp_path, alignment + past_end, tensors=1, pad_to=200), "'w'")
    zero = gguf_string("general.alignment") + struct.pack("<II", UINT32, 0)
    refused(gguf_file(tmp_path, zero, pad_to=104), "alignment")


def test_not_a_gguf_file_and_truncated_files_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "hostile.gguf"
    for data in (b"", b"GGUF", b"NOPE" + b"\0" * 100, b"GGUF" + struct.pack("<IQQ", 99, 0, 0)):
        path.write_bytes(data)
        refused(path)


def test_valid_files_still_read(tmp_path: Path) -> None:
    tensors = {"a.weight": torch.randn(64, 32), "b.bias": torch.randn(7)}
    path = write_gguf(tmp_path / "ok.gguf", tensors, "flux", lambda n, t: "Q8_0" if t.dim() == 2 else "F32")
    index = read_gguf_index(path)
    assert index.tensors["a.weight"].shape == (64, 32) and index.tensors["b.bias"].shape == (7,)
    assert index.metadata["gguf.architecture"] == "flux"
    import gguf

    writer = gguf.GGUFWriter(str(tmp_path / "arrays.gguf"), "llama")
    writer.add_array("tokenizer.ggml.tokens", ["a", "bb", ""])
    writer.add_array("nested", [[1, 2], [3]])
    writer.add_string("general.name", "x" * 1000)
    writer.add_tensor("token_embd.weight", torch.randn(3, 8).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert read_gguf_index(tmp_path / "arrays.gguf").tensors["model.embed_tokens.weight"].shape == (3, 8)
