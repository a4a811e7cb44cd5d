"""Video latents that need no model: TrimVideoLatent, ReplaceVideoLatentFrames, NormalizeVideoLatentStart
(ComfyUI's names, inputs and semantics: ``comfy_extras/nodes_wan.py``, ``nodes_latent.py``,
``nodes_kandinsky5.py``). The empty video latent
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


def match_mean_std(
    source: torch.Tensor,
    reference: torch.Tensor,
    mean_below: float = 0.3,
    mean_above: float = 0.35,
    std_below: float = 0.35,
    std_above: float = 0.5,
) -> torch.Tensor:
    """Each frame of ``source`` [B, C, t, h, w] (its mean and std over channels and pixels) moved to
    the mean and std of all of ``reference``, those targets clamped to a window around the frame's
    own statistics (ComfyUI's ``adaptive_mean_std_normalization``: mean within -0.3/+0.35, std within
    -0.35/+0.5; std with Bessel's correction)."""
    mean = source.mean(dim=(1, 3, 4), keepdim=True)
    std = source.std(dim=(1, 3, 4), keepdim=True)
    target_mean = torch.clamp(reference.mean(), mean - mean_below, mean + mean_above)
    target_std = torch.clamp(reference.std(), std - std_below, std + std_above)
    return (source - mean) / (std + 1e-8) * target_std + target_mean


class NormalizeVideoLatentStart(Node):
    SCHEMA = NodeSchema(
        node_id="NormalizeVideoLatentStart",
        display_name="NormalizeVideoLatentStart",
        category="conditioning/video_models",
        description="Normalizes the initial frames of a video latent to match the mean and standard deviation "
        "of subsequent reference frames. Helps reduce differences between the starting frames and the rest of "
        "the video.",
        inputs=(
            Input("latent", LATENT, "A video latent."),
            Input(
                "start_frame_count",
                INT,
                "Number of latent frames to normalize, counted from the start",
                default=4,
                min=1,
                max=MAX_RESOLUTION,
                step=1,
            ),
            Input(
                "reference_frame_count",
                INT,
                "Number of latent frames after the start frames to use as reference",
                default=5,
                min=1,
                max=MAX_RESOLUTION,
                step=1,
            ),
        ),
        outputs=(Output("latent", LATENT, "The latent with its first frames normalized."),),
    )

    def run(
        self, ctx: NodeContext, *, latent: dict, start_frame_count: int, reference_frame_count: int
    ) -> tuple[dict]:
        samples = video_samples(latent, "latent")
        frames = samples.shape[2]
        if frames <= 1:
            return (latent,)
        if start_frame_count >= frames:
            raise LatentError(
                f"start_frame_count is {start_frame_count} but the latent has only {frames} frames, so no frame "
                f"is left to serve as reference; set start_frame_count below {frames}"
            )
        reference = samples[
            :, :, start_frame_count : start_frame_count + min(reference_frame_count, frames - 1)
        ]
        out = samples.clone()
        out[:, :, :start_frame_count] = match_mean_std(samples[:, :, :start_frame_count], reference)
        return (with_samples(latent, out),)


NODES: list[type[Node]] = [TrimVideoLatent, ReplaceVideoLatentFrames, NormalizeVideoLatentStart]
