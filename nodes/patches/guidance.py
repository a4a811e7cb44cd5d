"""Guidance patches: ComfyUI's MODEL nodes that change how CFG combines predictions.

Each node returns ``model.with_patch(patch)``; the patch changes no weights (``apply`` does
nothing) and acts only through ``sampling_hooks`` (``nodes.core.sampling_hooks``), at ComfyUI's points: the
``cfg_function`` replaces the formula, ``pre_cfg`` sees the branch predictions, ``post_cfg`` the
result. Patches are frozen dataclasses whose ``key`` names their parameters, so a patched handle is
a cache-safe value. The hooks themselves (the formulas, with their sources) are in
:mod:`nodes.patches.guidance_hooks`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from engine.context import NodeContext
from engine.node import Node
from engine.schema import CONDITIONING, FLOAT, INT, MODEL, Input, NodeSchema, Output
from nodes.core.sampling_hooks import SamplingHooks
from nodes.patches.guidance_hooks import (
    apg,
    cfg_norm,
    cfg_zero_star,
    differential_diffusion,
    epsilon_scaling,
    fresca,
    latent_operation_cfg,
    mahiro,
    perp_neg_patch,
    rescale_cfg,
    tcfg,
    temporal_score_rescaling,
)

LATENT_OPERATION = "LATENT_OPERATION"  # the socket type of ComfyUI's LatentOperation* nodes


@dataclass(frozen=True)
class GuidancePatch:
    """A weight-neutral patch whose hooks come from :meth:`hooks` (one set per sampling run)."""

    name: str
    params: tuple[Any, ...]
    make: Callable[..., SamplingHooks]
    changes_module: ClassVar[bool] = False  # hooks only: the loaded UNet is reused as it is

    @property
    def key(self) -> str:
        return f"{self.name}:{[_ident(p) for p in self.params]!r}"

    def apply(self, module: Any, handle: Any) -> None:
        """Weights stay as they are."""

    def sampling_hooks(self, module: Any) -> SamplingHooks:
        return self.make(*self.params)


def _ident(value: Any) -> Any:
    """A parameter as it enters the key (conditioning by a digest of its tensors)."""
    if isinstance(value, tuple):
        return [_ident(v) for v in value]
    if hasattr(value, "embeds"):
        digest = hashlib.sha256(value.embeds.detach().float().cpu().numpy().tobytes())
        if value.pooled is not None:
            digest.update(value.pooled.detach().float().cpu().numpy().tobytes())
        return f"cond:{digest.hexdigest()[:16]}:{value.area}:{value.strength}"
    if callable(value) and not isinstance(value, type):
        return f"fn:{id(value)}"  # an operation value: identity (the node output cache keeps it)
    return value


def _model_in() -> Input:
    return Input("model", MODEL, "The model to patch.")


def _patched(doc: str = "The patched model.") -> tuple[Output, ...]:
    return (Output("MODEL", MODEL, doc),)


def _patch(model: Any, name: str, make: Callable[..., SamplingHooks], *params: Any) -> tuple[Any]:
    return (model.with_patch(GuidancePatch(name, tuple(params), make)),)


class RescaleCFG(Node):
    SCHEMA = NodeSchema(
        node_id="RescaleCFG",
        display_name="RescaleCFG",
        category="advanced/model",
        description="Rescale the guided prediction's spread toward the positive one's (for v-prediction models).",
        inputs=(
            _model_in(),
            Input(
                "multiplier",
                FLOAT,
                "How much of the rescaled result to use.",
                default=0.7,
                min=0.0,
                max=1.0,
                step=0.01,
            ),
        ),
        outputs=_patched(),
    )

    def run(self, ctx: NodeContext, *, model: Any, multiplier: float) -> tuple[Any]:
        return _patch(model, "RescaleCFG", rescale_cfg, multiplier)


class CFGZeroStar(Node):
    SCHEMA = NodeSchema(
        node_id="CFGZeroStar",
        display_name="CFGZeroStar",
        category="advanced/guidance",
        description="CFG-Zero*: scale the negative by its optimal projection on the positive.",
        inputs=(_model_in(),),
        outputs=(Output("patched_model", MODEL, "The patched model."),),
    )

    def run(self, ctx: NodeContext, *, model: Any) -> tuple[Any]:
        return _patch(model, "CFGZeroStar", cfg_zero_star)


class CFGNorm(Node):
    SCHEMA = NodeSchema(
        node_id="CFGNorm",
        display_name="CFGNorm",
        category="advanced/guidance",
        description="Limit the guided prediction's channel norm to the positive one's.",
        inputs=(
            _model_in(),
            Input("strength", FLOAT, "Output scale.", default=1.0, min=0.0, max=100.0, step=0.01),
        ),
        outputs=(Output("patched_model", MODEL, "The patched model."),),
        experimental=True,
    )

    def run(self, ctx: NodeContext, *, model: Any, strength: float) -> tuple[Any]:
        return _patch(model, "CFGNorm", cfg_norm, strength)


class APG(Node):
    SCHEMA = NodeSchema(
        node_id="APG",
        display_name="Adaptive Projected Guidance",
        category="sampling/custom_sampling",
        description="Adaptive projected guidance: damp the guidance parallel to the positive prediction.",
        inputs=(
            _model_in(),
            Input(
                "eta",
                FLOAT,
                "Scale of the parallel guidance (1: plain CFG).",
                default=1.0,
                min=-10.0,
                max=10.0,
                step=0.01,
            ),
            Input(
                "norm_threshold",
                FLOAT,
                "Clip the guidance norm to this (0: off).",
                default=5.0,
                min=0.0,
                max=50.0,
                step=0.1,
            ),
            Input(
                "momentum",
                FLOAT,
                "Running average of the guidance (0: off; negative pushes away from earlier steps).",
                default=0.0,
                min=-5.0,
                max=1.0,
                step=0.01,
            ),
        ),
        outputs=_patched(),
    )

    def run(
        self, ctx: NodeContext, *, model: Any, eta: float, norm_threshold: float, momentum: float
    ) -> tuple[Any]:
        return _patch(model, "APG", apg, eta, norm_threshold, momentum)


class TCFG(Node):
    SCHEMA = NodeSchema(
        node_id="TCFG",
        display_name="Tangential Damping CFG",
        category="advanced/guidance",
        description="TCFG: align the negative with the positive by dropping its tangential component.",
        inputs=(_model_in(),),
        outputs=(Output("patched_model", MODEL, "The patched model."),),
    )

    def run(self, ctx: NodeContext, *, model: Any) -> tuple[Any]:
        return _patch(model, "TCFG", tcfg)


class PerpNeg(Node):
    SCHEMA = NodeSchema(
        node_id="PerpNeg",
        display_name="Perp-Neg (DEPRECATED by PerpNegGuider)",
        category="_for_testing",
        description="Perp-Neg as a model patch (one extra model call per step for the empty prompt).",
        inputs=(
            _model_in(),
            Input("empty_conditioning", CONDITIONING, "The empty prompt's conditioning."),
            Input(
                "neg_scale",
                FLOAT,
                "Weight of the perpendicular negative.",
                default=1.0,
                min=0.0,
                max=100.0,
                step=0.01,
            ),
        ),
        outputs=_patched(),
        experimental=True,
        deprecated=True,
    )

    def run(self, ctx: NodeContext, *, model: Any, empty_conditioning: list, neg_scale: float) -> tuple[Any]:
        return _patch(model, "PerpNeg", perp_neg_patch, tuple(empty_conditioning), neg_scale)


class Mahiro(Node):
    SCHEMA = NodeSchema(
        node_id="Mahiro",
        display_name="Mahiro CFG",
        category="_for_testing",
        description="Scale guidance along the positive prompt's direction rather than its difference to the "
        "negative.",
        inputs=(_model_in(),),
        outputs=(Output("patched_model", MODEL, "The patched model."),),
        experimental=True,
    )

    def run(self, ctx: NodeContext, *, model: Any) -> tuple[Any]:
        return _patch(model, "Mahiro", mahiro)


class FreSca(Node):
    SCHEMA = NodeSchema(
        node_id="FreSca",
        display_name="FreSca",
        category="_for_testing",
        description="Frequency-dependent scaling of the guidance.",
        inputs=(
            _model_in(),
            Input("scale_low", FLOAT, "Scale of low frequencies.", default=1.0, min=0.0, max=10.0, step=0.01),
            Input(
                "scale_high", FLOAT, "Scale of high frequencies.", default=1.25, min=0.0, max=10.0, step=0.01
            ),
            Input("freq_cutoff", INT, "Half-size of the low-frequency square.", default=20, min=1, max=10000),
        ),
        outputs=_patched(),
        experimental=True,
    )

    def run(
        self, ctx: NodeContext, *, model: Any, scale_low: float, scale_high: float, freq_cutoff: int
    ) -> tuple[Any]:
        return _patch(model, "FreSca", fresca, scale_low, scale_high, freq_cutoff)


class EpsilonScaling(Node):
    SCHEMA = NodeSchema(
        node_id="Epsilon Scaling",
        display_name="Epsilon Scaling",
        category="model/patch/unet",
        description="Divide the predicted noise by a factor (exposure-bias correction).",
        inputs=(
            _model_in(),
            Input("scaling_factor", FLOAT, "The divisor.", default=1.005, min=0.5, max=1.5, step=0.001),
        ),
        outputs=_patched(),
    )

    def run(self, ctx: NodeContext, *, model: Any, scaling_factor: float) -> tuple[Any]:
        return _patch(model, "EpsilonScaling", epsilon_scaling, scaling_factor)


class TemporalScoreRescaling(Node):
    SCHEMA = NodeSchema(
        node_id="TemporalScoreRescaling",
        display_name="TSR - Temporal Score Rescaling",
        category="model/patch/unet",
        description="Rescale the model's score over time to steer sampling diversity.",
        inputs=(
            _model_in(),
            Input(
                "tsr_k",
                FLOAT,
                "Rescaling strength (1: off; lower: more detail).",
                default=0.95,
                min=0.01,
                max=100.0,
                step=0.001,
            ),
            Input(
                "tsr_sigma",
                FLOAT,
                "How early rescaling takes effect.",
                default=1.0,
                min=0.01,
                max=100.0,
                step=0.001,
            ),
        ),
        outputs=(Output("patched_model", MODEL, "The patched model."),),
    )

    def run(self, ctx: NodeContext, *, model: Any, tsr_k: float, tsr_sigma: float) -> tuple[Any]:
        return _patch(model, "TemporalScoreRescaling", temporal_score_rescaling, tsr_k, tsr_sigma)


class DifferentialDiffusion(Node):
    SCHEMA = NodeSchema(
        node_id="DifferentialDiffusion",
        display_name="Differential Diffusion",
        category="_for_testing",
        description="Inpaint with a soft mask: each region joins once sampling passes its mask value.",
        inputs=(
            _model_in(),
            Input(
                "strength",
                FLOAT,
                "Blend of the thresholded and the soft mask (1: thresholded).",
                default=1.0,
                min=0.0,
                max=1.0,
                step=0.01,
                optional=True,
            ),
        ),
        outputs=_patched(),
        experimental=True,
    )

    def run(self, ctx: NodeContext, *, model: Any, strength: float = 1.0) -> tuple[Any]:
        return _patch(model, "DifferentialDiffusion", differential_diffusion, strength)


class LatentApplyOperationCFG(Node):
    SCHEMA = NodeSchema(
        node_id="LatentApplyOperationCFG",
        display_name="LatentApplyOperationCFG",
        category="latent/advanced/operations",
        description="Apply a latent operation to the guidance (positive minus negative prediction) every step.",
        inputs=(_model_in(), Input("operation", LATENT_OPERATION, "A LatentOperation* node's operation.")),
        outputs=_patched(),
        experimental=True,
    )

    def run(self, ctx: NodeContext, *, model: Any, operation: Callable[..., torch.Tensor]) -> tuple[Any]:
        if not callable(operation):
            raise ValueError("LatentApplyOperationCFG: operation must come from a LatentOperation* node")
        return _patch(model, "LatentApplyOperationCFG", latent_operation_cfg, operation)


NODES: list[type[Node]] = [
    RescaleCFG,
    CFGZeroStar,
    CFGNorm,
    APG,
    TCFG,
    PerpNeg,
    Mahiro,
    FreSca,
    EpsilonScaling,
    TemporalScoreRescaling,
    DifferentialDiffusion,
    LatentApplyOperationCFG,
]
