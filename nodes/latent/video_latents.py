"""Video latents that need no model: TrimVideoLatent, ReplaceVideoLatentFrames (ComfyUI's names,
inputs and semantics: ``comfy_extras/nodes_wan.py``, ``nodes_latent.py``). The empty video latent
(EmptyHunyuanLatentVideo) is a family node: ``nodes/family_nodes/video_nodes.py``.

A video LATENT's ``samples`` are [B, C, t, h, w]: ``t`` latent frames, each standing for 4 video
frames after the first (Hunyuan's and Wan's causal VAEs), ``h``, ``w`` the image over 8.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from engine.context import NodeContext
from engine.node import Node
from engine.schema import INT, LATENT, Input, NodeSchema, Output
from nodes.latent.transforms import samples_of, with_samples
from nodes.latent.vae import MAX_RESOLUTION, LatentError

_OUT = (Output("LATENT", LATENT, "The resulting latent."),)

log = logging.getLogger(__name__)


def video_samples(latent: Any, input_name: str) -> torch.Tensor:
    """The [B, C, t, h, w] samples of a video LATENT, or an error saying what came instead."""
    samples = samples_of(latent, input_name)
    if samples.ndim != 5:
        raise LatentError(
            f"{input_name}: expected a video latent [B, C, frames, H, W]; got shape {list(samples.shape)}. "
            "Make one with an empty video latent node or a video VAE's encode"
        )
    return samples


class TrimVideoLatent(Node):
    SCHEMA = NodeSchema(
        node_id="TrimVideoLatent",
        display_name="TrimVideoLatent",
        category="latent/video",
        description="Drop the first trim_amount latent frames.",
        inputs=(
            Input("samples", LATENT, "A video latent."),
            Input("trim_amount", INT, "Latent frames to drop from the start.", default=0, min=0, max=99999),
        ),
        outputs=_OUT,
    )

    def run(self, ctx: NodeContext, *, samples: dict, trim_amount: int) -> tuple[dict]:
        return (with_samples(samples, video_samples(samples, "samples")[:, :, trim_amount:]),)


class ReplaceVideoLatentFrames(Node):
    SCHEMA = NodeSchema(
        node_id="ReplaceVideoLatentFrames",
        display_name="ReplaceVideoLatentFrames",
        category="latent/batch",
        description="Replace a sequence of frames in a destination latent with frames from a source latent.",
        inputs=(
            Input("destination", LATENT, "The destination latent where frames will be replaced."),
            Input(
                "source",
                LATENT,
                "The source latent providing frames to insert into the destination latent. If not provided, "
                "the destination latent is returned unchanged.",
                optional=True,
            ),
            Input(
                "index",
                INT,
                "The starting latent frame index in the destination latent where the source latent frames "
                "will be placed. Negative values count from the end.",
                default=0,
                min=-MAX_RESOLUTION,
                max=MAX_RESOLUTION,
                step=1,
            ),
        ),
        outputs=(Output("LATENT", LATENT, "Destination latent with replaced frames."),),
    )

    def run(
        self, ctx: NodeContext, *, destination: dict, index: int, source: dict | None = None
    ) -> tuple[dict]:
        if source is None:
            return (destination,)
        dest = video_samples(destination, "destination")
        src = video_samples(source, "source")
        start = index + dest.shape[2] if index < 0 else index
        if start < 0 or start + src.shape[2] > dest.shape[2]:  # ComfyUI warns and keeps the destination
            log.warning(
                "ReplaceVideoLatentFrames: %d source frames do not fit the destination's %d from index %d; "
                "the destination is returned unchanged",
                src.shape[2],
                dest.shape[2],
                index,
            )
            return (destination,)
        if src.shape[:2] != dest.shape[:2] or src.shape[3:] != dest.shape[3:]:
            raise LatentError(
                f"source has shape {list(src.shape)} and destination {list(dest.shape)}: batch, channels "
                "and size must agree; only the frame count may differ"
            )
        out = dest.clone()
        out[:, :, start : start + src.shape[2]] = src.to(dest.dtype)
        return (with_samples(destination, out),)


NODES: list[type[Node]] = [TrimVideoLatent, ReplaceVideoLatentFrames]
