"""SAMPLER nodes: KSamplerSelect and ComfyUI's Sampler* nodes with their options.

Same names, inputs and semantics as ComfyUI's ``comfy_extras/nodes_custom_sampler.py`` and
``nodes_advanced_samplers.py``. A SAMPLER value is the core's immutable sampler
(``nodes.diffusion.ksampler``): a sampler function and its options. The two samplers that live
in ComfyUI's node files rather than its sampler library (LCM with upscaling, the "alternative"
Euler CFG++) are written here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from engine.context import NodeContext
from engine.node import Node
from engine.schema import BOOLEAN, COMBO, FLOAT, INT, MODEL, SAMPLER, Input, NodeSchema, Output
from nodes.diffusion.names import SAMPLER_NAMES

_OUT = (Output("SAMPLER", SAMPLER, "The sampler."),)
_CATEGORY = "sampling/custom_sampling/samplers"


def _ksampler(name: str, options: dict[str, Any] | None = None) -> Any:
    from nodes.diffusion.ksampler import ksampler  # lazy: the samplers (~150 ms)

    return ksampler(name, options or {})


def _float(
    name: str, doc: str, default: float, lo: float = 0.0, hi: float = 100.0, step: float = 0.01
) -> Input:
    return Input(name, FLOAT, doc, default=default, min=lo, max=hi, step=step)


def _eta(default: float = 1.0, hi: float = 100.0) -> Input:
    return _float("eta", "Stochastic strength (0: deterministic).", default, hi=hi)


def _s_noise(hi: float = 100.0) -> Input:
    return _float("s_noise", "Multiplier of the added noise.", 1.0, hi=hi)


def _noise_device() -> Input:
    return Input(
        "noise_device",
        COMBO,
        "Where the Brownian-tree noise is drawn (gpu: the model's device).",
        options=("gpu", "cpu"),
    )


class KSamplerSelect(Node):
    SCHEMA = NodeSchema(
        node_id="KSamplerSelect",
        display_name="KSamplerSelect",
        category=_CATEGORY,
        description="A sampler by ComfyUI name, with its default options.",
        inputs=(Input("sampler_name", COMBO, "The stepping rule.", options=tuple(SAMPLER_NAMES)),),
        outputs=_OUT,
    )

    def run(self, ctx: NodeContext, *, sampler_name: str) -> tuple[Any]:
        from nodes.diffusion.ksampler import sampler_object  # lazy: the samplers (~150 ms)

        return (sampler_object(sampler_name),)


class SamplerEulerAncestral(Node):
    SCHEMA = NodeSchema(
        node_id="SamplerEulerAncestral",
        display_name="SamplerEulerAncestral",
        category=_CATEGORY,
        description="Euler ancestral with its noise options.",
        inputs=(_eta(), _s_noise()),
        outputs=_OUT,
    )

    def run(self, ctx: NodeContext, *, eta: float, s_noise: float) -> tuple[Any]:
        return (_ksampler("euler_ancestral", {"eta": eta, "s_noise": s_noise}),)


class SamplerEulerAncestralCFGPP(Node):
    SCHEMA = NodeSchema(
        node_id="SamplerEulerAncestralCFGPP",
        display_name="SamplerEulerAncestralCFG++",
        category=_CATEGORY,
        description="Euler ancestral CFG++ (for low guidance).",
        inputs=(_eta(hi=1.0), _s_noise(hi=10.0)),
        outputs=_OUT,
    )

    def run(self, ctx: NodeContext, *, eta: float, s_noise: float) -> tuple[Any]:
        return (_ksampler("euler_ancestral_cfg_pp", {"eta": eta, "s_noise": s_noise}),)


class SamplerLMS(Node):
    SCHEMA = NodeSchema(
        node_id="SamplerLMS",
        display_name="SamplerLMS",
        category=_CATEGORY,
        description="Linear multistep of a chosen order.",
        inputs=(Input("order", INT, "How many past steps to combine.", default=4, min=1, max=100),),
        outputs=_OUT,
    )

    def run(self, ctx: NodeContext, *, order: int) -> tuple[Any]:
        return (_ksampler("lms", {"order": order}),)


class SamplerDPMPP_3M_SDE(Node):  # noqa: N801 - ComfyUI's name
    SCHEMA = NodeSchema(
        node_id="SamplerDPMPP_3M_SDE",
        display_name="SamplerDPMPP_3M_SDE",
        category=_CATEGORY,
        description="DPM-Solver++(3M) SDE with Brownian-tree noise.",
        inputs=(_eta(), _s_noise(), _noise_device()),
        outputs=_OUT,
    )

    def run(self, ctx: NodeContext, *, eta: float, s_noise: float, noise_device: str) -> tuple[Any]:
        name = "dpmpp_3m_sde" if noise_device == "cpu" else "dpmpp_3m_sde_gpu"
        return (_ksampler(name, {"eta": eta, "s_noise": s_noise}),)


class SamplerDPMPP_2M_SDE(Node):  # noqa: N801 - ComfyUI's name
    SCHEMA = NodeSchema(
        node_id="SamplerDPMPP_2M_SDE",
        display_name="SamplerDPMPP_2M_SDE",
        category=_CATEGORY,
        description="DPM-Solver++(2M) SDE with Brownian-tree noise.",
        inputs=(
            Input("solver_type", COMBO, "Second-order correction.", options=("midpoint", "heun")),
            _eta(),
            _s_noise(),
            _noise_device(),
        ),
        outputs=_OUT,
    )

    def run(
        self, ctx: NodeContext, *, solver_type: str, eta: float, s_noise: float, noise_device: str
    ) -> tuple[Any]:
        name = "dpmpp_2m_sde" if noise_device == "cpu" else "dpmpp_2m_sde_gpu"
        return (_ksampler(name, {"eta": eta, "s_noise": s_noise, "solver_type": solver_type}),)


class SamplerDPMPP_SDE(Node):  # noqa: N801 - ComfyUI's name
    SCHEMA = NodeSchema(
        node_id="SamplerDPMPP_SDE",
        display_name="SamplerDPMPP_SDE",
        category=_CATEGORY,
        description="DPM-Solver++ SDE (two model calls per step) with Brownian-tree noise.",
        inputs=(
            _eta(),
            _s_noise(),
            _float("r", "Relative position of the intermediate step.", 0.5),
            _noise_device(),
        ),
        outputs=_OUT,
    )

    def run(self, ctx: NodeContext, *, eta: float, s_noise: float, r: float, noise_device: str) -> tuple[Any]:
        name = "dpmpp_sde" if noise_device == "cpu" else "dpmpp_sde_gpu"
        return (_ksampler(name, {"eta": eta, "s_noise": s_noise, "r": r}),)


class SamplerDPMPP_2S_Ancestral(Node):  # noqa: N801 - ComfyUI's name
    SCHEMA = NodeSchema(
        node_id="SamplerDPMPP_2S_Ancestral",
        display_name="SamplerDPMPP_2S_Ancestral",
        category=_CATEGORY,
        description="DPM-Solver++(2S) ancestral.",
        inputs=(_eta(), _s_noise()),
        outputs=_OUT,
    )

    def run(self, ctx: NodeContext, *, eta: float, s_noise: float) -> tuple[Any]:
        return (_ksampler("dpmpp_2s_ancestral", {"eta": eta, "s_noise": s_noise}),)


class SamplerDPMAdaptative(Node):
    SCHEMA = NodeSchema(
        node_id="SamplerDPMAdaptative",
        display_name="SamplerDPMAdaptative",
        category=_CATEGORY,
        description="DPM-Solver with adaptive step size (its own step count).",
        inputs=(
            Input("order", INT, "Solver order.", default=3, min=2, max=3),
            _float("rtol", "Relative tolerance.", 0.05),
            _float("atol", "Absolute tolerance.", 0.0078),
            _float("h_init", "Initial step size.", 0.05),
            _float("pcoeff", "PID proportional term.", 0.0),
            _float("icoeff", "PID integral term.", 1.0),
            _float("dcoeff", "PID derivative term.", 0.0),
            _float("accept_safety", "Step acceptance safety factor.", 0.81),
            _eta(0.0),
            _s_noise(),
        ),
        outputs=_OUT,
    )

    def run(self, ctx: NodeContext, **options: Any) -> tuple[Any]:
        return (_ksampler("dpm_adaptive", dict(options)),)


@dataclass(frozen=True)
class PowerNoiseScaler:
    """The reverse-time SDE noise scaler of SamplerER_SDE: x ** (eta + 1) (a value, so cache-safe)."""

    eta: float

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x ** (self.eta + 1)


class SamplerER_SDE(Node):  # noqa: N801 - ComfyUI's name
    SCHEMA = NodeSchema(
        node_id="SamplerER_SDE",
        display_name="SamplerER_SDE",
        category=_CATEGORY,
        description="Extended reverse-time SDE solver (ER-SDE, reverse-time SDE or ODE).",
        inputs=(
            Input(
                "solver_type", COMBO, "Which noise scaling.", options=("ER-SDE", "Reverse-time SDE", "ODE")
            ),
            Input("max_stage", INT, "Highest solver stage.", default=3, min=1, max=3),
            _float("eta", "Stochastic strength of the reverse-time SDE (not used by ER-SDE).", 1.0),
            _s_noise(),
        ),
        outputs=_OUT,
    )

    def run(
        self, ctx: NodeContext, *, solver_type: str, max_stage: int, eta: float, s_noise: float
    ) -> tuple[Any]:
        if solver_type == "ODE" or (solver_type == "Reverse-time SDE" and eta == 0):
            eta, s_noise = 0.0, 0.0
        scaler = None if solver_type == "ER-SDE" else PowerNoiseScaler(eta)
        return (_ksampler("er_sde", {"s_noise": s_noise, "noise_scaler": scaler, "max_stage": max_stage}),)


@dataclass(frozen=True)
class TauInterval:
    """SA-Solver's tau(sigma): ``eta`` inside [end_sigma, start_sigma], 0 outside (a value)."""

    start_sigma: float
    end_sigma: float
    eta: float

    def __call__(self, sigma: Any) -> float:
        if self.eta <= 0:
            return 0.0
        return self.eta if self.end_sigma <= float(sigma) <= self.start_sigma else 0.0


class SamplerSASolver(Node):
    SCHEMA = NodeSchema(
        node_id="SamplerSASolver",
        display_name="SamplerSASolver",
        category=_CATEGORY,
        description="SA-Solver (stochastic Adams) with noise between two sampling percentages.",
        inputs=(
            Input("model", MODEL, "The model whose noise levels define the SDE window."),
            _float("eta", "Stochastic strength.", 1.0, hi=10.0),
            _float("sde_start_percent", "Where the stochastic part starts.", 0.2, hi=1.0, step=0.001),
            _float("sde_end_percent", "Where it ends.", 0.8, hi=1.0, step=0.001),
            _s_noise(),
            Input("predictor_order", INT, "Predictor order.", default=3, min=1, max=6),
            Input("corrector_order", INT, "Corrector order (0: none).", default=4, min=0, max=6),
            Input("use_pece", BOOLEAN, "Evaluate after the corrector too (PECE).", default=False),
            Input("simple_order_2", BOOLEAN, "Simplified second-order coefficients.", default=False),
        ),
        outputs=_OUT,
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        model: Any,
        eta: float,
        sde_start_percent: float,
        sde_end_percent: float,
        s_noise: float,
        predictor_order: int,
        corrector_order: int,
        use_pece: bool,
        simple_order_2: bool,
    ) -> tuple[Any]:
        ms = model.model_sampling
        tau = TauInterval(
            float(ms.percent_to_sigma(sde_start_percent)), float(ms.percent_to_sigma(sde_end_percent)), eta
        )
        return (
            _ksampler(
                "sa_solver",
                {
                    "tau_func": tau,
                    "s_noise": s_noise,
                    "predictor_order": predictor_order,
                    "corrector_order": corrector_order,
                    "use_pece": use_pece,
                    "simple_order_2": simple_order_2,
                },
            ),
        )


class SamplerSEEDS2(Node):
    SCHEMA = NodeSchema(
        node_id="SamplerSEEDS2",
        display_name="SamplerSEEDS2",
        category=_CATEGORY,
        description="SEEDS-2 (exponential SDE solver); phi_2 with r 1 and eta 0 is exp_heun_2_x0.",
        inputs=(
            Input("solver_type", COMBO, "Exponential integrator form.", options=("phi_1", "phi_2")),
            _eta(),
            _s_noise(),
            _float("r", "Relative step size of the intermediate stage.", 0.5, lo=0.01, hi=1.0),
        ),
        outputs=_OUT,
    )

    def run(self, ctx: NodeContext, *, solver_type: str, eta: float, s_noise: float, r: float) -> tuple[Any]:
        return (_ksampler("seeds_2", {"eta": eta, "s_noise": s_noise, "r": r, "solver_type": solver_type}),)


def _resize(x: torch.Tensor, size: tuple[int, int], method: str) -> torch.Tensor:
    if method == "bislerp":
        raise ValueError(
            "SamplerLCMUpscale: upscale_method 'bislerp' is not available in Loom yet; "
            "choose nearest-exact, bilinear, area or bicubic"
        )
    corners = {"align_corners": False} if method in ("bilinear", "bicubic") else {}
    return torch.nn.functional.interpolate(x, size=size, mode=method, **corners)


def sample_lcm_upscale(
    model: Any,
    x: torch.Tensor,
    sigmas: torch.Tensor,
    extra_args: dict | None = None,
    callback: Any = None,
    disable: Any = None,
    total_upscale: float = 2.0,
    upscale_method: str = "bislerp",
    upscale_steps: int | None = None,
) -> torch.Tensor:
    """LCM that grows the latent after each of its first steps up to ``total_upscale``; fresh noise
    comes from torch's global generator, as ComfyUI's ``randn_like``."""
    extra_args = extra_args or {}
    steps = max(len(sigmas) // 2 + 1, 2) if upscale_steps is None else min(upscale_steps + 1, len(sigmas) + 1)
    scales = np.linspace(1.0, total_upscale, steps)[1:]
    h, w = x.shape[-2:]
    ones = x.new_ones([x.shape[0]])
    for i in range(len(sigmas) - 1):
        denoised = model(x, sigmas[i] * ones, **extra_args)
        if callback is not None:
            callback({"x": x, "i": i, "sigma": sigmas[i], "sigma_hat": sigmas[i], "denoised": denoised})
        x = denoised
        if i < len(scales):
            x = _resize(x, (round(h * scales[i]), round(w * scales[i])), upscale_method)
        if sigmas[i + 1] > 0:
            x = x + sigmas[i + 1] * torch.randn_like(x)
    return x


class SamplerLCMUpscale(Node):
    SCHEMA = NodeSchema(
        node_id="SamplerLCMUpscale",
        display_name="SamplerLCMUpscale",
        category=_CATEGORY,
        description="LCM that upscales the latent during its first steps.",
        inputs=(
            _float("scale_ratio", "Total upscale factor.", 1.0, lo=0.1, hi=20.0),
            Input(
                "scale_steps",
                INT,
                "Steps over which to upscale (-1: about half).",
                default=-1,
                min=-1,
                max=1000,
            ),
            Input(
                "upscale_method",
                COMBO,
                "Interpolation.",
                options=("bislerp", "nearest-exact", "bilinear", "area", "bicubic"),
            ),
        ),
        outputs=_OUT,
    )

    def run(
        self, ctx: NodeContext, *, scale_ratio: float, scale_steps: int, upscale_method: str
    ) -> tuple[Any]:
        from nodes.diffusion.ksampler import KSamplerFn  # lazy: the samplers (~150 ms)

        options = {
            "total_upscale": scale_ratio,
            "upscale_steps": None if scale_steps < 0 else scale_steps,
            "upscale_method": upscale_method,
        }
        return (KSamplerFn(sample_lcm_upscale, options),)


class SamplerEulerCFGpp(Node):
    SCHEMA = NodeSchema(
        node_id="SamplerEulerCFGpp",
        display_name="SamplerEulerCFG++",
        category="_for_testing",
        description="Euler CFG++ (for low guidance): the regular form or the alternative one.",
        inputs=(Input("version", COMBO, "Which formulation.", options=("regular", "alternative")),),
        outputs=_OUT,
    )

    def run(self, ctx: NodeContext, *, version: str) -> tuple[Any]:
        from nodes.diffusion.ksampler import KSamplerFn  # lazy: the samplers (~150 ms)

        return (KSamplerFn(sample_euler_pp, {}) if version == "alternative" else _ksampler("euler_cfg_pp"),)


def sample_euler_pp(
    model: Any,
    x: torch.Tensor,
    sigmas: torch.Tensor,
    extra_args: dict | None = None,
    callback: Any = None,
    disable: Any = None,
) -> torch.Tensor:
    """The "alternative" Euler CFG++: the step direction uses x - denoised + uncond_denoised."""
    from nodes.diffusion.k_samplers import to_d, with_post_cfg  # lazy: the samplers (~150 ms)

    extra_args = dict(extra_args or {})
    uncond: list[torch.Tensor] = []

    def keep_uncond(args: dict[str, Any]) -> torch.Tensor:
        uncond[:] = [args["uncond_denoised"]]
        return args["denoised"]

    extra_args["model_options"] = with_post_cfg(
        extra_args.get("model_options"), keep_uncond, disable_cfg1_optimization=True
    )
    ones = x.new_ones([x.shape[0]])
    for i in range(len(sigmas) - 1):
        denoised = model(x, sigmas[i] * ones, **extra_args)
        d = to_d(x - denoised + uncond[0], sigmas[i], denoised)
        if callback is not None:
            callback({"x": x, "i": i, "sigma": sigmas[i], "sigma_hat": sigmas[i], "denoised": denoised})
        x = x + d * (sigmas[i + 1] - sigmas[i])
    return x


NODES: list[type[Node]] = [
    KSamplerSelect,
    SamplerEulerAncestral,
    SamplerEulerAncestralCFGPP,
    SamplerEulerCFGpp,
    SamplerLMS,
    SamplerDPMPP_2M_SDE,
    SamplerDPMPP_3M_SDE,
    SamplerDPMPP_SDE,
    SamplerDPMPP_2S_Ancestral,
    SamplerDPMAdaptative,
    SamplerER_SDE,
    SamplerSASolver,
    SamplerSEEDS2,
    SamplerLCMUpscale,
]
