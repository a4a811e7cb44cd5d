"""A weight kept in its stored precision: :class:`PackedWeight`.

A packed weight is what a quantized file (GGUF, fp8, scaled fp8) or a storage conversion (UNETLoader's
``weight_dtype``, int8) holds for one weight tensor: the stored data, the format name, the logical
shape and, for fp8/int8, a scale (one number per tensor or one per output row). It is dequantised
only when a layer computes (see :mod:`nodes.quant.layers`).

Families' key tables (``to_diffusers``) split and join fused weights along the output axis (Flux's
``qkv`` into q, k, v; its final modulation's halves swapped). Those are row operations, and every
stored format keeps whole rows (GGUF blocks run along the innermost axis), so a packed weight
supports ``chunk``/``split``/row slices and ``torch.cat`` along dim 0 without dequantising. Any other
operation a key table might apply falls back to the dequantised float32 tensor (correct, but that
tensor is then kept in full precision), with a logged warning.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch

from nodes.quant.kernels import QuantError, dequantize

if TYPE_CHECKING:
    import torch

log = logging.getLogger("loom.quant")

FP8_FORMATS = ("fp8_e4m3fn", "fp8_e5m2")
SCALED_FORMATS = (*FP8_FORMATS, "int8")  # data has the logical shape; an optional scale multiplies it


@dataclass(frozen=True, eq=False)
class PackedWeight:
    """One weight in stored precision (see the module docstring).

    ``data``: fp8 or int8 tensors of the logical ``shape`` for the scaled formats; for GGUF types
    (``Q4_K``, ``Q8_0``...), the raw blocks as uint8 with one row per output row (``shape[0]``).
    ``scale``: None (1), a 0-d float32 tensor (per tensor) or a 1-d one of ``shape[0]`` (per row)."""

    data: torch.Tensor
    fmt: str
    shape: tuple[int, ...]
    scale: torch.Tensor | None = None

    # --- tensor-like surface used by key tables ---------------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.shape)

    def dim(self) -> int:
        return len(self.shape)

    def size(self, dim: int | None = None) -> Any:
        return self.shape if dim is None else self.shape[dim]

    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        """Bytes held (data and scale)."""
        scale = 0 if self.scale is None else self.scale.numel() * self.scale.element_size()
        return int(self.data.numel() * self.data.element_size()) + scale

    def rows(self, start: int, stop: int) -> PackedWeight:
        """Output rows ``start:stop`` (no copy of the data)."""
        scale = self.scale if self.scale is None or self.scale.dim() == 0 else self.scale[start:stop]
        return replace(self, data=self.data[start:stop], shape=(stop - start, *self.shape[1:]), scale=scale)

    def take_rows(self, index: torch.Tensor) -> PackedWeight:
        """The rows at ``index`` (a permutation or selection of output rows), copied."""
        scale = self.scale if self.scale is None or self.scale.dim() == 0 else self.scale[index]
        return replace(self, data=self.data[index], shape=(int(index.numel()), *self.shape[1:]), scale=scale)

    def split(self, sizes: int | Sequence[int], dim: int = 0) -> tuple[Any, ...]:
        if dim != 0:
            return tuple(self.dequantize().split(sizes, dim))  # type: ignore[arg-type]
        rows = self.shape[0]
        widths = (
            list(sizes)
            if not isinstance(sizes, int)
            else [min(sizes, rows - s) for s in range(0, rows, sizes)]
        )
        if sum(widths) != rows:
            raise QuantError(f"cannot split {rows} rows into {widths}")
        out, start = [], 0
        for w in widths:
            out.append(self.rows(start, start + w))
            start += w
        return tuple(out)

    def chunk(self, chunks: int, dim: int = 0) -> tuple[Any, ...]:
        if dim != 0 or self.shape[0] % chunks:
            return tuple(self.dequantize().chunk(chunks, dim))
        return self.split(self.shape[0] // chunks)

    def __getitem__(self, item: Any) -> Any:
        if isinstance(item, slice) and item.step in (None, 1):
            start, stop, _ = item.indices(self.shape[0])
            return self.rows(start, stop)
        return self.dequantize()[item]

    def __getattr__(self, name: str) -> Any:
        # Any other tensor method: work on the dequantised tensor (see the module docstring).
        if name.startswith("__") or name in ("data", "fmt", "shape", "scale"):
            raise AttributeError(name)
        _note_fallback(f"Tensor.{name}")
        return getattr(self.dequantize(), name)

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Sequence[Any] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}

        if func is torch.cat:
            joined = _cat_rows(
                args[0] if args else kwargs["tensors"], args[1] if len(args) > 1 else kwargs.get("dim", 0)
            )
            if joined is not None:
                return joined
        _note_fallback(getattr(func, "__name__", str(func)))
        return func(*_dequantize_all(args), **{k: _dequantize_all(v) for k, v in kwargs.items()})

    # --- values -----------------------------------------------------------------------------------
    def dequantize(self, dtype: Any = None, device: Any = None) -> torch.Tensor:
        """The weight as a float tensor of ``shape`` (float32 unless ``dtype``)."""
        dtype = dtype or torch.float32
        data = self.data if device is None else self.data.to(device, non_blocking=True)
        scale = self.scale if self.scale is None or device is None else self.scale.to(device)
        return dequantize(data, self.fmt, self.shape, scale, dtype)

    def to(self, *args: Any, **kwargs: Any) -> Any:
        return self.dequantize().to(*args, **kwargs)


def is_packed(value: Any) -> bool:
    return isinstance(value, PackedWeight)


def _cat_rows(tensors: Sequence[Any], dim: int) -> PackedWeight | None:
    """Packed weights of one format joined along rows, or None when that is not possible."""
    if dim != 0 or not tensors or not all(isinstance(t, PackedWeight) for t in tensors):
        return None
    first: PackedWeight = tensors[0]
    if any(
        t.fmt != first.fmt or t.shape[1:] != first.shape[1:] or t.data.shape[1:] != first.data.shape[1:]
        for t in tensors
    ):
        return None
    data = torch.cat([t.data for t in tensors])
    shape = (sum(t.shape[0] for t in tensors), *first.shape[1:])
    scales = [t.scale for t in tensors]
    if all(s is None for s in scales):
        return PackedWeight(data, first.fmt, shape)
    if all(s is not None and s.dim() == 0 for s in scales) and all(
        bool(torch.equal(s, scales[0])) for s in scales
    ):  # type: ignore[arg-type]
        return PackedWeight(data, first.fmt, shape, scales[0])
    per_row = [
        torch.ones(t.shape[0]) if t.scale is None else t.scale.float().expand(t.shape[0]) for t in tensors
    ]
    return PackedWeight(data, first.fmt, shape, torch.cat(per_row).contiguous())


def _dequantize_all(value: Any) -> Any:
    if isinstance(value, PackedWeight):
        return value.dequantize()
    if isinstance(value, (list, tuple)):
        return type(value)(_dequantize_all(v) for v in value)
    return value


def _note_fallback(what: str) -> None:
    log.warning(
        "a key table applied %s to a stored-precision weight; that weight is kept dequantised "
        "(float32) instead of in its stored format",
        what,
    )
