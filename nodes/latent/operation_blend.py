"""``LatentOperationBlend``: a LATENT_OPERATION that blends a latent toward a reference latent
(for ``LatentApplyOperation`` / ``LatentApplyOperationCFG``), as today's ComfyUI documents it: the
reference is cast to the latent's device and dtype, resized to its size with nearest-neighbour
interpolation, repeated to its batch, and ``strength`` lerps from the latent (0) to it (1).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from engine.context import NodeContext
from engine.node import Node
from engine.schema import FLOAT, LATENT, Input, NodeSchema, Output
from nodes.latent.operations import LATENT_OPERATION, LatentOperation
from nodes.latent.transforms import samples_of
from nodes.latent.vae import LatentError


def fit_reference(reference: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``reference`` on ``like``'s device and dtype, at its spatial size (nearest) and batch."""
    if reference.ndim != like.ndim or reference.shape[1] != like.shape[1]:
        raise LatentError(
            f"LatentOperationBlend: the reference latent has shape {tuple(reference.shape)}, the latent "
            f"{tuple(like.shape)}; expected the same number of channels (a latent of the same model "
            "family). Encode the reference with the same VAE."
        )
    ref = reference.to(device=like.device, dtype=like.dtype)
    if ref.shape[2:] != like.shape[2:]:
        ref = F.interpolate(ref, size=like.shape[2:], mode="nearest")
    if ref.shape[0] < like.shape[0]:
        ref = ref.repeat((-(-like.shape[0] // ref.shape[0]),) + (1,) * (ref.ndim - 1))
    return ref[: like.shape[0]]


class LatentOperationBlend(Node):
    SCHEMA = NodeSchema(
        node_id="LatentOperationBlend",
        display_name="Latent Operation Blend",
        category="latent/advanced/operations",
        description="An operation that blends a latent toward a reference latent (resized nearest, "
        "batch repeated); strength 0 leaves the latent unchanged.",
        inputs=(
            Input("reference", LATENT, "The latent to blend toward."),
            Input(
                "strength",
                FLOAT,
                "How far toward the reference: 0 the latent, 1 the reference.",
                default=1.0,
                min=0.0,
                max=1.0,
                step=0.0001,
            ),
        ),
        outputs=(Output("operation", LATENT_OPERATION, "The blend operation."),),
        experimental=True,
    )

    def run(self, ctx: NodeContext, *, reference: dict, strength: float) -> tuple[LatentOperation]:
        target = samples_of(reference, "reference")

        def blend(latent: torch.Tensor, **_: Any) -> torch.Tensor:
            return torch.lerp(latent, fit_reference(target, latent), strength)

        return (blend,)


NODES = (LatentOperationBlend,)
