"""ComfyUI's model-sampling nodes: how a MODEL maps noise levels to its inputs and outputs.

``ModelSamplingDiscrete`` / ``ModelSamplingContinuousEDM`` / ``ModelSamplingContinuousV`` /
``ModelSamplingStableCascade`` return
``model.with_model_sampling(ms)`` with a ModelSampling of ``nodes.diffusion.model_sampling``
(same names, inputs and semantics as ComfyUI's ``comfy_extras/nodes_model_advanced.py``);
``ModelComputeDtype`` runs the denoiser in another precision (a patch casting the built module).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from engine.context import NodeContext
from engine.node import Node
from engine.schema import BOOLEAN, COMBO, FLOAT, MODEL, Input, NodeSchema, Output
from nodes.diffusion.model_sampling import (
    DiscreteSchedule,
    DistilledSchedule,
    continuous_edm,
    continuous_v,
    discrete,
    stable_cascade,
)

_OUT = (Output("MODEL", MODEL, "The model with the new sampling."),)


class ModelSamplingError(ValueError):
    """A sampling choice this model cannot use; the message says what to pick instead."""


def _discrete_base(model: Any) -> dict[str, Any]:
    """The beta schedule of the model's current discrete sampling (ComfyUI reads the model config)."""
    schedule = model.model_sampling.schedule
    if isinstance(schedule, DistilledSchedule):
        schedule = schedule.base
    if not isinstance(schedule, DiscreteSchedule):
        return {}
    return {
        "beta_schedule": schedule.beta_schedule,
        "linear_start": schedule.linear_start,
        "linear_end": schedule.linear_end,
        "timesteps": schedule.timesteps,
    }


class ModelSamplingDiscrete(Node):
    SCHEMA = NodeSchema(
        node_id="ModelSamplingDiscrete",
        display_name="ModelSamplingDiscrete",
        category="advanced/model",
        description="Sample a discrete-time model as eps, v-prediction, LCM, x0 or img-to-img, optionally with "
        "zero terminal SNR.",
        inputs=(
            Input("model", MODEL, "The model."),
            Input(
                "sampling",
                COMBO,
                "What the model predicts.",
                options=("eps", "v_prediction", "lcm", "x0", "img_to_img"),
            ),
            Input("zsnr", BOOLEAN, "Rescale the schedule to zero terminal SNR.", default=False),
        ),
        outputs=_OUT,
    )

    def run(self, ctx: NodeContext, *, model: Any, sampling: str, zsnr: bool) -> tuple[Any]:
        return (model.with_model_sampling(discrete(sampling, zsnr=zsnr, **_discrete_base(model))),)


class ModelSamplingContinuousEDM(Node):
    SCHEMA = NodeSchema(
        node_id="ModelSamplingContinuousEDM",
        display_name="ModelSamplingContinuousEDM",
        category="advanced/model",
        description="Sample with a continuous EDM noise range (Karras et al. 2022).",
        inputs=(
            Input("model", MODEL, "The model."),
            Input(
                "sampling",
                COMBO,
                "What the model predicts.",
                options=("v_prediction", "edm", "edm_playground_v2.5", "eps", "cosmos_rflow"),
            ),
            Input("sigma_max", FLOAT, "Highest noise level.", default=120.0, min=0.0, max=1000.0, step=0.001),
            Input("sigma_min", FLOAT, "Lowest noise level.", default=0.002, min=0.0, max=1000.0, step=0.001),
        ),
        outputs=_OUT,
    )

    def run(
        self, ctx: NodeContext, *, model: Any, sampling: str, sigma_max: float, sigma_min: float
    ) -> tuple[Any]:
        if sampling in ("edm_playground_v2.5", "cosmos_rflow"):
            raise ModelSamplingError(
                f"ModelSamplingContinuousEDM: sampling {sampling!r} needs a model family Loom does not load yet "
                "(Playground v2.5's latent format / Cosmos); use v_prediction, edm or eps"
            )
        sigma_data = 0.5 if sampling == "edm" else 1.0
        ms = continuous_edm(sampling, sigma_min=sigma_min, sigma_max=sigma_max, sigma_data=sigma_data)
        return (model.with_model_sampling(ms),)


class ModelSamplingContinuousV(Node):
    SCHEMA = NodeSchema(
        node_id="ModelSamplingContinuousV",
        display_name="ModelSamplingContinuousV",
        category="advanced/model",
        description="Sample a v-prediction model over a continuous noise range.",
        inputs=(
            Input("model", MODEL, "The model."),
            Input("sampling", COMBO, "What the model predicts.", options=("v_prediction",)),
            Input("sigma_max", FLOAT, "Highest noise level.", default=500.0, min=0.0, max=1000.0, step=0.001),
            Input("sigma_min", FLOAT, "Lowest noise level.", default=0.03, min=0.0, max=1000.0, step=0.001),
        ),
        outputs=_OUT,
    )

    def run(
        self, ctx: NodeContext, *, model: Any, sampling: str, sigma_max: float, sigma_min: float
    ) -> tuple[Any]:
        return (model.with_model_sampling(continuous_v(sampling, sigma_min=sigma_min, sigma_max=sigma_max)),)


class ModelSamplingStableCascade(Node):
    SCHEMA = NodeSchema(
        node_id="ModelSamplingStableCascade",
        display_name="ModelSamplingStableCascade",
        category="advanced/model",
        description="Sample with Stable Cascade's cosine noise schedule (eps prediction), its signal-to-noise "
        "ratio shifted: higher shift spends more steps at high noise.",
        inputs=(
            Input("model", MODEL, "The model."),
            Input(
                "shift", FLOAT, "The schedule's shift (1 = none).", default=2.0, min=0.0, max=100.0, step=0.01
            ),
        ),
        outputs=_OUT,
    )

    def run(self, ctx: NodeContext, *, model: Any, shift: float) -> tuple[Any]:
        return (model.with_model_sampling(stable_cascade(shift=shift)),)


_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class ComputeDtypePatch:
    """Cast the built denoiser to ``dtype`` (its inputs follow the module's dtype)."""

    dtype: str

    @property
    def key(self) -> str:
        return f"compute_dtype:{self.dtype}"

    def apply(self, module: Any, handle: Any) -> None:
        module.to(_DTYPES[self.dtype])


class ModelComputeDtype(Node):
    SCHEMA = NodeSchema(
        node_id="ModelComputeDtype",
        display_name="ModelComputeDtype",
        category="advanced/debug/model",
        description="Run the denoiser in another precision.",
        inputs=(
            Input("model", MODEL, "The model."),
            Input(
                "dtype",
                COMBO,
                "Compute precision (default: Loom's choice).",
                options=("default", "fp32", "fp16", "bf16"),
            ),
        ),
        outputs=(Output("MODEL", MODEL, "The model."),),
    )

    def run(self, ctx: NodeContext, *, model: Any, dtype: str) -> tuple[Any]:
        return (model if dtype == "default" else model.with_patch(ComputeDtypePatch(dtype)),)


NODES: list[type[Node]] = [
    ModelSamplingDiscrete,
    ModelSamplingContinuousEDM,
    ModelSamplingContinuousV,
    ModelSamplingStableCascade,
    ModelComputeDtype,
]
