"""ComfyUI's latent operation nodes: LATENT_OPERATION values (tone mapping, sharpening) and the node
that applies one to a latent (LatentApplyOperationCFG, which applies one to the guidance, is in
:mod:`nodes.patches.guidance`).

An operation is a callable ``operation(latent=tensor) -> tensor``; the output latent keeps the input's
other keys, as in :mod:`nodes.latent.transforms`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from engine.context import NodeContext
from engine.node import Node
from engine.schema import FLOAT, INT, LATENT, Input, NodeSchema, Output
from nodes.core.resize import gaussian_kernel
from nodes.latent.transforms import samples_of, with_samples
from nodes.latent.vae import LatentError

LATENT_OPERATION = "LATENT_OPERATION"
LatentOperation = Callable[..., torch.Tensor]
_OUT = (Output("LATENT", LATENT, "The resulting latent."),)


class LatentApplyOperation(Node):
    SCHEMA = NodeSchema(
        node_id="LatentApplyOperation",
        display_name="LatentApplyOperation",
        category="latent/advanced/operations",
        description="Apply a latent operation (LatentOperationSharpen, LatentOperationTonemapReinhard) to a latent.",
        inputs=(
            Input("samples", LATENT, "A latent."),
            Input("operation", LATENT_OPERATION, "The operation."),
        ),
        outputs=_OUT,
        experimental=True,
    )

    def run(self, ctx: NodeContext, *, samples: dict, operation: LatentOperation) -> tuple[dict]:
        if not callable(operation):
            raise LatentError("operation: expected a LATENT_OPERATION from a LatentOperation* node")
        return (with_samples(samples, operation(latent=samples_of(samples, "samples"))),)


class LatentOperationTonemapReinhard(Node):
    SCHEMA = NodeSchema(
        node_id="LatentOperationTonemapReinhard",
        display_name="LatentOperationTonemapReinhard",
        category="latent/advanced/operations",
        description="Reinhard tone mapping of the per-pixel latent magnitude (mean + 5 std is the white point).",
        inputs=(
            Input("multiplier", FLOAT, "Scales the white point.", default=1.0, min=0.0, max=100.0, step=0.01),
        ),
        outputs=(Output("LATENT_OPERATION", LATENT_OPERATION, "The operation."),),
        experimental=True,
    )

    def run(self, ctx: NodeContext, *, multiplier: float) -> tuple[LatentOperation]:
        def tonemap(latent: torch.Tensor, **_: Any) -> torch.Tensor:
            magnitude = (torch.linalg.vector_norm(latent, dim=1) + 1e-10)[:, None]
            direction = latent / magnitude
            dims = list(range(1, magnitude.ndim))
            white = (
                torch.std(magnitude, dim=dims, keepdim=True) * 5
                + torch.mean(magnitude, dim=dims, keepdim=True)
            ) * multiplier
            scaled = magnitude / white
            return direction * (scaled / (scaled + 1.0)) * white

        return (tonemap,)


class LatentOperationSharpen(Node):
    SCHEMA = NodeSchema(
        node_id="LatentOperationSharpen",
        display_name="LatentOperationSharpen",
        category="latent/advanced/operations",
        description="Unsharp-mask the direction of each latent pixel (its magnitude is kept).",
        inputs=(
            Input(
                "sharpen_radius",
                INT,
                "Kernel radius.",
                default=9,
                min=1,
                max=31,
                step=1,
                extra={"advanced": True},
            ),
            Input(
                "sigma",
                FLOAT,
                "Gaussian width.",
                default=1.0,
                min=0.1,
                max=10.0,
                step=0.1,
                extra={"advanced": True},
            ),
            Input(
                "alpha",
                FLOAT,
                "Strength.",
                default=0.1,
                min=0.0,
                max=5.0,
                step=0.01,
                extra={"advanced": True},
            ),
        ),
        outputs=(Output("LATENT_OPERATION", LATENT_OPERATION, "The operation."),),
        experimental=True,
    )

    def run(
        self, ctx: NodeContext, *, sharpen_radius: int, sigma: float, alpha: float
    ) -> tuple[LatentOperation]:
        r = sharpen_radius

        def sharpen(latent: torch.Tensor, **_: Any) -> torch.Tensor:
            magnitude = (torch.linalg.vector_norm(latent, dim=1) + 1e-6)[:, None]
            direction = latent / magnitude
            channels = latent.shape[1]
            size = 2 * r + 1
            kernel = gaussian_kernel(size, sigma).to(latent) * (alpha * -10)
            kernel[r, r] = kernel[r, r] - kernel.sum() + 1.0
            padded = F.pad(direction, (r, r, r, r), mode="reflect")
            weight = kernel.repeat(channels, 1, 1).unsqueeze(1)
            out = F.conv2d(padded, weight, padding=size // 2, groups=channels)[:, :, r:-r, r:-r]
            return magnitude * out

        return (sharpen,)


NODES: list[type[Node]] = [
    LatentApplyOperation,
    LatentOperationTonemapReinhard,
    LatentOperationSharpen,
]
