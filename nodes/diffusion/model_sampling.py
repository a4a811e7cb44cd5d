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

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import ClassVar, Protocol

import torch

INFINITE_SIGMA = 999999999.9  # ComfyUI's "no upper bound" for percent_to_sigma(<= 0)
ZSNR_LAST_ALPHA_BAR = 4.8973451890853435e-08  # the value ComfyUI puts at the last zero-SNR entry
BETA_SCHEDULES = ("linear", "scaled_linear", "cosine", "squaredcos_cap_v2", "sqrt_linear", "sqrt")


class ModelSamplingError(ValueError):
    """A model-sampling parameter that cannot be used; the message says which and why."""


def reshape_sigma(sigma: torch.Tensor, ndim: int) -> torch.Tensor:
    """A per-sample sigma ``[B]`` shaped to broadcast over a ``[B, ...]`` tensor of ``ndim`` dims."""
    sigma = torch.as_tensor(sigma)
    if sigma.numel() == 1:
        return sigma.reshape(())
    return sigma.reshape(sigma.shape[:1] + (1,) * (ndim - 1))


# ---------------------------------------------------------------------------------------------
# Predictions (parameterisations)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Prediction:
    """Epsilon prediction (SD1.x, SD2-base, SDXL): x0 = x - sigma * eps, input x / sqrt(sigma^2 + sd^2).

    Subclasses override only what differs. ``kind`` names the parameterisation (used in keys and by
    samplers that branch on flow models through :meth:`ModelSampling.is_flow`)."""

    kind: str = field(default="eps", init=False)

    def calculate_input(self, sigma: torch.Tensor, x: torch.Tensor, sigma_data: float) -> torch.Tensor:
        s = reshape_sigma(sigma, x.ndim)
        return x / (s**2 + sigma_data**2) ** 0.5

    def calculate_denoised(
        self, sigma: torch.Tensor, model_output: torch.Tensor, model_input: torch.Tensor,
        sigma_data: float, timestep: torch.Tensor | None = None,
    ) -> torch.Tensor:
        s = reshape_sigma(sigma, model_output.ndim)
        return model_input - model_output * s

    def noise_scaling(
        self, sigma: torch.Tensor, noise: torch.Tensor, latent_image: torch.Tensor, max_denoise: bool = False
    ) -> torch.Tensor:
        s = reshape_sigma(sigma, noise.ndim)
        scaled = noise * torch.sqrt(1.0 + s**2.0) if max_denoise else noise * s
        return scaled + latent_image

    def inverse_noise_scaling(self, sigma: torch.Tensor, latent: torch.Tensor) -> torch.Tensor:
        return latent


@dataclass(frozen=True)
class VPrediction(Prediction):
    """v prediction (SD2-768): x0 = x * sd^2/(s^2+sd^2) - v * s * sd / sqrt(s^2+sd^2)."""

    kind: str = field(default="v_prediction", init=False)
    output_sign: ClassVar[float] = -1.0

    def calculate_denoised(
        self, sigma: torch.Tensor, model_output: torch.Tensor, model_input: torch.Tensor,
        sigma_data: float, timestep: torch.Tensor | None = None,
    ) -> torch.Tensor:
        s = reshape_sigma(sigma, model_output.ndim)
        denom = s**2 + sigma_data**2
        return model_input * sigma_data**2 / denom + self.output_sign * (model_output * s * sigma_data / denom**0.5)


@dataclass(frozen=True)
class EDMPrediction(VPrediction):
    """EDM preconditioning (Karras et al. 2022, eq. 7): the v formula with a plus sign on F."""

    kind: str = field(default="edm", init=False)
    output_sign: ClassVar[float] = 1.0


@dataclass(frozen=True)
class X0Prediction(Prediction):
    """The network predicts x0 directly (eps-style input scaling)."""

    kind: str = field(default="x0", init=False)

    def calculate_denoised(
        self, sigma: torch.Tensor, model_output: torch.Tensor, model_input: torch.Tensor,
        sigma_data: float, timestep: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return model_output


@dataclass(frozen=True)
class ImgToImgPrediction(X0Prediction):
    """x0 prediction on the unscaled input (image-to-image models such as Lotus)."""

    kind: str = field(default="img_to_img", init=False)

    def calculate_input(self, sigma: torch.Tensor, x: torch.Tensor, sigma_data: float) -> torch.Tensor:
        return x


@dataclass(frozen=True)
class LCMPrediction(Prediction):
    """Latent consistency models: eps prediction wrapped in the consistency boundary condition
    x0' = c_out * x0 + c_skip * x with sigma_data 0.5 and the timestep scaled by 10 (Luo et al. 2023)."""

    kind: str = field(default="lcm", init=False)

    def calculate_denoised(
        self, sigma: torch.Tensor, model_output: torch.Tensor, model_input: torch.Tensor,
        sigma_data: float, timestep: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if timestep is None:
            raise ModelSamplingError("LCM prediction needs the timestep of sigma to compute its boundary condition")
        s = reshape_sigma(sigma, model_output.ndim)
        t = reshape_sigma(timestep, model_output.ndim) * 10.0
        x0 = model_input - model_output * s
        lcm_sigma_data = 0.5
        c_skip = lcm_sigma_data**2 / (t**2 + lcm_sigma_data**2)
        c_out = t / (t**2 + lcm_sigma_data**2) ** 0.5
        return c_out * x0 + c_skip * model_input


@dataclass(frozen=True)
class FlowPrediction(Prediction):
    """Rectified flow ("CONST", SD3/Flux/AuraFlow): x_sigma = (1 - sigma) x0 + sigma * noise, the
    network predicts the velocity v = noise - x0, so x0 = x - sigma * v; the input is not scaled."""

    kind: str = field(default="const", init=False)
    noise_scale: float = 1.0

    def calculate_input(self, sigma: torch.Tensor, x: torch.Tensor, sigma_data: float) -> torch.Tensor:
        return x

    def noise_scaling(
        self, sigma: torch.Tensor, noise: torch.Tensor, latent_image: torch.Tensor, max_denoise: bool = False
    ) -> torch.Tensor:
        s = reshape_sigma(sigma, noise.ndim)
        return s * (self.noise_scale * noise) + (1.0 - s) * latent_image

    def inverse_noise_scaling(self, sigma: torch.Tensor, latent: torch.Tensor) -> torch.Tensor:
        s = reshape_sigma(sigma, latent.ndim)
        return latent / (1.0 - s)


PREDICTIONS: dict[str, type[Prediction]] = {
    "eps": Prediction,
    "v_prediction": VPrediction,
    "edm": EDMPrediction,
    "x0": X0Prediction,
    "img_to_img": ImgToImgPrediction,
    "lcm": LCMPrediction,
    "const": FlowPrediction,
}


# ---------------------------------------------------------------------------------------------
# Sigma schedules
# ---------------------------------------------------------------------------------------------


class SigmaSchedule(Protocol):
    """What a schedule provides: the training sigma table (ascending) and sigma <-> timestep maps."""

    @property
    def sigmas(self) -> torch.Tensor: ...

    def timestep(self, sigma: torch.Tensor) -> torch.Tensor: ...

    def sigma(self, timestep: torch.Tensor) -> torch.Tensor: ...

    def percent_to_sigma(self, percent: float) -> float: ...

    def describe(self) -> str: ...


def make_betas(schedule: str, timesteps: int, linear_start: float, linear_end: float,
               cosine_s: float = 8e-3) -> torch.Tensor:
    """Float64 betas of a latent-diffusion beta schedule. Names are ComfyUI's: its ``linear`` is
    linear in sqrt(beta) (diffusers calls that ``scaled_linear``, accepted as a synonym) and
    ``sqrt_linear`` is linear in beta (diffusers' ``linear``)."""
    if schedule in ("linear", "scaled_linear"):
        return torch.linspace(linear_start**0.5, linear_end**0.5, timesteps, dtype=torch.float64) ** 2
    if schedule == "cosine":
        steps = torch.arange(timesteps + 1, dtype=torch.float64) / timesteps + cosine_s
        alphas_bar = torch.cos(steps / (1 + cosine_s) * math.pi / 2).pow(2)
        alphas_bar = alphas_bar / alphas_bar[0]
        return torch.clamp(1 - alphas_bar[1:] / alphas_bar[:-1], min=0, max=0.999)
    if schedule == "squaredcos_cap_v2":
        def alpha_bar(t: float) -> float:
            return math.cos((t + 0.008) / 1.008 * math.pi / 2) ** 2
        values = [min(1 - alpha_bar((i + 1) / timesteps) / alpha_bar(i / timesteps), 0.999) for i in range(timesteps)]
        return torch.tensor(values, dtype=torch.float64)
    if schedule == "sqrt_linear":
        return torch.linspace(linear_start, linear_end, timesteps, dtype=torch.float64)
    if schedule == "sqrt":
        return torch.linspace(linear_start, linear_end, timesteps, dtype=torch.float64) ** 0.5
    raise ModelSamplingError(f"unknown beta schedule {schedule!r}; expected one of {', '.join(BETA_SCHEDULES)}")


def rescale_zero_terminal_snr(sigmas: torch.Tensor) -> torch.Tensor:
    """Rescale a sigma table so the last entry has (almost) zero SNR (Lin et al. 2023, algorithm 1),
    with ComfyUI's finite stand-in for the infinite last sigma."""
    sqrt_ab = (1 / (sigmas * sigmas + 1)).sqrt()
    first, last = sqrt_ab[0].clone(), sqrt_ab[-1].clone()
    sqrt_ab = (sqrt_ab - last) * (first / (first - last))
    alphas_bar = sqrt_ab**2
    alphas_bar[-1] = ZSNR_LAST_ALPHA_BAR
    return ((1 - alphas_bar) / alphas_bar) ** 0.5


def _interp_log_sigma(log_sigmas: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """exp of log sigma interpolated linearly at fractional table index ``t`` (clamped to the table)."""
    t = torch.clamp(t.float().to(log_sigmas.device), min=0, max=len(log_sigmas) - 1)
    low, high, w = t.floor().long(), t.ceil().long(), t.frac()
    return ((1 - w) * log_sigmas[low] + w * log_sigmas[high]).exp()


def _nearest_index(log_sigmas: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """Index of the table entry nearest to ``sigma`` in log space, shaped like ``sigma``."""
    sigma = torch.as_tensor(sigma)
    dists = sigma.log().to(log_sigmas.device) - log_sigmas[:, None]
    return dists.abs().argmin(dim=0).view(sigma.shape)


class _TableSchedule:
    """Shared by the table-based discrete schedules: ``_table`` is (sigmas, log sigmas), float32."""

    @property
    def _table(self) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    @property
    def sigmas(self) -> torch.Tensor:
        return self._table[0]

    @property
    def log_sigmas(self) -> torch.Tensor:
        return self._table[1]

    def sigma(self, timestep: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def percent_to_sigma(self, percent: float) -> float:
        """Sigma at timestep (1 - percent) * 999 (ComfyUI's rule, whatever the table length)."""
        if percent <= 0.0:
            return INFINITE_SIGMA
        if percent >= 1.0:
            return 0.0
        return float(self.sigma(torch.tensor((1.0 - percent) * 999.0)).item())


@dataclass(frozen=True)
class DiscreteSchedule(_TableSchedule):
    """The DDPM training schedule of ``timesteps`` steps; timestep(sigma) is an integer index."""

    beta_schedule: str = "linear"
    linear_start: float = 0.00085
    linear_end: float = 0.012
    timesteps: int = 1000
    zsnr: bool = False

    def __post_init__(self) -> None:
        if self.beta_schedule not in BETA_SCHEDULES:
            raise ModelSamplingError(
                f"unknown beta schedule {self.beta_schedule!r}; expected one of {', '.join(BETA_SCHEDULES)}")
        if self.timesteps < 2:
            raise ModelSamplingError(f"a discrete schedule needs at least 2 timesteps, got {self.timesteps}")

    @cached_property
    def _table(self) -> tuple[torch.Tensor, torch.Tensor]:
        betas = make_betas(self.beta_schedule, self.timesteps, self.linear_start, self.linear_end)
        alphas_bar = torch.cumprod(1.0 - betas, dim=0)
        sigmas = ((1 - alphas_bar) / alphas_bar) ** 0.5
        if self.zsnr:
            sigmas = rescale_zero_terminal_snr(sigmas)
        return sigmas.float(), sigmas.log().float()

    def timestep(self, sigma: torch.Tensor) -> torch.Tensor:
        sigma = torch.as_tensor(sigma)
        return _nearest_index(self.log_sigmas, sigma).to(sigma.device)

    def sigma(self, timestep: torch.Tensor) -> torch.Tensor:
        timestep = torch.as_tensor(timestep)
        return _interp_log_sigma(self.log_sigmas, timestep).to(timestep.device)

    def describe(self) -> str:
        return (f"discrete({self.beta_schedule},{self.linear_start!r},{self.linear_end!r},"
                f"{self.timesteps},zsnr={self.zsnr})")


@dataclass(frozen=True)
class DistilledSchedule(_TableSchedule):
    """LCM's distilled table: every ``timesteps // original_timesteps``-th training sigma, counted
    from the last; timesteps map back onto the original 0..timesteps-1 scale."""

    base: DiscreteSchedule = field(default_factory=DiscreteSchedule)
    original_timesteps: int = 50

    @property
    def skip_steps(self) -> int:
        return self.base.timesteps // self.original_timesteps

    @cached_property
    def _table(self) -> tuple[torch.Tensor, torch.Tensor]:
        full, n, skip = self.base.sigmas, self.base.timesteps, self.skip_steps
        picked = torch.stack([full[n - 1 - k * skip] for k in range(self.original_timesteps)]).flip(0)
        picked = picked.float()
        return picked, picked.log().float()

    def timestep(self, sigma: torch.Tensor) -> torch.Tensor:
        sigma = torch.as_tensor(sigma)
        index = _nearest_index(self.log_sigmas, sigma)
        return (index * self.skip_steps + (self.skip_steps - 1)).to(sigma.device)

    def sigma(self, timestep: torch.Tensor) -> torch.Tensor:
        timestep = torch.as_tensor(timestep)
        t = (timestep.float() - (self.skip_steps - 1)) / self.skip_steps
        return _interp_log_sigma(self.log_sigmas, t).to(timestep.device)

    def describe(self) -> str:
        return f"distilled({self.base.describe()},{self.original_timesteps})"


@dataclass(frozen=True)
class ContinuousEDMSchedule:
    """Continuous sigma in [sigma_min, sigma_max]; the network timestep is 0.25 * log(sigma).
    The 1000-entry log-uniform table exists for the schedulers that read one."""

    sigma_min_value: float = 0.002
    sigma_max_value: float = 120.0

    def __post_init__(self) -> None:
        if not 0 < self.sigma_min_value < self.sigma_max_value:
            raise ModelSamplingError(
                f"need 0 < sigma_min < sigma_max, got sigma_min={self.sigma_min_value}, sigma_max={self.sigma_max_value}")

    @cached_property
    def sigmas(self) -> torch.Tensor:
        return torch.linspace(math.log(self.sigma_min_value), math.log(self.sigma_max_value), 1000).exp()

    @property
    def log_sigmas(self) -> torch.Tensor:
        return self.sigmas.log()

    def timestep(self, sigma: torch.Tensor) -> torch.Tensor:
        return 0.25 * torch.as_tensor(sigma).log()

    def sigma(self, timestep: torch.Tensor) -> torch.Tensor:
        return (torch.as_tensor(timestep) / 0.25).exp()

    def percent_to_sigma(self, percent: float) -> float:
        if percent <= 0.0:
            return INFINITE_SIGMA
        if percent >= 1.0:
            return 0.0
        lo, hi = math.log(float(self.sigmas[0])), math.log(float(self.sigmas[-1]))
        return math.exp((hi - lo) * (1.0 - percent) + lo)

    def describe(self) -> str:
        return f"edm({self.sigma_min_value!r},{self.sigma_max_value!r})"


@dataclass(frozen=True)
class ContinuousVSchedule(ContinuousEDMSchedule):
    """Continuous sigma with the cosine-time timestep t = atan(sigma) * 2 / pi (continuous v models)."""

    def timestep(self, sigma: torch.Tensor) -> torch.Tensor:
        return torch.as_tensor(sigma).atan() / math.pi * 2

    def sigma(self, timestep: torch.Tensor) -> torch.Tensor:
        return (torch.as_tensor(timestep) * math.pi / 2).tan()

    def describe(self) -> str:
        return f"continuous_v({self.sigma_min_value!r},{self.sigma_max_value!r})"


def time_snr_shift(shift: float, t: torch.Tensor | float) -> torch.Tensor | float:
    """SD3's resolution shift of flow time: shift * t / (1 + (shift - 1) * t)."""
    if shift == 1.0:
        return t
    return shift * t / (1 + (shift - 1) * t)


def flux_time_shift(mu: float, sigma: float, t: torch.Tensor | float) -> torch.Tensor | float:
    """Flux's exponential time shift: e^mu / (e^mu + (1/t - 1)^sigma)."""
    return math.exp(mu) / (math.exp(mu) + (1 / t - 1) ** sigma)


@dataclass(frozen=True)
class FlowSchedule:
    """Discrete flow matching (SD3, AuraFlow): sigma = shift(t / multiplier), timestep = sigma * multiplier."""

    shift: float = 1.0
    multiplier: float = 1000.0
    timesteps: int = 1000

    @cached_property
    def sigmas(self) -> torch.Tensor:
        t = torch.arange(1, self.timesteps + 1, 1) / self.timesteps
        return torch.as_tensor(self.sigma(t * self.multiplier))

    def timestep(self, sigma: torch.Tensor) -> torch.Tensor:
        return torch.as_tensor(sigma) * self.multiplier

    def sigma(self, timestep: torch.Tensor) -> torch.Tensor:
        return torch.as_tensor(time_snr_shift(self.shift, torch.as_tensor(timestep) / self.multiplier))

    def percent_to_sigma(self, percent: float) -> float:
        if percent <= 0.0:
            return 1.0
        if percent >= 1.0:
            return 0.0
        return float(time_snr_shift(self.shift, 1.0 - percent))

    def describe(self) -> str:
        return f"flow(shift={self.shift!r},mult={self.multiplier!r},{self.timesteps})"


@dataclass(frozen=True)
class FluxSchedule:
    """Flux: sigma = flux_time_shift(shift, 1, t) on t in (0, 1]; the timestep is sigma itself."""

    shift: float = 1.15
    timesteps: int = 10000

    @cached_property
    def sigmas(self) -> torch.Tensor:
        t = torch.arange(1, self.timesteps + 1, 1) / self.timesteps
        return self.sigma(t)

    def timestep(self, sigma: torch.Tensor) -> torch.Tensor:
        return torch.as_tensor(sigma)

    def sigma(self, timestep: torch.Tensor) -> torch.Tensor:
        return torch.as_tensor(flux_time_shift(self.shift, 1.0, torch.as_tensor(timestep)))

    def percent_to_sigma(self, percent: float) -> float:
        if percent <= 0.0:
            return 1.0
        if percent >= 1.0:
            return 0.0
        return float(flux_time_shift(self.shift, 1.0, 1.0 - percent))

    def describe(self) -> str:
        return f"flux(shift={self.shift!r},{self.timesteps})"


# ---------------------------------------------------------------------------------------------
# The composition
# ---------------------------------------------------------------------------------------------


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

    def calculate_denoised(self, sigma: torch.Tensor, model_output: torch.Tensor,
                           model_input: torch.Tensor) -> torch.Tensor:
        timestep = self.timestep(sigma) if isinstance(self.prediction, LCMPrediction) else None
        return self.prediction.calculate_denoised(sigma, model_output, model_input, self.sigma_data, timestep)

    def noise_scaling(self, sigma: torch.Tensor, noise: torch.Tensor, latent_image: torch.Tensor,
                      max_denoise: bool = False) -> torch.Tensor:
        return self.prediction.noise_scaling(sigma, noise, latent_image, max_denoise)

    def inverse_noise_scaling(self, sigma: torch.Tensor, latent: torch.Tensor) -> torch.Tensor:
        return self.prediction.inverse_noise_scaling(sigma, latent)

    # -- identity --------------------------------------------------------------------------
    def describe(self) -> str:
        extra = f",noise_scale={self.prediction.noise_scale!r}" if isinstance(self.prediction, FlowPrediction) else ""
        return f"{self.prediction.kind}{extra}|{self.schedule.describe()}|sigma_data={self.sigma_data!r}"

    @property
    def key(self) -> str:
        return self.describe()


# ---------------------------------------------------------------------------------------------
# Constructors named after ComfyUI's classes and nodes
# ---------------------------------------------------------------------------------------------


def prediction_for(kind: str) -> Prediction:
    """The prediction object named ``kind`` (eps, v_prediction, edm, x0, img_to_img, lcm, const)."""
    if kind not in PREDICTIONS:
        raise ModelSamplingError(f"unknown prediction type {kind!r}; expected one of {', '.join(PREDICTIONS)}")
    return PREDICTIONS[kind]()


def discrete(kind: str = "eps", *, beta_schedule: str = "linear", linear_start: float = 0.00085,
             linear_end: float = 0.012, timesteps: int = 1000, zsnr: bool = False) -> ModelSampling:
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
    return discrete(kind, beta_schedule=schedule.beta_schedule, linear_start=schedule.linear_start,
                    linear_end=schedule.linear_end, timesteps=schedule.timesteps, zsnr=zsnr)


def continuous_edm(kind: str = "v_prediction", *, sigma_min: float = 0.002, sigma_max: float = 120.0,
                   sigma_data: float = 1.0) -> ModelSampling:
    """ModelSamplingContinuousEDM (prediction eps, v_prediction, edm, ...)."""
    return ModelSampling(prediction_for(kind), ContinuousEDMSchedule(sigma_min, sigma_max), sigma_data)


def continuous_v(kind: str = "v_prediction", *, sigma_min: float = 0.002, sigma_max: float = 120.0,
                 sigma_data: float = 1.0) -> ModelSampling:
    """ModelSamplingContinuousV."""
    return ModelSampling(prediction_for(kind), ContinuousVSchedule(sigma_min, sigma_max), sigma_data)


def flow(*, shift: float = 1.0, multiplier: float = 1000.0, timesteps: int = 1000,
         noise_scale: float = 1.0) -> ModelSampling:
    """ModelSamplingDiscreteFlow (SD3: shift 3, multiplier 1000; AuraFlow: shift 1.73, multiplier 1)."""
    return ModelSampling(FlowPrediction(noise_scale=noise_scale), FlowSchedule(shift, multiplier, timesteps))


def flux(*, shift: float = 1.15, timesteps: int = 10000) -> ModelSampling:
    """ModelSamplingFlux: flow prediction over Flux's exponential time shift (``shift`` is mu)."""
    return ModelSampling(FlowPrediction(), FluxSchedule(shift, timesteps))


def flux_mu(width: int, height: int, base_shift: float = 0.5, max_shift: float = 1.15) -> float:
    """The mu that ComfyUI's ModelSamplingFlux node derives from the image size (256 -> 4096 tokens)."""
    tokens = width * height / (8 * 8 * 2 * 2)
    slope = (max_shift - base_shift) / (4096 - 256)
    return tokens * slope + (base_shift - slope * 256)
