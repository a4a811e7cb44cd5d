"""ComfyUI's empty video latent (``EmptyHunyuanLatentVideo``, ``comfy_extras/nodes_hunyuan.py``): its name is
ComfyUI's, and Wan 2.1's and Hunyuan Video's templates both start from it.

A video LATENT's ``samples`` are [B, C, t, h, w]: ``t`` latent frames, each standing for 4 video
frames after the first (the causal video VAEs), ``h``, ``w`` the image over 8.
"""

from __future__ import annotations

from typing import Any

import torch

from engine.context import NodeContext
from engine.node import Node, OutputSizes
from engine.schema import INT, LATENT, Input, NodeSchema, Output
from nodes.core.tensor_sizes import video_latent_size
from nodes.latent.vae import MAX_RESOLUTION

CHANNELS = 16  # Hunyuan Video's and Wan 2.1's latent channels


class EmptyHunyuanLatentVideo(Node):
    SCHEMA = NodeSchema(
        node_id="EmptyHunyuanLatentVideo",
        display_name="EmptyHunyuanLatentVideo",
        category="latent/video",
        description="Empty (zero) video latents [batch, 16, (length - 1) // 4 + 1, height/8, width/8].",
        inputs=(
            Input("width", INT, "Video width in pixels.", default=848, min=16, max=MAX_RESOLUTION, step=16),
            Input("height", INT, "Video height in pixels.", default=480, min=16, max=MAX_RESOLUTION, step=16),
            Input(
                "length", INT, "Frames (4k + 1 fits the VAE).", default=25, min=1, max=MAX_RESOLUTION, step=4
            ),
            Input("batch_size", INT, "Number of videos.", default=1, min=1, max=4096),
        ),
        outputs=(Output("LATENT", LATENT, "Zero video latents."),),
    )

    def run(
        self, ctx: NodeContext, *, width: int, height: int, length: int, batch_size: int = 1
    ) -> tuple[dict]:
        frames = (length - 1) // 4 + 1
        return ({"samples": torch.zeros(batch_size, CHANNELS, frames, height // 8, width // 8)},)

    @classmethod
    def estimate_outputs(
        cls, *, width: Any = None, height: Any = None, length: Any = None, batch_size: Any = None, **_: Any
    ) -> OutputSizes:
        return (video_latent_size(batch_size, CHANNELS, length, height, width),)


NODES: list[type[Node]] = [EmptyHunyuanLatentVideo]
