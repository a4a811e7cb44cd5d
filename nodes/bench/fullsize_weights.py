"""Full-size random transformers for the benchmarks without holding them twice in memory.

A real config is built on the meta device (no memory); its tensors are drawn one at a time
(seeded per tensor, so two files of the same model agree) and streamed into a safetensors file;
files are read back memory-mapped (views of the page cache, not copies). A 2.5 B-parameter
transformer in bf16 is written with well under one tensor's worth of extra memory; converting it
to another key layout holds only the tensors the conversion concatenates.
"""

from __future__ import annotations

import json
import mmap
import struct
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

SAFETENSORS_DTYPES = {
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}
FROM_SAFETENSORS = {name: dtype for dtype, name in SAFETENSORS_DTYPES.items()}


def random_value(key: str, shape: torch.Size, index: int, seed: int) -> torch.Tensor:
    """A trained-looking random fp32 value: weights ~ N(0, 0.02), norm scales near one."""
    generator = torch.Generator().manual_seed(seed * 100_003 + index)
    values = torch.randn(shape, generator=generator) * 0.02
    parts = key.split(".")
    if len(parts) >= 2 and "norm" in parts[-2] and parts[-1] == "weight":
        values += 1.0
    return values


def random_state(meta_module: Any, dtype: torch.dtype, seed: int = 7) -> Iterator[tuple[str, torch.Tensor]]:
    """``meta_module``'s state dict filled with seeded random values in ``dtype``, one at a time."""
    for index, (key, meta) in enumerate(meta_module.state_dict().items()):
        yield key, random_value(key, meta.shape, index, seed).to(dtype)


def write_safetensors(
    path: Path,
    shapes: Mapping[str, tuple[tuple[int, ...], torch.dtype]],
    tensors: Iterable[tuple[str, torch.Tensor]],
) -> Path:
    """Stream ``tensors`` (in the order of ``shapes``) into a safetensors file at ``path``."""
    header: dict[str, Any] = {}
    offset = 0
    for key, (shape, dtype) in shapes.items():
        size = torch.Size(shape).numel() * torch.empty(0, dtype=dtype).element_size()
        header[key] = {
            "dtype": SAFETENSORS_DTYPES[dtype],
            "shape": list(shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for (key, tensor), expected in zip(tensors, shapes, strict=True):
            if key != expected or tuple(tensor.shape) != tuple(shapes[key][0]):
                raise ValueError(
                    f"{path}: tensor {key!r} {tuple(tensor.shape)} does not match the header's {expected!r}"
                )
            f.write(tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return path


def write_state(path: Path, state: Mapping[str, torch.Tensor]) -> Path:
    """A dict of tensors streamed to a safetensors file (no serialised copy of the whole dict)."""
    shapes = {k: (tuple(v.shape), v.dtype) for k, v in state.items()}
    return write_safetensors(path, shapes, state.items())


class MappedState(dict[str, torch.Tensor]):
    """Tensors that are views of a private memory map of one file (see :func:`mapped_state`)."""

    mapped: mmap.mmap | None = None

    def release(self) -> None:
        """Drop the file pages read so far from this process's resident set (they are read again
        from the page cache on the next access): a full pass over a 4.6 GiB file otherwise stays in
        RSS for the rest of the run."""
        if self.mapped is not None:
            self.mapped.madvise(mmap.MADV_DONTNEED)


def mapped_state(path: Path) -> MappedState:
    """The tensors of a safetensors file as views of a private memory map (nothing copied)."""
    with open(path, "rb") as f:
        length = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(length))
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    start = 8 + length
    out = MappedState()
    out.mapped = mapped
    for key, info in header.items():
        if key == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        if end == begin:  # frombuffer refuses a count of zero
            raw = torch.empty(0, dtype=torch.uint8)
        else:
            raw = torch.frombuffer(mapped, dtype=torch.uint8, count=end - begin, offset=start + begin)
        out[key] = raw.view(FROM_SAFETENSORS[info["dtype"]]).reshape(info["shape"])
    return out


def meta_module(cls: Any, config: Mapping[str, Any]) -> Any:
    """The diffusers model ``cls(**config)`` on the meta device."""
    with torch.device("meta"):
        return cls(**config)


def rss_gib() -> float:
    """The process's resident set now, in GiB (Linux)."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * mmap.PAGESIZE / 2**30
