"""Reading stored-precision weights from safetensors files: fp8 and ComfyUI's scaled fp8.

Scaled fp8 (ComfyUI's formats, facts from its loader): a ``scaled_fp8`` marker tensor (its dtype is
the fp8 format) and, per layer, ``<layer>.scale_weight`` (older files) or ``<layer>.weight_scale``
(newer files, optionally with a ``<layer>.comfy_quant`` JSON tensor naming the format); the weight
is ``stored · scale``. ``scale_input`` / ``input_scale`` are for fp8 activations and are not needed
to dequantise. Plain fp8 files (``*_fp8_e4m3fn.safetensors``) have no scales. GGUF files:
:mod:`nodes.quant.gguf`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import torch

from nodes.core.tensors import ModelLoadError, TensorIndex
from nodes.core.weights import load_tensors
from nodes.quant.packed import PackedWeight

SCALE_SUFFIXES = (".scale_weight", ".weight_scale")
DROPPED_SUFFIXES = (".scale_input", ".input_scale", ".comfy_quant")
FP8_NAMES = {"F8_E4M3": "fp8_e4m3fn", "F8_E5M2": "fp8_e5m2"}


def read_packed(index: TensorIndex, prefix: str) -> dict[str, Any]:
    """The tensors under ``prefix`` (prefix removed), packed by :func:`pack_state_dict`. An
    all-in-one checkpoint may carry its ``scaled_fp8`` marker at the top level, outside the part's
    prefix: it marks the part too."""
    marked = index.has("scaled_fp8") or index.has(prefix + "scaled_fp8")
    return pack_state_dict(load_tensors(index, prefix), str(index.path), marked=marked)


def pack_state_dict(sd: Mapping[str, Any], where: str, *, marked: bool = False) -> dict[str, Any]:
    """``sd`` with fp8 weights as :class:`PackedWeight` (scales folded in, scale and marker tensors
    removed); other tensors unchanged. ``where`` names the file in errors; ``marked``: the file has
    a ``scaled_fp8`` marker outside ``sd`` (every weight then needs its scale)."""
    marker = next((k for k in sd if k == "scaled_fp8" or k.endswith(".scaled_fp8")), None)
    marked = marked or marker is not None
    _check_comfy_quant(sd, where)
    out: dict[str, Any] = {}
    for key, value in sd.items():
        if key == marker or key.endswith(SCALE_SUFFIXES + DROPPED_SUFFIXES):
            continue
        fmt = _fp8_format(value)
        if fmt is None:
            out[key] = value
            continue
        base = key.removesuffix(".weight")
        scale = next((sd[base + s] for s in SCALE_SUFFIXES if base + s in sd), None)
        if scale is None and key.endswith(".weight") and (marked or f"{base}.comfy_quant" in sd):
            raise ModelLoadError(
                f"{where}: this is a scaled-fp8 file (it has a 'scaled_fp8' marker or per-layer comfy_quant entries) "
                f"but {key!r} has no scale ({base}.scale_weight or {base}.weight_scale); its values would be wrong "
                "by an unknown factor. The file is incomplete or was converted wrongly: download it again or use "
                "the plain fp8/bf16 version of the model"
            )
        scale = None if scale is None else scale.to(torch.float32).reshape(-1)
        if scale is not None and scale.numel() == 1:
            scale = scale.reshape(())
        elif scale is not None and scale.numel() != value.shape[0]:
            raise ModelLoadError(
                f"{where}: the scale of {key!r} has {scale.numel()} values; Loom reads one per "
                f"tensor or one per output row ({value.shape[0]}): this scaled-fp8 variant is not supported"
            )
        packed = PackedWeight(value, fmt, tuple(value.shape), scale)
        out[key] = packed if value.dim() >= 2 else packed.dequantize()
    return out


def _fp8_format(value: Any) -> str | None:
    if isinstance(value, PackedWeight):
        return None
    dtype = getattr(value, "dtype", None)
    return (
        None
        if dtype is None
        else {torch.float8_e4m3fn: "fp8_e4m3fn", torch.float8_e5m2: "fp8_e5m2"}.get(dtype)
    )


def _check_comfy_quant(sd: Mapping[str, Any], where: str) -> None:
    """Refuse per-layer ``comfy_quant`` formats other than per-tensor fp8 (nvfp4, mxfp8, int8 blocks)."""
    for key, value in sd.items():
        if not key.endswith(".comfy_quant"):
            continue
        try:
            spec = json.loads(bytes(value.to("cpu").numpy().tobytes()).decode("utf-8"))
        except (ValueError, UnicodeDecodeError, AttributeError):
            continue
        fmt = str(spec.get("format", "")) if isinstance(spec, dict) else ""
        if fmt and fmt not in ("float8_e4m3fn", "float8_e5m2"):
            raise ModelLoadError(
                f"{where}: layer {key.removesuffix('.comfy_quant')!r} is quantized as {fmt!r}, "
                "which Loom does not read (it reads fp8 e4m3fn/e5m2 with per-tensor scales and "
                "GGUF files); use an fp8, GGUF or bf16 version of the model"
            )
