"""ComfyUI's Flux.2 nodes (``comfy_extras/nodes_flux.py``; same names, inputs and semantics):
``EmptyFlux2LatentImage`` (zero 128-channel latents at 1/16 of the image) and ``Flux2Scheduler``
(sigmas 1 → 0 on Flux.2's size- and step-dependent time shift)."""

from __future__ import annotations

import math
from typing import Any

import torch

from engine.context import NodeContext
from engine.node import Node, OutputSizes
from engine.schema import INT, LATENT, SIGMAS, Input, NodeSchema, Output
from nodes.core.tensor_sizes import latent_size
from nodes.latent.vae import MAX_RESOLUTION

CHANNELS = 128


def empirical_mu(tokens: int, steps: int) -> float:
    """Flux.2's shift for ``tokens`` image tokens and ``steps`` steps: linear in the token count, and
    below 4300 tokens interpolated in the step count between the fits for 10 and 200 steps."""
    a1, b1 = 8.73809524e-05, 1.89833333
    a2, b2 = 0.00016927, 0.45666666
    if tokens > 4300:
        return float(a2 * tokens + b2)
    at_200, at_10 = a2 * tokens + b2, a1 * tokens + b1
    slope = (at_200 - at_10) / 190.0
    return float(slope * steps + at_200 - 200.0 * slope)


def flux2_sigmas(steps: int, width: int, height: int) -> torch.Tensor:
    """``steps + 1`` sigmas: t = 1 … 0 evenly, shifted by e^mu / (e^mu + 1/t − 1) (t = 0 gives 0)."""
    mu = empirical_mu(round(width * height / 256), steps)
    t = torch.linspace(1, 0, steps + 1)
    return math.exp(mu) / (math.exp(mu) + (1 / t - 1))


class EmptyFlux2LatentImage(Node):
    SCHEMA = NodeSchema(
        node_id="EmptyFlux2LatentImage",
        display_name="Empty Flux 2 Latent",
        category="latent",
        description="A batch of empty (zero) Flux.2 latents: 128 channels at 1/16 of the image size.",
        inputs=(
            Input(
                "width",
                INT,
                "Image width in pixels (multiple of 16).",
                default=1024,
                min=16,
                max=MAX_RESOLUTION,
                step=16,
            ),
            Input(
                "height",
                INT,
                "Image height in pixels (multiple of 16).",
                default=1024,
                min=16,
                max=MAX_RESOLUTION,
                step=16,
            ),
            Input("batch_size", INT, "Number of images.", default=1, min=1, max=4096),
        ),
        outputs=(Output("LATENT", LATENT, "Zero latents [batch, 128, height/16, width/16]."),),
    )

    def run(self, ctx: NodeContext, *, width: int, height: int, batch_size: int = 1) -> tuple[dict[str, Any]]:
        return ({"samples": torch.zeros(batch_size, CHANNELS, height // 16, width // 16)},)

    @classmethod
    def estimate_outputs(
        cls, *, width: Any = None, height: Any = None, batch_size: Any = 1, **_: Any
    ) -> OutputSizes:
        return (latent_size(batch_size, CHANNELS, height, width, factor=16),)


class Flux2Scheduler(Node):
    SCHEMA = NodeSchema(
        node_id="Flux2Scheduler",
        display_name="Flux2Scheduler",
        category="sampling/custom_sampling/schedulers",
        description="Flux.2's sigmas for an image size and step count (the shift grows with the image).",
        inputs=(
            Input("steps", INT, "Number of sampling steps.", default=20, min=1, max=4096),
            Input("width", INT, "Image width in pixels.", default=1024, min=16, max=MAX_RESOLUTION, step=1),
            Input("height", INT, "Image height in pixels.", default=1024, min=16, max=MAX_RESOLUTION, step=1),
        ),
        outputs=(Output("SIGMAS", SIGMAS, "steps + 1 noise levels from 1 down to 0."),),
    )

    def run(self, ctx: NodeContext, *, steps: int, width: int, height: int) -> tuple[torch.Tensor]:
        return (flux2_sigmas(steps, width, height),)


NODES: list[type[Node]] = [EmptyFlux2LatentImage, Flux2Scheduler]
