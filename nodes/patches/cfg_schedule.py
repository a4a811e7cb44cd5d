"""CFG-scale and CFG-formula patches of today's ComfyUI: ``CFGOverride`` (a fixed CFG scale over a
range of sampling progress) and ``RenormCFG`` (Lumina 2's truncated, renormalised CFG).

Both are weight-neutral :class:`~nodes.patches.guidance.GuidancePatch` values: ``CFGOverride``
acts through the ``cfg_scale`` hook (``nodes.core.sampling_hooks``), ``RenormCFG`` through the
``cfg_function`` hook. Behaviour follows ComfyUI's node documentation and ``comfy_extras``
(``nodes_lumina2.RenormCFG``); the code is Loom's.
"""

from __future__ import annotations

from typing import Any

import torch

from engine.context import NodeContext
from engine.node import Node
from engine.schema import FLOAT, MODEL, Input, NodeSchema, Output
from nodes.core.sampling_hooks import RunInfo, SamplingHooks
from nodes.patches.guidance import GuidancePatch

Args = dict[str, Any]


class CFGRangeError(ValueError):
    """A CFG override whose range is empty or reversed."""


def cfg_override(cfg: float, start_percent: float, end_percent: float) -> SamplingHooks:
    """``cfg`` replaces the guider's scale on the steps whose sigma lies between the sigmas at
    ``start_percent`` and ``end_percent`` of sampling (ComfyUI's percent rule, inclusive)."""
    bounds: dict[str, float] = {"high": float("inf"), "low": 0.0}  # per run: hooks are made per run

    def start(info: RunInfo) -> None:
        if info.percent_to_sigma is not None:
            bounds["high"] = float(info.percent_to_sigma(start_percent))
            bounds["low"] = float(info.percent_to_sigma(end_percent))

    def scale(current: float, sigma: torch.Tensor) -> float:
        level = float(sigma.reshape(-1)[0])
        return cfg if bounds["low"] <= level <= bounds["high"] else current

    return SamplingHooks(run_start=(start,), cfg_scale=(scale,))


def make_renorm_cfg(cfg_trunc: float, renorm: float) -> SamplingHooks:
    """Below ``cfg_trunc`` (compared with the step's sigma, ComfyUI's ``timestep`` argument) plain
    CFG, its per-row norm capped at ``renorm`` times the positive prediction's (0: no cap); at or
    above it the positive prediction alone."""

    def cfg(args: Args) -> torch.Tensor:
        cond, uncond, x = args["cond_denoised"], args["uncond_denoised"], args["input"]
        if float(args["timestep"].reshape(-1)[0]) >= cfg_trunc:
            return x - cond
        guided = uncond + args["cond_scale"] * (cond - uncond)
        if renorm > 0.0:
            dims = tuple(range(1, cond.ndim))
            ceiling = torch.linalg.vector_norm(cond, dim=dims, keepdim=True) * renorm
            norm = torch.linalg.vector_norm(guided, dim=dims, keepdim=True)
            guided = torch.where(norm >= ceiling, guided * (ceiling / norm), guided)  # (B, 1, 1, 1) per row
        return x - guided

    return SamplingHooks(cfg_function=cfg)


class CFGOverride(Node):
    SCHEMA = NodeSchema(
        node_id="CFGOverride",
        display_name="CFG Override",
        category="advanced/guidance",
        description="Use a fixed CFG scale over a range of the sampling progress; where several overlap, "
        "the one nearest the sampler wins.",
        inputs=(
            Input("model", MODEL, "The model to apply the CFG override to."),
            Input("cfg", FLOAT, "The CFG scale inside the range.", default=1.0, min=0.0, max=100.0, step=0.1),
            Input(
                "start_percent",
                FLOAT,
                "Where the range starts (0 = the first step).",
                default=0.0,
                min=0.0,
                max=1.0,
                step=0.001,
            ),
            Input(
                "end_percent",
                FLOAT,
                "Where the range ends (1 = the last step).",
                default=1.0,
                min=0.0,
                max=1.0,
                step=0.001,
            ),
        ),
        outputs=(Output("MODEL", MODEL, "The model with the CFG override."),),
    )

    def run(
        self, ctx: NodeContext, *, model: Any, cfg: float, start_percent: float, end_percent: float
    ) -> tuple[Any]:
        if start_percent > end_percent:
            raise CFGRangeError(
                f"CFGOverride: start_percent ({start_percent}) is after end_percent ({end_percent}); "
                "expected start_percent <= end_percent (0 = first step, 1 = last step). Swap the two values."
            )
        params = (cfg, start_percent, end_percent)
        return (model.with_patch(GuidancePatch("CFGOverride", params, cfg_override)),)


class RenormCFG(Node):
    SCHEMA = NodeSchema(
        node_id="RenormCFG",
        display_name="RenormCFG",
        category="advanced/model",
        description="CFG below a noise-level threshold, its norm capped relative to the positive "
        "prediction's; above the threshold the positive prediction alone.",
        inputs=(
            Input("model", MODEL, "The model to patch."),
            Input(
                "cfg_trunc",
                FLOAT,
                "CFG applies only on steps whose noise level is below this.",
                default=100.0,
                min=0.0,
                max=100.0,
                step=0.01,
                extra={"advanced": True},
            ),
            Input(
                "renorm_cfg",
                FLOAT,
                "Cap on the guided norm, as a multiple of the positive prediction's (0 = no cap).",
                default=1.0,
                min=0.0,
                max=100.0,
                step=0.01,
                extra={"advanced": True},
            ),
        ),
        outputs=(Output("MODEL", MODEL, "The patched model."),),
    )

    def run(self, ctx: NodeContext, *, model: Any, cfg_trunc: float, renorm_cfg: float) -> tuple[Any]:
        patch = GuidancePatch("RenormCFG", (cfg_trunc, renorm_cfg), make_renorm_cfg)
        return (model.with_patch(patch),)


NODES = (CFGOverride, RenormCFG)
