"""Image preprocessors for control models. ``Canny`` is ComfyUI's core edge detector.

Library choice: kornia (``kornia.filters.canny``), not OpenCV. It is what ComfyUI's Canny node
runs, so the same thresholds (0..1 on float images) give the same edges; it works on torch tensors,
batched, on whichever device the image is (CPU or GPU) with no copy to NumPy; and it installs next
to Loom's torch with one small extra wheel (kornia-rs), without torchvision. OpenCV's ``cv2.Canny``
takes 8-bit single images and 0..255 thresholds, runs on the CPU only, one image at a time, and
computes gradients differently, so its edges would not match ComfyUI's.
"""

from __future__ import annotations

from typing import Any

import torch

from engine.context import NodeContext
from engine.node import Node
from engine.schema import FLOAT, IMAGE, Input, NodeSchema, Output


def canny_edges(image: torch.Tensor, low_threshold: float, high_threshold: float) -> torch.Tensor:
    """IMAGE [B, H, W, C] → IMAGE [B, H, W, 3] of 0/1 edges (after hysteresis), on the image's device."""
    from kornia.filters import canny  # lazy: kornia is slow to import; only Canny needs it

    if low_threshold > high_threshold:
        raise ValueError(
            f"low_threshold ({low_threshold}) must not be above high_threshold ({high_threshold}); "
            "lower it or raise high_threshold"
        )
    pixels = image[..., :3] if image.shape[-1] >= 3 else image[..., :1]
    _magnitude, edges = canny(pixels.movedim(-1, 1).float(), low_threshold, high_threshold)
    return edges.repeat(1, 3, 1, 1).movedim(1, -1)


class Canny(Node):
    SCHEMA = NodeSchema(
        node_id="Canny",
        display_name="Canny",
        category="image/preprocessors",
        description="Finds edges (Canny: Gaussian blur, Sobel gradients, non-maximum suppression, hysteresis "
        "between the two thresholds); white edges on black, e.g. for a Canny ControlNet.",
        inputs=(
            Input("image", IMAGE, "The images to find edges in."),
            Input(
                "low_threshold",
                FLOAT,
                "Gradient strength below which nothing is an edge; edges between the "
                "thresholds are kept only where they connect to strong ones.",
                default=0.4,
                min=0.01,
                max=0.99,
                step=0.01,
            ),
            Input(
                "high_threshold",
                FLOAT,
                "Gradient strength above which a pixel is surely an edge.",
                default=0.8,
                min=0.01,
                max=0.99,
                step=0.01,
            ),
        ),
        outputs=(
            Output("IMAGE", IMAGE, "The edge images (1 on edges, 0 elsewhere, in all three channels)."),
        ),
    )

    def run(
        self, ctx: NodeContext, *, image: Any, low_threshold: float, high_threshold: float
    ) -> tuple[torch.Tensor]:
        if not isinstance(image, torch.Tensor) or image.ndim != 4 or image.shape[-1] not in (1, 3, 4):
            got = (
                f"a tensor of shape {tuple(image.shape)}"
                if isinstance(image, torch.Tensor)
                else type(image).__name__
            )
            raise TypeError(
                f"input 'image' must be an IMAGE (a [batch, height, width, 3] tensor from LoadImage or "
                f"VAEDecode); got {got}"
            )
        return (canny_edges(image, float(low_threshold), float(high_threshold)),)


NODES = [Canny]
