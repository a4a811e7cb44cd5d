"""Latents as 2×2 patch tokens, the layout the Flux-style transformers (Flux.1, Chroma, Flux.2's VAE
latent, Qwen-Image, Z-Image's patch embedder) and their control models take: :func:`pack` (with
Flux's (0, row, col) image ids), :func:`unpack` and :func:`pad_to_even` (ComfyUI's circular pad of an
odd latent)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def pack(x: Tensor) -> tuple[Tensor, Tensor]:
    """(B, C, H, W) → tokens (B, H/2·W/2, 4C) in 2×2 patches (channel, row, col order), and the
    image ids (H/2·W/2, 3): (0, row, col)."""
    b, c, h, w = x.shape
    tokens = (
        x.reshape(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5).reshape(b, (h // 2) * (w // 2), 4 * c)
    )
    ids = torch.zeros(h // 2, w // 2, 3)
    ids[..., 1] = torch.arange(h // 2)[:, None]
    ids[..., 2] = torch.arange(w // 2)[None, :]
    return tokens, ids.reshape(-1, 3)


def unpack(tokens: Tensor, h: int, w: int) -> Tensor:
    """The inverse of :func:`pack` for an (even) latent of height ``h`` and width ``w``."""
    b, _, d = tokens.shape
    c = d // 4
    return tokens.reshape(b, h // 2, w // 2, c, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(b, c, h, w)


def pad_to_even(x: Tensor) -> Tensor:
    """``x`` padded by one row / column (circularly) where its height / width is odd."""
    pad_h, pad_w = x.shape[-2] % 2, x.shape[-1] % 2
    return F.pad(x, (0, pad_w, 0, pad_h), mode="circular") if pad_h or pad_w else x
