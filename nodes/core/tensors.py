"""What a model file holds, as read from its header: :class:`TensorIndex` (names, dtypes, shapes,
metadata) of :class:`TensorInfo` values, the dtype tables of the formats Loom reads (safetensors'
names and sizes, GGUF's block sizes) and :class:`ModelLoadError`, the error of a file that cannot
be used. The readers that make an index are ``nodes.core.weights`` (safetensors, pickles) and
``nodes.quant.gguf`` (``.gguf``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

DTYPE_BYTES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
}
# GGUF block formats (ggml's layouts): type name -> (elements per block, bytes per block)
GGUF_BLOCKS: dict[str, tuple[int, int]] = {
    "Q8_0": (32, 34),
    "Q4_0": (32, 18),
    "Q4_1": (32, 20),
    "Q5_0": (32, 22),
    "Q5_1": (32, 24),
    "Q4_K": (256, 144),
    "Q5_K": (256, 176),
    "Q6_K": (256, 210),
}
TORCH_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
}


class ModelLoadError(ValueError):
    """A model file cannot be used. The message names the file, the problem and the fix."""


@dataclass(frozen=True)
class TensorInfo:
    dtype: str  # safetensors name: F32, F16, BF16, ...
    shape: tuple[int, ...]
    offset: int | None = None  # where its bytes start in a safetensors file (None: other formats)

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        if self.dtype in GGUF_BLOCKS:  # a GGUF block format: bytes per block of elements
            elements, size = GGUF_BLOCKS[self.dtype]
            return -(-n // elements) * size
        return n * DTYPE_BYTES.get(self.dtype, 4)


@dataclass(frozen=True)
class TensorIndex:
    """Names and shapes of the tensors in a file, read from its header only."""

    path: Path
    tensors: Mapping[str, TensorInfo]
    metadata: Mapping[str, str] = field(default_factory=dict)
    pickled: bool = False

    def has(self, key: str) -> bool:
        return key in self.tensors

    def shape(self, key: str) -> tuple[int, ...]:
        info = self.tensors.get(key)
        if info is None:
            raise ModelLoadError(
                f"{self.path.name}: expected tensor {key!r}, which is missing; the file is incomplete"
            )
        return info.shape

    def keys_with(self, prefix: str) -> list[str]:
        return [k for k in self.tensors if k.startswith(prefix)]

    def any_with(self, prefix: str) -> bool:
        return any(k.startswith(prefix) for k in self.tensors)

    def count(self, pattern_prefix: str, index_pos: int = 0) -> int:
        """Number of distinct integers right after ``pattern_prefix`` (``...layers.{i}.``) + 1."""
        found = {
            int(part)
            for k in self.tensors
            if k.startswith(pattern_prefix)
            for part in [k[len(pattern_prefix) :].split(".")[index_pos]]
            if part.isdigit()
        }
        return max(found) + 1 if found else 0

    def nbytes(self, prefix: str = "") -> int:
        return sum(t.nbytes for k, t in self.tensors.items() if k.startswith(prefix))

    def main_dtype(self, prefix: str = "") -> str:
        sizes: dict[str, int] = {}
        for k, t in self.tensors.items():
            if k.startswith(prefix):
                sizes[t.dtype] = sizes.get(t.dtype, 0) + t.nbytes
        return max(sizes, key=lambda d: sizes[d]) if sizes else "F32"
