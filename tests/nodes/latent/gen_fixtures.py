"""Small helpers for the generation tests (the tiny models themselves come from conftest.py)."""

from __future__ import annotations

import torch


def gradient_image(size: int = 64, batch: int = 1) -> torch.Tensor:
    """A smooth test picture [B, H, W, 3] in 0..1."""
    ys = torch.linspace(0, 1, size).view(size, 1).expand(size, size)
    xs = torch.linspace(0, 1, size).view(1, size).expand(size, size)
    img = torch.stack([xs, ys, (xs + ys) / 2], dim=-1)
    return img.unsqueeze(0).repeat(batch, 1, 1, 1)
