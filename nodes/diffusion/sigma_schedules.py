"""Sigma schedules: the training sigma table of a model and its sigma <-> timestep maps.

Discrete DDPM beta schedules (float64 betas, float32 table, zero-terminal-SNR rescale after Lin et
al. 2023), LCM's distilled 50-step table, continuous EDM and V, discrete flow with SD3's shift, and
Flux's exponential time shift, as ComfyUI's ``comfy/model_sampling.py`` defines them (read for
behaviour, written anew). Part of :mod:`nodes.diffusion.model_sampling`, which re-exports every name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Protocol

import torch

from nodes.diffusion.predictions import ModelSamplingError

INFINITE_SIGMA = 999999999.9  # ComfyUI's "no upper bound" for percent_to_sigma(<= 0)
ZSNR_LAST_ALPHA_BAR = 4.8973451890853435e-08  # the value ComfyUI puts at the last zero-SNR entry
BETA_SCHEDULES = ("linear", "scaled_linear", "cosine", "squaredcos_cap_v2", "sqrt_linear", "sqrt")


class SigmaSchedule(Protocol):
    """What a schedule provides: the training sigma table (ascending) and sigma <-> timestep maps."""

    @property
    def sigmas(self) -> torch.Tensor: ...

    def timestep(self, sigma: torch.Tensor) -> torch.Tensor: ...

    def sigma(self, timestep: torch.Tensor) -> torch.Tensor: ...

    def percent_to_sigma(self, percent: float) -> float: ...

    def describe(self) -> str: ...


def make_betas(
    schedule: str, timesteps: int, linear_start: float, linear_end: float, cosine_s: float = 8e-3
) -> torch.Tensor:
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

        values = [
            min(1 - alpha_bar((i + 1) / timesteps) / alpha_bar(i / timesteps), 0.999)
            for i in range(timesteps)
        ]
        return torch.tensor(values, dtype=torch.float64)
    if schedule == "sqrt_linear":
        return torch.linspace(linear_start, linear_end, timesteps, dtype=torch.float64)
    if schedule == "sqrt":
        return torch.linspace(linear_start, linear_end, timesteps, dtype=torch.float64) ** 0.5
    raise ModelSamplingError(
        f"unknown beta schedule {schedule!r}; expected one of {', '.join(BETA_SCHEDULES)}"
    )


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
                f"unknown beta schedule {self.beta_schedule!r}; expected one of {', '.join(BETA_SCHEDULES)}"
            )
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
        return (
            f"discrete({self.beta_schedule},{self.linear_start!r},{self.linear_end!r},"
            f"{self.timesteps},zsnr={self.zsnr})"
        )


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
                f"need 0 < sigma_min < sigma_max, got sigma_min={self.sigma_min_value}, sigma_max={self.sigma_max_value}"
            )

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


@dataclass(frozen=True)
class StableCascadeSchedule:
    """Stable Cascade's continuous cosine schedule on t in (0, 1] (Nichol & Dhariwal's alpha-bar,
    offset ``cosine_s``), its log-SNR moved by -2 log(shift), alpha-bar clamped to [1e-4, 0.9999];
    the network's timestep is t itself. A 10000-entry table exists for the schedulers that read one."""

    shift: float = 1.0
    cosine_s: float = 8e-3
    timesteps: int = 10000

    @property
    def _start_alpha_bar(self) -> torch.Tensor:
        s = torch.tensor(self.cosine_s)
        return torch.cos(s / (1 + s) * torch.pi * 0.5) ** 2

    @cached_property
    def sigmas(self) -> torch.Tensor:
        t = torch.arange(1, self.timesteps + 1, dtype=torch.float32) / self.timesteps
        return self.sigma(t).float()

    def sigma(self, timestep: torch.Tensor) -> torch.Tensor:
        s = torch.tensor(self.cosine_s)
        t = torch.as_tensor(timestep)
        alpha_bar = torch.cos((t + s) / (1 + s) * torch.pi * 0.5) ** 2 / self._start_alpha_bar
        if self.shift != 1.0:
            log_snr = (alpha_bar / (1 - alpha_bar)).log() + 2 * torch.log(1.0 / torch.tensor(self.shift))
            alpha_bar = log_snr.sigmoid()
        alpha_bar = alpha_bar.clamp(0.0001, 0.9999)
        return ((1 - alpha_bar) / alpha_bar) ** 0.5

    def timestep(self, sigma: torch.Tensor) -> torch.Tensor:
        sigma = torch.as_tensor(sigma)
        var = (1 / (sigma * sigma + 1)).clamp(0, 1.0)
        s, start = torch.tensor(self.cosine_s).to(var.device), self._start_alpha_bar.to(var.device)
        return ((var * start) ** 0.5).acos() / (torch.pi * 0.5) * (1 + s) - s

    def percent_to_sigma(self, percent: float) -> float:
        if percent <= 0.0:
            return INFINITE_SIGMA
        if percent >= 1.0:
            return 0.0
        return float(self.sigma(torch.tensor(1.0 - percent)))

    def describe(self) -> str:
        return f"stable_cascade(shift={self.shift!r},s={self.cosine_s!r},{self.timesteps})"
