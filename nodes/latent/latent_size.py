"""ComfyUI's GetLatentSize: a latent's width, height, frames and batch size, in latent cells."""

from __future__ import annotations

from typing import Any

import torch

from engine.context import NodeContext
from engine.node import Node
from engine.schema import INT, LATENT, Input, NodeSchema, Output


class GetLatentSize(Node):
    SCHEMA = NodeSchema(
        node_id="GetLatentSize",
        display_name="Get Latent Size",
        category="latent",
        description="Width, height, frames and batch size of a latent (in latent cells, not pixels).",
        inputs=(Input("latent", LATENT, "The image or video latent to measure."),),
        outputs=(
            Output("width", INT, "Width in latent cells."),
            Output("height", INT, "Height in latent cells."),
            Output("frames", INT, "Frames (1 for an image latent)."),
            Output("batch_size", INT, "Latents in the batch."),
        ),
    )

    def run(self, ctx: NodeContext, *, latent: Any) -> tuple[int, int, int, int]:
        samples = latent.get("samples") if isinstance(latent, dict) else None
        if isinstance(samples, list | tuple) and samples:  # several streams: the first is measured
            samples = samples[0]
        if not isinstance(samples, torch.Tensor) or samples.ndim not in (4, 5):
            found = (
                type(samples).__name__
                if not isinstance(samples, torch.Tensor)
                else f"shape {tuple(samples.shape)}"
            )
            raise ValueError(
                f"latent: expected samples [B, C, H, W] or [B, C, T, H, W], found {found}; "
                "connect a LATENT from Empty Latent Image or VAE Encode"
            )
        frames = samples.shape[2] if samples.ndim == 5 else 1
        return (int(samples.shape[-1]), int(samples.shape[-2]), int(frames), int(samples.shape[0]))


NODES = [GetLatentSize]
