"""ComfyUI's video CFG ramps (``comfy_extras/nodes_video_model.py``): ``VideoLinearCFGGuidance`` and
``VideoTriangleCFGGuidance``. The latent batch of an image-to-video model holds the frames, so the
CFG scale changes over the batch rows: linearly from ``min_cfg`` (first frame) to the sampler's cfg
(last frame), or as a triangle wave that is ``min_cfg`` at both ends and the sampler's cfg in the
middle.

Both are weight-neutral :class:`~nodes.patches.guidance.GuidancePatch` values acting through the
``cfg_function`` hook (``nodes.core.sampling_hooks``), which gets ComfyUI's arguments (``cond`` and
``uncond`` are the noise predictions ``x - denoised``) and returns the guided noise prediction.
Behaviour follows ComfyUI's source; the code is Loom's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from engine.context import NodeContext
from engine.node import Node
from engine.schema import FLOAT, MODEL, Input, NodeSchema, Output
from nodes.core.sampling_hooks import SamplingHooks
from nodes.patches.guidance import GuidancePatch

Args = dict[str, Any]


def linear_ramp(min_cfg: float, cfg: float, rows: int, device: Any = None) -> torch.Tensor:
    """One CFG scale per batch row: ``min_cfg`` at the first row rising linearly to ``cfg`` at the last."""
    return torch.linspace(min_cfg, cfg, rows, device=device)


def triangle_ramp(min_cfg: float, cfg: float, rows: int, device: Any = None) -> torch.Tensor:
    """One CFG scale per batch row: a triangle wave over the rows, ``min_cfg`` at both ends and
    ``cfg`` in the middle (ComfyUI's period-1 wave over ``linspace(0, 1, rows)``)."""
    t = torch.linspace(0.0, 1.0, rows, device=device)
    wave = 2.0 * (t - torch.floor(t + 0.5)).abs()
    return wave * (cfg - min_cfg) + min_cfg


def _ramped_cfg(
    ramp: Callable[[float, float, int, Any], torch.Tensor], min_cfg: float
) -> Callable[[Args], torch.Tensor]:
    def cfg(args: Args) -> torch.Tensor:
        cond, uncond = args["cond"], args["uncond"]
        rows = cond.shape[0]
        scale = ramp(min_cfg, float(args["cond_scale"]), rows, cond.device)
        scale = scale.to(cond.dtype).reshape((rows,) + (1,) * (cond.ndim - 1))
        return uncond + scale * (cond - uncond)

    return cfg


def video_linear_cfg(min_cfg: float) -> SamplingHooks:
    return SamplingHooks(cfg_function=_ramped_cfg(linear_ramp, min_cfg))


def video_triangle_cfg(min_cfg: float) -> SamplingHooks:
    return SamplingHooks(cfg_function=_ramped_cfg(triangle_ramp, min_cfg))


def _schema(node_id: str, description: str) -> NodeSchema:
    return NodeSchema(
        node_id=node_id,
        display_name=node_id,
        category="sampling/video_models",
        description=description,
        inputs=(
            Input("model", MODEL, "The video model to patch."),
            Input(
                "min_cfg",
                FLOAT,
                "The lowest CFG scale of the ramp (the sampler's cfg is the highest).",
                default=1.0,
                min=0.0,
                max=100.0,
                step=0.5,
                round=0.01,
            ),
        ),
        outputs=(Output("MODEL", MODEL, "The model with the CFG ramp over the frames."),),
    )


class VideoLinearCFGGuidance(Node):
    SCHEMA = _schema(
        "VideoLinearCFGGuidance",
        "Ramp the CFG scale linearly over the frames (batch rows): min_cfg on the first, the sampler's cfg "
        "on the last.",
    )

    def run(self, ctx: NodeContext, *, model: Any, min_cfg: float) -> tuple[Any]:
        return (model.with_patch(GuidancePatch("VideoLinearCFGGuidance", (min_cfg,), video_linear_cfg)),)


class VideoTriangleCFGGuidance(Node):
    SCHEMA = _schema(
        "VideoTriangleCFGGuidance",
        "Ramp the CFG scale over the frames (batch rows) as a triangle: min_cfg at the first and last, the "
        "sampler's cfg in the middle.",
    )

    def run(self, ctx: NodeContext, *, model: Any, min_cfg: float) -> tuple[Any]:
        return (model.with_patch(GuidancePatch("VideoTriangleCFGGuidance", (min_cfg,), video_triangle_cfg)),)


NODES = (VideoLinearCFGGuidance, VideoTriangleCFGGuidance)
