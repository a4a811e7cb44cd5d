"""Stability AI's SD3.5 ControlNet files (``sd3.5_large_controlnet_{blur,canny,depth}``): their
tensor names ⇄ diffusers' ``SD3ControlNetModel`` (``use_pos_embed=False``), and the sin-cos grid
ComfyUI adds to the patch-embedded latent they take (see ``dit_control``'s ``sd35`` layout)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

SD35_TYPES = {0: "blur", 1: "canny", 2: "depth"}  # the ``control_type`` of Stability's SD3.5 ControlNets
SD35_BLOCK = {  # inside transformer_blocks.N: Stability's name -> diffusers' (q/k/v fused in ``attn.qkv``)
    "adaLN_modulation.1": "norm1.linear",
    "attn.proj": "attn.to_out.0",
    "mlp.fc1": "ff.net.0.proj",
    "mlp.fc2": "ff.net.2",
}


def sd35_to_diffusers(sd: Mapping[str, Any]) -> dict[str, Any]:
    """A Stability SD3.5 ControlNet file renamed to ``SD3ControlNetModel``'s names (``control_type``
    dropped: it lives in the config)."""
    out: dict[str, Any] = {}
    for key, tensor in sd.items():
        if not key.startswith("transformer_blocks."):
            if key != "control_type":
                out[key] = tensor
            continue
        _, index, rest = key.split(".", 2)
        base, _, leaf = rest.rpartition(".")
        block = f"transformer_blocks.{index}"
        if base == "attn.qkv":
            for name, part in zip(("to_q", "to_k", "to_v"), tensor.chunk(3, dim=0), strict=True):
                out[f"{block}.attn.{name}.{leaf}"] = part
        else:
            out[f"{block}.{SD35_BLOCK.get(base, base)}.{leaf}"] = tensor
    return out


def diffusers_to_sd35(module: Any, control_type: int) -> dict[str, Any]:
    """An ``SD3ControlNetModel`` (``use_pos_embed=False``) as Stability's SD3.5 files hold it (the
    inverse of :func:`sd35_to_diffusers`)."""
    back = {ours: theirs for theirs, ours in SD35_BLOCK.items()}
    sd = module.state_dict()
    out: dict[str, Any] = {"control_type": torch.tensor(float(control_type))}
    for key, tensor in sd.items():
        if not key.startswith("transformer_blocks."):
            out[key] = tensor
            continue
        _, index, rest = key.split(".", 2)
        base, _, leaf = rest.rpartition(".")
        block = f"transformer_blocks.{index}"
        if base in ("attn.to_q", "attn.to_k", "attn.to_v"):
            if base == "attn.to_q":
                parts = [sd[f"{block}.attn.to_{n}.{leaf}"] for n in "qkv"]
                out[f"{block}.attn.qkv.{leaf}"] = torch.cat(parts, dim=0)
        else:
            out[f"{block}.{back.get(base, base)}.{leaf}"] = tensor
    return out


def sincos_grid(width: int, rows: int, cols: int) -> torch.Tensor:
    """ComfyUI's sin-cos table for an SD3.5 ControlNet's patch grid (1, rows·cols, width): positions
    spread evenly over 0..15 along the shorter side (and proportionally further along the longer),
    the column half first."""
    small = min(rows, cols)
    axes = [torch.linspace(7.5 - 7.5 * n / small, 7.5 + 7.5 * n / small, n) for n in (rows, cols)]
    grid_h, grid_w = torch.meshgrid(*axes, indexing="ij")
    omega = 1.0 / 10000 ** (torch.arange(width // 4, dtype=torch.float32) / (width / 4))

    def embed(pos: torch.Tensor) -> torch.Tensor:
        out = torch.outer(pos.reshape(-1), omega)
        return torch.cat([out.sin(), out.cos()], dim=1)

    return torch.cat([embed(grid_w), embed(grid_h)], dim=1).unsqueeze(0)
