"""Dequantisation (stored format → float tensor) and the storage conversions Loom makes itself.

Formats:

- ``fp8_e4m3fn`` / ``fp8_e5m2``: one byte per weight, times an optional scale (ComfyUI's scaled fp8
  files multiply the stored value by ``scale_weight`` / ``weight_scale``);
- ``int8``: symmetric int8 with one scale per output row (``w ≈ q · scale[row]``);
- ``F16`` / ``BF16``: half-precision storage cast at compute time (GGUF's unquantized 2-D weights);
- GGUF block formats (ggml's layouts, read from the ggml sources' definitions):
  ``Q8_0`` (32 int8 + f16 scale), ``Q4_0`` / ``Q4_1`` / ``Q5_0`` / ``Q5_1`` (32-element blocks of 4/5-bit
  values, f16 scale and, for ``_1``, f16 minimum), and the 256-element super-blocks ``Q4_K`` /
  ``Q5_K`` (8 sub-blocks with 6-bit scales and minimums) and ``Q6_K`` (16 sub-blocks, int8 scales).

All GGUF kernels are vectorised torch code over whole blocks (no per-element Python), computed in
the compute dtype when it is 16-bit (as ComfyUI-GGUF does) and in float32 otherwise.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from nodes.core.tensors import GGUF_BLOCKS

if TYPE_CHECKING:
    import torch
    from torch import Tensor

CAST_FORMATS = ("fp8_e4m3fn", "fp8_e5m2", "int8", "F16", "BF16")
SUPPORTED = (*CAST_FORMATS, *GGUF_BLOCKS)


class QuantError(ValueError):
    """A stored-precision weight cannot be used; the message names what, where and the fix."""


def torch_dtype(fmt: str) -> torch.dtype:
    """The torch dtype a cast format is stored in."""
    return {
        "fp8_e4m3fn": torch.float8_e4m3fn,
        "fp8_e5m2": torch.float8_e5m2,
        "int8": torch.int8,
        "F16": torch.float16,
        "BF16": torch.bfloat16,
    }[fmt]


def dequantize(
    data: Tensor, fmt: str, shape: tuple[int, ...], scale: Tensor | None, dtype: torch.dtype
) -> Tensor:
    """The float tensor of ``shape`` and ``dtype`` that ``data`` stores in ``fmt``."""
    if fmt in CAST_FORMATS:
        out = data.to(dtype)
        if scale is not None:
            out = out * (
                scale.to(dtype) if scale.dim() == 0 else scale.to(dtype).reshape(-1, *[1] * (out.dim() - 1))
            )
        return out
    kernel = _KERNELS.get(fmt)
    if kernel is None:
        raise QuantError(f"weights stored as {fmt} cannot be dequantised; Loom reads {', '.join(SUPPORTED)}")
    _, block_bytes = GGUF_BLOCKS[fmt]
    blocks = data.reshape(-1, block_bytes)
    return kernel(blocks, _work_dtype(dtype)).reshape(shape).to(dtype)


def _work_dtype(dtype: torch.dtype) -> torch.dtype:
    """GGUF blocks are decoded in the compute dtype when it is a 16-bit float (one rounding less
    is not worth a float32 pass per call), else in float32."""
    return dtype if dtype in (torch.bfloat16, torch.float16) else torch.float32


def quantize(weight: Tensor, fmt: str) -> tuple[Tensor, Tensor | None]:
    """``weight`` stored as ``fmt`` (``fp8_e4m3fn``, ``fp8_e5m2``: a plain cast, as ComfyUI's
    ``weight_dtype`` does, saturated to the format's range; ``int8``: per-row symmetric scale)."""
    if fmt in ("fp8_e4m3fn", "fp8_e5m2"):
        target = torch_dtype(fmt)
        limit = torch.finfo(target).max
        return weight.clamp(-limit, limit).to(target), None
    if fmt == "int8":
        w = weight.float().flatten(1)
        scale = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-12)
        q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8).reshape(weight.shape)
        return q, scale
    raise ValueError(f"Loom converts weights to fp8_e4m3fn, fp8_e5m2 or int8, not {fmt!r}")


# --- GGUF blocks ---------------------------------------------------------------------------------
def _f16(blocks: Tensor, start: int, dt: torch.dtype) -> Tensor:
    """The float16 at byte ``start`` of every block, in ``dt`` (n, 1)."""
    return blocks[:, start : start + 2].contiguous().view(torch.float16).to(dt)


def _q8_0(blocks: Tensor, dt: torch.dtype) -> Tensor:
    return _f16(blocks, 0, dt) * blocks[:, 2:].contiguous().view(torch.int8).to(dt)


def _nibbles(qs: Tensor) -> Tensor:
    """32 4-bit values of 16 bytes: low nibbles are elements 0-15, high nibbles 16-31 (uint8)."""
    return torch.cat([qs & 0xF, qs >> 4], dim=-1)


def _fifth_bits(qh: Tensor) -> Tensor:
    """The 32 high bits of Q5_0/Q5_1 (a little-endian uint32 per block) as (n, 32) uint8 0/16."""
    shifts = torch.arange(8, device=qh.device, dtype=torch.uint8)
    bits = (qh.contiguous()[:, :, None] >> shifts) & 1  # byte k, bit b -> element 8k + b
    return bits.reshape(-1, 32) << 4


def _q4_0(blocks: Tensor, dt: torch.dtype) -> Tensor:
    return _f16(blocks, 0, dt) * (_nibbles(blocks[:, 2:]).to(dt) - 8)


def _q4_1(blocks: Tensor, dt: torch.dtype) -> Tensor:
    return _f16(blocks, 0, dt) * _nibbles(blocks[:, 4:]).to(dt) + _f16(blocks, 2, dt)


def _q5_0(blocks: Tensor, dt: torch.dtype) -> Tensor:
    q = _nibbles(blocks[:, 6:]) | _fifth_bits(blocks[:, 2:6])
    return _f16(blocks, 0, dt) * (q.to(dt) - 16)


def _q5_1(blocks: Tensor, dt: torch.dtype) -> Tensor:
    q = _nibbles(blocks[:, 8:]) | _fifth_bits(blocks[:, 4:8])
    return _f16(blocks, 0, dt) * q.to(dt) + _f16(blocks, 2, dt)


def _k_scales(scales: Tensor, dt: torch.dtype) -> tuple[Tensor, Tensor]:
    """The 8 six-bit scales and minimums packed in the 12 scale bytes of Q4_K / Q5_K (n, 8) each."""
    s = scales.to(torch.int32)
    sc = torch.cat([s[:, 0:4] & 63, (s[:, 8:12] & 0xF) | ((s[:, 0:4] >> 6) << 4)], dim=1)
    mn = torch.cat([s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)], dim=1)
    return sc.to(dt), mn.to(dt)


def _k_apply(blocks: Tensor, q: Tensor, dt: torch.dtype) -> Tensor:
    """``d·scale·q − dmin·min`` per 32-element sub-block of a Q4_K / Q5_K super-block."""
    sc, mn = _k_scales(blocks[:, 4:16], dt)
    d, dmin = _f16(blocks, 0, dt), _f16(blocks, 2, dt)
    values = (d * sc)[:, :, None] * q.reshape(-1, 8, 32).to(dt) - (dmin * mn)[:, :, None]
    return values.reshape(-1, 256)


def _k_nibbles(qs: Tensor) -> Tensor:
    """128 bytes → 256 values: each 32-byte run gives 32 low nibbles, then 32 high ones (n, 4, 2, 32) uint8."""
    q = qs.reshape(-1, 4, 1, 32)
    return torch.cat([q & 0xF, q >> 4], dim=2)


def _q4_k(blocks: Tensor, dt: torch.dtype) -> Tensor:
    return _k_apply(blocks, _k_nibbles(blocks[:, 16:144]), dt)


def _q5_k(blocks: Tensor, dt: torch.dtype) -> Tensor:
    qh = blocks[:, 16:48].reshape(-1, 1, 1, 32)
    shifts = torch.arange(8, device=blocks.device, dtype=torch.uint8).reshape(1, 4, 2, 1)
    return _k_apply(blocks, _k_nibbles(blocks[:, 48:176]) | (((qh >> shifts) & 1) << 4), dt)


def _q6_k(blocks: Tensor, dt: torch.dtype) -> Tensor:
    ql = blocks[:, :128].reshape(-1, 2, 1, 2, 32)  # half, (low|high nibble), run, element
    qh = blocks[:, 128:192].reshape(-1, 2, 1, 1, 32)
    nib = torch.cat([ql & 0xF, ql >> 4], dim=2)
    shifts = torch.tensor([[0, 2], [4, 6]], device=blocks.device, dtype=torch.uint8).reshape(1, 1, 2, 2, 1)
    q = (nib | (((qh >> shifts) & 3) << 4)).reshape(-1, 16, 16).to(dt) - 32
    scales = blocks[:, 192:208].contiguous().view(torch.int8).to(dt)
    return (_f16(blocks, 208, dt)[:, :, None] * scales[:, :, None] * q).reshape(-1, 256)


_KERNELS: dict[str, Callable[[Any, Any], Any]] = {
    "Q8_0": _q8_0,
    "Q4_0": _q4_0,
    "Q4_1": _q4_1,
    "Q5_0": _q5_0,
    "Q5_1": _q5_1,
    "Q4_K": _q4_k,
    "Q5_K": _q5_k,
    "Q6_K": _q6_k,
}
