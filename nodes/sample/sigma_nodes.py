"""SIGMAS nodes: ComfyUI's schedulers as nodes and the operations on a sigma schedule.

A SIGMAS value is a 1-D float32 CPU tensor of noise levels, highest first, usually ending at 0;
nodes never change a tensor they received (outputs are new tensors), so values are cache-safe.
Same names, inputs and semantics as ComfyUI's ``comfy_extras/nodes_custom_sampler.py``,
``nodes_align_your_steps.py``, ``nodes_gits.py`` and ``nodes_optimalsteps.py``; the schedules
themselves are ``nodes.diffusion.schedulers``.
"""

from __future__ import annotations

import math
import re
from typing import Any

import torch

from engine.context import NodeContext
from engine.node import Node
from engine.schema import BOOLEAN, COMBO, FLOAT, INT, MODEL, SIGMAS, STRING, Input, NodeSchema, Output
from nodes.diffusion import schedulers as sch
from nodes.diffusion.names import SCHEDULER_NAMES

SIGMA_MAX, SIGMA_MIN = 14.614642, 0.0291675  # SD1's range: the defaults of the scheduler nodes


def _out(doc: str = "The noise levels, highest first.") -> tuple[Output, ...]:
    return (Output("SIGMAS", SIGMAS, doc),)


def _steps(default: int = 20) -> Input:
    return Input("steps", INT, "Number of steps (sigmas = steps + 1).", default=default, min=1, max=10000)


def _range() -> tuple[Input, Input]:
    return (
        Input("sigma_max", FLOAT, "Highest noise level.", default=SIGMA_MAX, min=0.0, max=5000.0, step=0.01),
        Input(
            "sigma_min",
            FLOAT,
            "Lowest non-zero noise level.",
            default=SIGMA_MIN,
            min=0.0,
            max=5000.0,
            step=0.01,
        ),
    )


def _denoise() -> Input:
    return Input(
        "denoise",
        FLOAT,
        "Fraction of the schedule to keep (its low end).",
        default=1.0,
        min=0.0,
        max=1.0,
        step=0.01,
    )


class BasicScheduler(Node):
    SCHEMA = NodeSchema(
        node_id="BasicScheduler",
        display_name="BasicScheduler",
        category="sampling/custom_sampling/schedulers",
        description="The model's sigmas for a scheduler name; denoise < 1 keeps the last steps of a longer run.",
        inputs=(
            Input("model", MODEL, "The model whose noise levels to use."),
            Input("scheduler", COMBO, "How noise levels are spaced.", options=tuple(SCHEDULER_NAMES)),
            _steps(),
            _denoise(),
        ),
        outputs=_out(),
    )

    def run(
        self, ctx: NodeContext, *, model: Any, scheduler: str, steps: int, denoise: float
    ) -> tuple[torch.Tensor]:
        return (sch.basic_scheduler_sigmas(model.model_sampling, scheduler, steps, denoise).float().cpu(),)


class KarrasScheduler(Node):
    SCHEMA = NodeSchema(
        node_id="KarrasScheduler",
        display_name="KarrasScheduler",
        category="sampling/custom_sampling/schedulers",
        description="Karras et al.'s schedule: sigma^(1/rho) spaced evenly, then a final 0.",
        inputs=(
            _steps(),
            *_range(),
            Input("rho", FLOAT, "Curvature (7 in the paper).", default=7.0, min=0.0, max=100.0, step=0.01),
        ),
        outputs=_out(),
    )

    def run(
        self, ctx: NodeContext, *, steps: int, sigma_max: float, sigma_min: float, rho: float
    ) -> tuple[torch.Tensor]:
        return (sch.karras(steps, sigma_min, sigma_max, rho),)


class ExponentialScheduler(Node):
    SCHEMA = NodeSchema(
        node_id="ExponentialScheduler",
        display_name="ExponentialScheduler",
        category="sampling/custom_sampling/schedulers",
        description="Sigmas evenly spaced in log sigma, then a final 0.",
        inputs=(_steps(), *_range()),
        outputs=_out(),
    )

    def run(self, ctx: NodeContext, *, steps: int, sigma_max: float, sigma_min: float) -> tuple[torch.Tensor]:
        return (sch.exponential(steps, sigma_min, sigma_max),)


class PolyexponentialScheduler(Node):
    SCHEMA = NodeSchema(
        node_id="PolyexponentialScheduler",
        display_name="PolyexponentialScheduler",
        category="sampling/custom_sampling/schedulers",
        description="log sigma following a polynomial ramp of degree rho (1 = exponential), then a final 0.",
        inputs=(
            _steps(),
            *_range(),
            Input("rho", FLOAT, "Polynomial degree.", default=1.0, min=0.0, max=100.0, step=0.01),
        ),
        outputs=_out(),
    )

    def run(
        self, ctx: NodeContext, *, steps: int, sigma_max: float, sigma_min: float, rho: float
    ) -> tuple[torch.Tensor]:
        return (sch.polyexponential(steps, sigma_min, sigma_max, rho),)


class LaplaceScheduler(Node):
    SCHEMA = NodeSchema(
        node_id="LaplaceScheduler",
        display_name="LaplaceScheduler",
        category="sampling/custom_sampling/schedulers",
        description="Tiankai et al.'s schedule: log sigma from a Laplace quantile ramp, clamped to the range.",
        inputs=(
            _steps(),
            *_range(),
            Input("mu", FLOAT, "Location in log sigma.", default=0.0, min=-10.0, max=10.0, step=0.1),
            Input("beta", FLOAT, "Scale in log sigma.", default=0.5, min=0.0, max=10.0, step=0.1),
        ),
        outputs=_out(),
    )

    def run(
        self, ctx: NodeContext, *, steps: int, sigma_max: float, sigma_min: float, mu: float, beta: float
    ) -> tuple[torch.Tensor]:
        return (sch.laplace(steps, sigma_min, sigma_max, mu, beta),)


class VPScheduler(Node):
    SCHEMA = NodeSchema(
        node_id="VPScheduler",
        display_name="VPScheduler",
        category="sampling/custom_sampling/schedulers",
        description="The continuous variance-preserving schedule (Song et al. 2021), then a final 0.",
        inputs=(
            _steps(),
            Input("beta_d", FLOAT, "Beta slope.", default=19.9, min=0.0, max=5000.0, step=0.01),
            Input("beta_min", FLOAT, "Smallest beta.", default=0.1, min=0.0, max=5000.0, step=0.01),
            Input("eps_s", FLOAT, "Last time step.", default=0.001, min=0.0, max=1.0, step=0.0001),
        ),
        outputs=_out(),
    )

    def run(
        self, ctx: NodeContext, *, steps: int, beta_d: float, beta_min: float, eps_s: float
    ) -> tuple[torch.Tensor]:
        return (sch.vp(steps, beta_d, beta_min, eps_s),)


class BetaSamplingScheduler(Node):
    SCHEMA = NodeSchema(
        node_id="BetaSamplingScheduler",
        display_name="BetaSamplingScheduler",
        category="sampling/custom_sampling/schedulers",
        description="The model's training sigmas at timesteps from a Beta(alpha, beta) quantile ramp.",
        inputs=(
            Input("model", MODEL, "The model whose noise levels to use."),
            _steps(),
            Input("alpha", FLOAT, "Beta distribution alpha.", default=0.6, min=0.0, max=50.0, step=0.01),
            Input("beta", FLOAT, "Beta distribution beta.", default=0.6, min=0.0, max=50.0, step=0.01),
        ),
        outputs=_out(),
    )

    def run(
        self, ctx: NodeContext, *, model: Any, steps: int, alpha: float, beta: float
    ) -> tuple[torch.Tensor]:
        return (sch.beta(model.model_sampling, steps, alpha, beta).float().cpu(),)


class SDTurboScheduler(Node):
    SCHEMA = NodeSchema(
        node_id="SDTurboScheduler",
        display_name="SDTurboScheduler",
        category="sampling/custom_sampling/schedulers",
        description="SD Turbo's timesteps 999, 899, ...: the first `steps` after skipping (1 - denoise) of them.",
        inputs=(
            Input("model", MODEL, "The model whose noise levels to use."),
            Input("steps", INT, "Number of steps.", default=1, min=1, max=10),
            Input(
                "denoise",
                FLOAT,
                "Fraction of the 10 timesteps to run.",
                default=1.0,
                min=0.0,
                max=1.0,
                step=0.01,
            ),
        ),
        outputs=_out(),
    )

    def run(self, ctx: NodeContext, *, model: Any, steps: int, denoise: float) -> tuple[torch.Tensor]:
        return (sch.sd_turbo(model.model_sampling, steps, denoise).float().cpu(),)


class AlignYourStepsScheduler(Node):
    SCHEMA = NodeSchema(
        node_id="AlignYourStepsScheduler",
        display_name="AlignYourStepsScheduler",
        category="sampling/custom_sampling/schedulers",
        description="NVIDIA's Align Your Steps noise levels, log-linearly resampled to the step count.",
        inputs=(
            Input("model_type", COMBO, "Which model family's table.", options=sch.AYS_MODEL_TYPES),
            _steps(10),
            _denoise(),
        ),
        outputs=_out(),
    )

    def run(self, ctx: NodeContext, *, model_type: str, steps: int, denoise: float) -> tuple[torch.Tensor]:
        return (sch.align_your_steps(model_type, steps, denoise),)


class GITSScheduler(Node):
    SCHEMA = NodeSchema(
        node_id="GITSScheduler",
        display_name="GITSScheduler",
        category="sampling/custom_sampling/schedulers",
        description="Geometry-inspired time steps (Chen et al. 2024): tabulated per coefficient and step count.",
        inputs=(
            Input("coeff", FLOAT, "The table's coefficient.", default=1.20, min=0.80, max=1.50, step=0.05),
            Input("steps", INT, "Number of steps.", default=10, min=2, max=1000),
            _denoise(),
        ),
        outputs=_out(),
    )

    def run(self, ctx: NodeContext, *, coeff: float, steps: int, denoise: float) -> tuple[torch.Tensor]:
        return (sch.gits(coeff, steps, denoise),)


class OptimalStepsScheduler(Node):
    SCHEMA = NodeSchema(
        node_id="OptimalStepsScheduler",
        display_name="OptimalStepsScheduler",
        category="sampling/custom_sampling/schedulers",
        description="Optimal Stepsize noise levels for flow models, log-linearly resampled to the step count.",
        inputs=(
            Input("model_type", COMBO, "Which model's table.", options=sch.OPTIMAL_STEPS_MODEL_TYPES),
            Input("steps", INT, "Number of steps.", default=20, min=3, max=1000),
            _denoise(),
        ),
        outputs=_out(),
    )

    def run(self, ctx: NodeContext, *, model_type: str, steps: int, denoise: float) -> tuple[torch.Tensor]:
        return (sch.optimal_steps(model_type, steps, denoise),)


class SplitSigmas(Node):
    SCHEMA = NodeSchema(
        node_id="SplitSigmas",
        display_name="SplitSigmas",
        category="sampling/custom_sampling/sigmas",
        description="Split a schedule at a step: sigmas[:step + 1] and sigmas[step:] (sharing one sigma).",
        inputs=(
            Input("sigmas", SIGMAS, "The schedule."),
            Input("step", INT, "Where to split.", default=0, min=0, max=10000),
        ),
        outputs=(Output("high_sigmas", SIGMAS, "The first part."), Output("low_sigmas", SIGMAS, "The rest.")),
    )

    def run(self, ctx: NodeContext, *, sigmas: torch.Tensor, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        return (sigmas[: step + 1].clone(), sigmas[step:].clone())


class SplitSigmasDenoise(Node):
    SCHEMA = NodeSchema(
        node_id="SplitSigmasDenoise",
        display_name="SplitSigmasDenoise",
        category="sampling/custom_sampling/sigmas",
        description="Split a schedule so the low part has round(steps * denoise) steps.",
        inputs=(Input("sigmas", SIGMAS, "The schedule."), _denoise()),
        outputs=(Output("high_sigmas", SIGMAS, "The first part."), Output("low_sigmas", SIGMAS, "The rest.")),
    )

    def run(
        self, ctx: NodeContext, *, sigmas: torch.Tensor, denoise: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        total = round(max(sigmas.shape[-1] - 1, 0) * denoise)
        return (sigmas[:-total].clone(), sigmas[-(total + 1) :].clone())


class FlipSigmas(Node):
    SCHEMA = NodeSchema(
        node_id="FlipSigmas",
        display_name="FlipSigmas",
        category="sampling/custom_sampling/sigmas",
        description="Reverse a schedule (for unsampling); a leading 0 becomes 0.0001.",
        inputs=(Input("sigmas", SIGMAS, "The schedule."),),
        outputs=_out("The reversed schedule."),
    )

    def run(self, ctx: NodeContext, *, sigmas: torch.Tensor) -> tuple[torch.Tensor]:
        if len(sigmas) == 0:
            return (sigmas,)
        flipped = sigmas.flip(0)
        if flipped[0] == 0:
            flipped[0] = 0.0001
        return (flipped,)


class SetFirstSigma(Node):
    SCHEMA = NodeSchema(
        node_id="SetFirstSigma",
        display_name="SetFirstSigma",
        category="sampling/custom_sampling/sigmas",
        description="Replace the first sigma.",
        inputs=(
            Input("sigmas", SIGMAS, "The schedule."),
            Input("sigma", FLOAT, "The new first sigma.", default=136.0, min=0.0, max=20000.0, step=0.001),
        ),
        outputs=_out(),
    )

    def run(self, ctx: NodeContext, *, sigmas: torch.Tensor, sigma: float) -> tuple[torch.Tensor]:
        out = sigmas.clone()
        out[0] = sigma
        return (out,)


_SPACINGS = {
    "linear": lambda x: x,
    "cosine": lambda x: torch.sin(x * math.pi / 2),
    "sine": lambda x: 1 - torch.cos(x * math.pi / 2),
}


class ExtendIntermediateSigmas(Node):
    SCHEMA = NodeSchema(
        node_id="ExtendIntermediateSigmas",
        display_name="ExtendIntermediateSigmas",
        category="sampling/custom_sampling/sigmas",
        description="Insert steps - 1 interpolated sigmas into every interval whose start lies in the range.",
        inputs=(
            Input("sigmas", SIGMAS, "The schedule."),
            Input("steps", INT, "Sub-steps per interval.", default=2, min=1, max=100),
            Input(
                "start_at_sigma",
                FLOAT,
                "Highest interval start to extend (-1: no limit).",
                default=-1.0,
                min=-1.0,
                max=20000.0,
                step=0.01,
            ),
            Input(
                "end_at_sigma",
                FLOAT,
                "Lowest interval start to extend.",
                default=12.0,
                min=0.0,
                max=20000.0,
                step=0.01,
            ),
            Input("spacing", COMBO, "How the inserted sigmas are spaced.", options=tuple(_SPACINGS)),
        ),
        outputs=_out(),
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        sigmas: torch.Tensor,
        steps: int,
        start_at_sigma: float,
        end_at_sigma: float,
        spacing: str,
    ) -> tuple[torch.Tensor]:
        start = float("inf") if start_at_sigma < 0 else start_at_sigma
        fractions = _SPACINGS[spacing](torch.linspace(0, 1, steps + 1)[1:-1])
        out: list[float] = []
        for i in range(len(sigmas) - 1):
            current, nxt = sigmas[i], sigmas[i + 1]
            out.append(float(current))
            if end_at_sigma <= current <= start:
                out.extend((fractions * (nxt - current) + current).tolist())
        if len(sigmas) > 0:
            out.append(float(sigmas[-1]))
        return (torch.FloatTensor(out),)


class SamplingPercentToSigma(Node):
    SCHEMA = NodeSchema(
        node_id="SamplingPercentToSigma",
        display_name="SamplingPercentToSigma",
        category="sampling/custom_sampling/sigmas",
        description="The model's sigma at a fraction of the sampling process (0 = start, 1 = end).",
        inputs=(
            Input("model", MODEL, "The model whose noise levels to use."),
            Input(
                "sampling_percent", FLOAT, "Fraction of sampling.", default=0.0, min=0.0, max=1.0, step=0.0001
            ),
            Input(
                "return_actual_sigma",
                BOOLEAN,
                "Give sigma_max / sigma_min at 0 / 1 instead of the values used for interval checks.",
                default=False,
            ),
        ),
        outputs=(Output("sigma_value", FLOAT, "The sigma."),),
    )

    def run(
        self, ctx: NodeContext, *, model: Any, sampling_percent: float, return_actual_sigma: bool
    ) -> tuple[float]:
        ms = model.model_sampling
        value = float(ms.percent_to_sigma(sampling_percent))
        if return_actual_sigma and sampling_percent == 0.0:
            value = float(ms.sigma_max)
        elif return_actual_sigma and sampling_percent == 1.0:
            value = float(ms.sigma_min)
        return (value,)


class ManualSigmas(Node):
    SCHEMA = NodeSchema(
        node_id="ManualSigmas",
        display_name="ManualSigmas",
        category="sampling/custom_sampling",
        description="A schedule typed by hand: the numbers found in the text, in order.",
        inputs=(Input("sigmas", STRING, "Numbers separated by commas or spaces.", default="1, 0.5"),),
        outputs=_out(),
        experimental=True,
    )

    def run(self, ctx: NodeContext, *, sigmas: str) -> tuple[torch.Tensor]:
        return (torch.FloatTensor([float(v) for v in re.findall(r"[-+]?(?:\d*\.*\d+)", sigmas)]),)


NODES: list[type[Node]] = [
    BasicScheduler,
    KarrasScheduler,
    ExponentialScheduler,
    PolyexponentialScheduler,
    LaplaceScheduler,
    VPScheduler,
    BetaSamplingScheduler,
    SDTurboScheduler,
    AlignYourStepsScheduler,
    GITSScheduler,
    OptimalStepsScheduler,
    SplitSigmas,
    SplitSigmasDenoise,
    FlipSigmas,
    SetFirstSigma,
    ExtendIntermediateSigmas,
    SamplingPercentToSigma,
    ManualSigmas,
]
