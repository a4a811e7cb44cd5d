"""Model sampling: how a denoiser's noise level (sigma) relates to its timestep input and outputs.

A :class:`ModelSampling` is the composition of two small, frozen parts:

- a **prediction** (parameterisation): how the network input is scaled and how the network output
  becomes the denoised estimate x0 (eps, v, x0, flow "const", EDM, LCM boundary condition), plus how
  a clean latent and unit noise are mixed at the first sigma (``noise_scaling``);
- a **sigma schedule**: the table of training sigmas and the maps ``timestep(sigma)`` /
  ``sigma(timestep)`` (discrete beta schedules, LCM's distilled 50-step table, continuous EDM/V,
  discrete flow with shift, Flux's exponential time shift).

Numerics follow ComfyUI's ``comfy/model_sampling.py`` (read for behaviour, written anew): betas in
float64, the sigma table stored as float32, a discrete timestep is the index of the table entry
nearest in log sigma, ``sigma(t)`` interpolates log sigma linearly between neighbouring entries.
References: Karras et al. 2022 (EDM, arXiv:2206.00364), Salimans & Ho 2022 (v-prediction),
Lin et al. 2023 (zero terminal SNR, arXiv:2305.08891), Esser et al. 2024 (SD3 flow shift).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from nodes.diffusion.predictions import (
    PREDICTIONS,
    EDMPrediction,
    FlowPrediction,
    ImgToImgPrediction,
    LCMPrediction,
    ModelSamplingError,
    Prediction,
    VPrediction,
    X0Prediction,
    prediction_for,
    reshape_sigma,
)
from nodes.diffusion.sigma_schedules import (
    BETA_SCHEDULES,
    INFINITE_SIGMA,
    ZSNR_LAST_ALPHA_BAR,
    ContinuousEDMSchedule,
    ContinuousVSchedule,
    DiscreteSchedule,
    DistilledSchedule,
    FlowSchedule,
    FluxSchedule,
    SigmaSchedule,
    StableCascadeSchedule,
    flux_time_shift,
    make_betas,
    rescale_zero_terminal_snr,
    time_snr_shift,
)

__all__ = [
    "BETA_SCHEDULES",
    "INFINITE_SIGMA",
    "PREDICTIONS",
    "ZSNR_LAST_ALPHA_BAR",
    "ContinuousEDMSchedule",
    "ContinuousVSchedule",
    "DiscreteSchedule",
    "DistilledSchedule",
    "EDMPrediction",
    "FlowPrediction",
    "FlowSchedule",
    "FluxSchedule",
    "ImgToImgPrediction",
    "LCMPrediction",
    "ModelSampling",
    "ModelSamplingError",
    "Prediction",
    "SigmaSchedule",
    "StableCascadeSchedule",
    "VPrediction",
    "X0Prediction",
    "continuous_edm",
    "continuous_v",
    "discrete",
    "discrete_from",
    "flow",
    "flux",
    "flux_mu",
    "flux_time_shift",
    "make_betas",
    "prediction_for",
    "rescale_zero_terminal_snr",
    "stable_cascade",
    "reshape_sigma",
    "time_snr_shift",
]


@dataclass(frozen=True, eq=False)
class ModelSampling:
    """A prediction over a sigma schedule, with ComfyUI's method names so samplers read naturally.

    Immutable; ``key`` identifies it for caches (two objects with the same key behave the same)."""

    prediction: Prediction
    schedule: SigmaSchedule
    sigma_data: float = 1.0

    # -- the schedule ----------------------------------------------------------------------
    @property
    def sigmas(self) -> torch.Tensor:
        """The training sigma table, ascending, float32 (CPU)."""
        return self.schedule.sigmas

    @property
    def sigma_min(self) -> torch.Tensor:
        return self.schedule.sigmas[0]

    @property
    def sigma_max(self) -> torch.Tensor:
        return self.schedule.sigmas[-1]

    def timestep(self, sigma: torch.Tensor) -> torch.Tensor:
        """The network's timestep for ``sigma`` (an integer index for discrete schedules)."""
        return self.schedule.timestep(sigma)

    def sigma(self, timestep: torch.Tensor) -> torch.Tensor:
        return self.schedule.sigma(timestep)

    def percent_to_sigma(self, percent: float) -> float:
        """Sigma at ``percent`` of the way through sampling (0 = start: "infinite"; 1 = end: 0)."""
        return self.schedule.percent_to_sigma(percent)

    # -- the prediction ----------------------------------------------------------------------
    @property
    def kind(self) -> str:
        return self.prediction.kind

    @property
    def is_flow(self) -> bool:
        """True for rectified-flow ("CONST") models, whose samplers use flow variants."""
        return isinstance(self.prediction, FlowPrediction)

    def calculate_input(self, sigma: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return self.prediction.calculate_input(sigma, x, self.sigma_data)

    def calculate_denoised(
        self, sigma: torch.Tensor, model_output: torch.Tensor, model_input: torch.Tensor
    ) -> torch.Tensor:
        timestep = self.timestep(sigma) if isinstance(self.prediction, LCMPrediction) else None
        return self.prediction.calculate_denoised(sigma, model_output, model_input, self.sigma_data, timestep)

    def noise_scaling(
        self, sigma: torch.Tensor, noise: torch.Tensor, latent_image: torch.Tensor, max_denoise: bool = False
    ) -> torch.Tensor:
        return self.prediction.noise_scaling(sigma, noise, latent_image, max_denoise)

    def inverse_noise_scaling(self, sigma: torch.Tensor, latent: torch.Tensor) -> torch.Tensor:
        return self.prediction.inverse_noise_scaling(sigma, latent)

    def apply(
        self,
        network: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        x: torch.Tensor,
        sigma: torch.Tensor,
        dtype: torch.dtype | None = None,
    ) -> torch.Tensor:
        """Denoised prediction of ``network(scaled_input, timestep)`` for ``x`` at ``sigma`` ([B]), in
        ComfyUI's order (``BaseModel._apply_model``): scale the input, cast it to ``dtype`` (the
        network's compute dtype), float32 timestep, float32 output, then ``calculate_denoised``."""
        x_in = self.calculate_input(sigma, x)
        if dtype is not None:
            x_in = x_in.to(dtype)
        output = network(x_in, self.timestep(sigma).float()).float()
        return self.calculate_denoised(sigma, output, x)

    # -- identity --------------------------------------------------------------------------
    def describe(self) -> str:
        extra = (
            f",noise_scale={self.prediction.noise_scale!r}"
            if isinstance(self.prediction, FlowPrediction)
            else ""
        )
        return f"{self.prediction.kind}{extra}|{self.schedule.describe()}|sigma_data={self.sigma_data!r}"

    @property
    def key(self) -> str:
        return self.describe()


# ---------------------------------------------------------------------------------------------
# Constructors named after ComfyUI's classes and nodes
# ---------------------------------------------------------------------------------------------


def discrete(
    kind: str = "eps",
    *,
    beta_schedule: str = "linear",
    linear_start: float = 0.00085,
    linear_end: float = 0.012,
    timesteps: int = 1000,
    zsnr: bool = False,
) -> ModelSampling:
    """ModelSamplingDiscrete: a DDPM table with an eps/v/x0/img_to_img/lcm prediction. ``lcm``
    also switches the table to LCM's distilled 50 steps (as ComfyUI's ModelSamplingDiscrete node)."""
    base = DiscreteSchedule(beta_schedule, linear_start, linear_end, timesteps, zsnr)
    schedule: SigmaSchedule = DistilledSchedule(base) if kind == "lcm" else base
    return ModelSampling(prediction_for(kind), schedule)


def discrete_from(base: ModelSampling, kind: str, zsnr: bool = False) -> ModelSampling:
    """ComfyUI's ModelSamplingDiscrete node: prediction ``kind`` (and zsnr) over the model's own beta
    schedule, or over the SD default (linear 0.00085..0.012, 1000 steps) when the model's schedule is
    not a discrete one (e.g. a flow model)."""
    schedule = base.schedule
    if isinstance(schedule, DistilledSchedule):
        schedule = schedule.base
    if not isinstance(schedule, DiscreteSchedule):
        schedule = DiscreteSchedule()
    return discrete(
        kind,
        beta_schedule=schedule.beta_schedule,
        linear_start=schedule.linear_start,
        linear_end=schedule.linear_end,
        timesteps=schedule.timesteps,
        zsnr=zsnr,
    )


def continuous_edm(
    kind: str = "v_prediction", *, sigma_min: float = 0.002, sigma_max: float = 120.0, sigma_data: float = 1.0
) -> ModelSampling:
    """ModelSamplingContinuousEDM (prediction eps, v_prediction, edm, ...)."""
    return ModelSampling(prediction_for(kind), ContinuousEDMSchedule(sigma_min, sigma_max), sigma_data)


def continuous_v(
    kind: str = "v_prediction", *, sigma_min: float = 0.002, sigma_max: float = 120.0, sigma_data: float = 1.0
) -> ModelSampling:
    """ModelSamplingContinuousV."""
    return ModelSampling(prediction_for(kind), ContinuousVSchedule(sigma_min, sigma_max), sigma_data)


def flow(
    *, shift: float = 1.0, multiplier: float = 1000.0, timesteps: int = 1000, noise_scale: float = 1.0
) -> ModelSampling:
    """ModelSamplingDiscreteFlow (SD3: shift 3, multiplier 1000; AuraFlow: shift 1.73, multiplier 1)."""
    return ModelSampling(FlowPrediction(noise_scale=noise_scale), FlowSchedule(shift, multiplier, timesteps))


def flux(*, shift: float = 1.15, timesteps: int = 10000) -> ModelSampling:
    """ModelSamplingFlux: flow prediction over Flux's exponential time shift (``shift`` is mu)."""
    return ModelSampling(FlowPrediction(), FluxSchedule(shift, timesteps))


def stable_cascade(*, shift: float = 2.0) -> ModelSampling:
    """ModelSamplingStableCascade: eps prediction over Stable Cascade's shifted cosine schedule."""
    return ModelSampling(prediction_for("eps"), StableCascadeSchedule(shift))


def flux_mu(width: int, height: int, base_shift: float = 0.5, max_shift: float = 1.15) -> float:
    """The mu that ComfyUI's ModelSamplingFlux node derives from the image size (256 -> 4096 tokens)."""
    tokens = width * height / (8 * 8 * 2 * 2)
    slope = (max_shift - base_shift) / (4096 - 256)
    return tokens * slope + (base_shift - slope * 256)
