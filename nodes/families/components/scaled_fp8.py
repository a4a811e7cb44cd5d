"""ComfyUI's "fp8 scaled" weight files (``*_fp8_scaled.safetensors``, e.g. the Qwen2.5-VL-7B encoder of
ComfyUI's Qwen-Image template): each quantised ``<name>.weight`` is stored in fp8 next to a float
``<name>.scale_weight`` (the real weight is their product) and sometimes a ``<name>.scale_input``
(an activation scale for fp8 matmuls, not needed when computing in higher precision); a root
``scaled_fp8`` tensor marks the file. Loom dequantises on load."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SCALE_SUFFIXES = (".scale_weight", ".scale_input")


def dequantize(sd: Mapping[str, Any]) -> dict[str, Any]:
    """``sd`` with every scaled weight multiplied out (float32) and the scale tensors dropped; a
    state dict without scales comes back unchanged."""
    if not any(k.endswith(".scale_weight") for k in sd):
        return dict(sd)
    out: dict[str, Any] = {}
    for name, tensor in sd.items():
        if name.endswith(SCALE_SUFFIXES) or name == "scaled_fp8":
            continue
        scale = sd.get(name.removesuffix(".weight") + ".scale_weight") if name.endswith(".weight") else None
        out[name] = tensor if scale is None else tensor.float() * scale.float()
    return out


class IdentityKeys:
    """The key table of a kind whose files already use its module's names (below the part's
    prefix): nothing is renamed; fp8-scaled weights are multiplied out on the way in."""

    def to_diffusers(self, sd: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
        return dequantize(sd)

    def to_original(self, sd: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
        return dict(sd)

    def module_keys(self, sd: dict[str, Any]) -> dict[str, Any]:
        return sd
