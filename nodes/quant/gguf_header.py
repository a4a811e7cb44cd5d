"""Checking a GGUF file's header against the file's size before the ``gguf`` package reads it.

The package trusts every count in the header: a metadata array that claims 2^40 elements is
iterated element by element past the end of the file (memory grows without bound), nested arrays
recurse once per level. :func:`check_gguf_header` walks the same layout first and checks every
count, length and nesting depth against the bytes left before it is used, so a hostile or damaged
file fails at once with a :class:`ModelLoadError`.

Layout (https://github.com/ggml-org/ggml/blob/master/docs/gguf.md): ``GGUF``, uint32 version,
uint64 tensor count, uint64 metadata count; metadata ``(string key, uint32 type, value)``;
tensor infos ``(string name, uint32 n_dims, uint64 dims[n_dims], uint32 type, uint64 offset)``;
tensor data from the next multiple of ``general.alignment`` (default 32). Strings are a uint64
length and that many bytes. Little-endian, or big-endian when the version reads byte-swapped.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path

from nodes.core.tensors import ModelLoadError

SCALAR_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # GGUF value types
STRING, ARRAY, UINT32 = 8, 9, 4
VERSIONS = (2, 3)  # what the gguf package reads
MAX_ARRAY_DEPTH = 4  # arrays of arrays; no published file nests deeper than one level
MAX_DIMS = 8  # ggml tensors have at most 4 dimensions
MIN_KV_BYTES = 8 + 4 + 1  # empty key, type, smallest value
MIN_TENSOR_BYTES = 8 + 4 + 4 + 8  # empty name, n_dims (0), type, offset
DEFAULT_ALIGNMENT = 32


class HeaderCursor:
    """Reads the header of a mapped file front to back, refusing any read past its end."""

    def __init__(self, data: bytes | mmap.mmap, path: Path, order: str = "<") -> None:
        self.data, self.path, self.order, self.pos = data, path, order, 0

    @property
    def left(self) -> int:
        return len(self.data) - self.pos

    def damaged(self, what: str) -> ModelLoadError:
        return ModelLoadError(
            f"{self.path}: damaged GGUF header at byte {self.pos}: {what}; the file is truncated, "
            "damaged or not a real GGUF file: download it again"
        )

    def need(self, nbytes: int, what: str) -> None:
        if nbytes > self.left:
            raise self.damaged(
                f"{what} needs {nbytes} bytes, the file has only {self.left} bytes left (of {len(self.data)})"
            )

    def skip(self, nbytes: int, what: str) -> None:
        self.need(nbytes, what)
        self.pos += nbytes

    def number(self, fmt: str, what: str) -> int:
        size = struct.calcsize(fmt)
        self.need(size, what)
        (value,) = struct.unpack_from(self.order + fmt, self.data, self.pos)
        self.pos += size
        return int(value)

    def string(self, what: str) -> bytes:
        length = self.number("Q", f"the length of {what}")
        self.need(length, f"{what} (a string of {length} bytes)")
        raw = bytes(self.data[self.pos : self.pos + length])
        self.pos += length
        return raw

    def count(self, what: str, min_bytes: int) -> int:
        """A uint64 count of items of at least ``min_bytes`` each, checked against the bytes left."""
        n = self.number("Q", f"the count of {what}")
        self.need(n * min_bytes, f"{n} {what} of at least {min_bytes} bytes each")
        return n


def check_gguf_header(path: Path) -> None:
    """Refuse ``path`` with a ModelLoadError unless its GGUF header fits the file: every count,
    length and array nesting checked before it is used, every tensor's data inside the file."""
    path = Path(path)
    try:
        with path.open("rb") as f:
            if path.stat().st_size < 24:
                raise HeaderCursor(f.read(), path).damaged(
                    "the file is shorter than a GGUF header (24 bytes)"
                )
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                walk_header(HeaderCursor(data, path))
    except OSError as exc:
        raise ModelLoadError(f"{path}: cannot read this GGUF file ({exc})") from exc


def walk_header(cur: HeaderCursor) -> None:
    if bytes(cur.data[:4]) != b"GGUF":
        raise cur.damaged(f"expected the magic bytes b'GGUF', found {bytes(cur.data[:4])!r}")
    cur.pos = 4
    (version,) = struct.unpack_from("<I", cur.data, 4)
    if version & 0xFFFF == 0:  # written on a big-endian machine (the gguf package's test)
        cur.order = ">"
    version = cur.number("I", "the version")
    if version not in VERSIONS:
        raise cur.damaged(f"GGUF version {version}; Loom reads versions {', '.join(map(str, VERSIONS))}")
    tensors = cur.number("Q", "the tensor count")
    alignment = DEFAULT_ALIGNMENT
    for _ in range(cur.count("metadata entries", MIN_KV_BYTES)):
        key = cur.string("a metadata key")
        kind = cur.number("I", f"the type of metadata {key!r}")
        if key == b"general.alignment" and kind == UINT32:
            alignment = cur.number("I", "general.alignment")
            if alignment <= 0 or alignment & (alignment - 1):
                raise cur.damaged(f"general.alignment is {alignment}, expected a power of two")
            continue
        skip_value(cur, kind, f"metadata {key[:80].decode('utf-8', 'replace')!r}", 0)
    cur.need(tensors * MIN_TENSOR_BYTES, f"{tensors} tensor infos of at least {MIN_TENSOR_BYTES} bytes each")
    infos = [tensor_info(cur) for _ in range(tensors)]
    data_start = -(-cur.pos // alignment) * alignment
    for name, nbytes, offset in infos:
        end = data_start + offset + nbytes
        if end > len(cur.data):
            raise cur.damaged(
                f"tensor {name!r} ({nbytes} bytes at data offset {offset}) ends at byte {end}, "
                f"past the end of the file ({len(cur.data)} bytes)"
            )


def skip_value(cur: HeaderCursor, kind: int, what: str, depth: int) -> None:
    if kind in SCALAR_BYTES:
        cur.skip(SCALAR_BYTES[kind], what)
    elif kind == STRING:
        cur.string(what)
    elif kind == ARRAY:
        item = cur.number("I", f"the item type of {what}")
        if item in SCALAR_BYTES:
            n = cur.number("Q", f"the length of {what}")
            cur.skip(n * SCALAR_BYTES[item], f"{what} ({n} items of {SCALAR_BYTES[item]} bytes)")
        elif item == STRING:
            for _ in range(cur.count(f"strings in {what}", 8)):
                cur.string(f"a string in {what}")
        elif item == ARRAY:
            if depth + 1 >= MAX_ARRAY_DEPTH:
                raise cur.damaged(f"{what} holds arrays nested more than {MAX_ARRAY_DEPTH} deep")
            for _ in range(cur.count(f"arrays in {what}", 12)):
                skip_value(cur, ARRAY, what, depth + 1)
        else:
            raise cur.damaged(f"{what} is an array of unknown value type {item}")
    else:
        raise cur.damaged(f"{what} has unknown value type {kind}")


def tensor_info(cur: HeaderCursor) -> tuple[str, int, int]:
    """(name, bytes of data, offset from the data start) of the next tensor info."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType  # lazy: gguf imports numpy

    name = cur.string("a tensor name").decode("utf-8", "replace")
    n_dims = cur.number("I", f"the number of dimensions of tensor {name!r}")
    if n_dims > MAX_DIMS:
        raise cur.damaged(
            f"tensor {name!r} says it has {n_dims} dimensions; GGUF tensors have at most {MAX_DIMS}"
        )
    elements = 1
    for _ in range(n_dims):
        elements *= cur.number("Q", f"a dimension of tensor {name!r}")
    kind = cur.number("I", f"the type of tensor {name!r}")
    try:
        block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
    except (ValueError, KeyError):
        raise cur.damaged(f"tensor {name!r} has unknown type {kind}") from None
    offset = cur.number("Q", f"the data offset of tensor {name!r}")
    return name, -(-elements // block) * block_bytes, offset
