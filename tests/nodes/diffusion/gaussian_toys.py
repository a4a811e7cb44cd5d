"""Analytic denoisers for the tests of the samplers beyond the Euler / DPM families (no weights).

Data x0 ~ N(0, s²) per element. With x_σ = α(σ)·x0 + σ·ε (α = 1 for eps/VE sampling, 1 − σ for flow),
the exact denoiser is D(x, σ) = α·s²/(α²s² + σ²)·x and the probability-flow ODE maps x(σ_a) to
x(σ_a)·std(σ_b)/std(σ_a) with std(σ) = √(α²s² + σ²): closed forms to converge to.

:class:`GuidedToy` imitates a guider: two such denoisers (cond with scale ``s_cond``, uncond with
``s_uncond``), D = D_u + cfg·(D_c − D_u), then ComfyUI's post-CFG functions from the model options.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from nodes.diffusion import model_sampling as ms

EPS = ms.discrete("eps")  # SD1.5's table: sigma 0.0292 .. 14.6146
FLOW = ms.flow(shift=3.0)  # SD3-style flow sampling


def alpha(sampling: ms.ModelSampling, sigma: torch.Tensor | float) -> torch.Tensor | float:
    return 1 - sigma if sampling.is_flow else 1.0


def data_std_at(sampling: ms.ModelSampling, sigma: float, scale: float) -> float:
    a = float(alpha(sampling, sigma))
    return math.sqrt(a * a * scale * scale + sigma * sigma)


def exact_ode(
    sampling: ms.ModelSampling, x_start: torch.Tensor, sigma_start: float, sigma_end: float, scale: float
) -> torch.Tensor:
    """The probability-flow ODE's solution from σ_start to σ_end for N(0, scale²) data."""
    return x_start * (data_std_at(sampling, sigma_end, scale) / data_std_at(sampling, sigma_start, scale))


def gaussian_denoised(
    sampling: ms.ModelSampling, x: torch.Tensor, sigma: torch.Tensor, scale: float
) -> torch.Tensor:
    sigma = sigma.view(-1, *([1] * (x.ndim - 1)))
    a = alpha(sampling, sigma)
    return x * (a * scale**2 / (a * a * scale**2 + sigma**2))


@dataclass
class GaussianToy:
    """``model(x, sigma, **extra_args) -> D``: the exact denoiser of N(0, scale²) data."""

    model_sampling: ms.ModelSampling
    scale: float = 0.5
    calls: int = 0

    def __call__(self, x: torch.Tensor, sigma: torch.Tensor, **extra_args: Any) -> torch.Tensor:
        self.calls += 1
        return gaussian_denoised(self.model_sampling, x, sigma, self.scale)


@dataclass
class GuidedToy:
    """A guider-like model: CFG over two Gaussian denoisers, then the post-CFG functions."""

    model_sampling: ms.ModelSampling
    cfg: float = 2.0
    s_cond: float = 0.8
    s_uncond: float = 0.4
    seen_options: list[dict[str, Any]] = field(default_factory=list)

    def __call__(self, x: torch.Tensor, sigma: torch.Tensor, **extra_args: Any) -> torch.Tensor:
        options = extra_args.get("model_options", {})
        self.seen_options.append(options)
        cond = gaussian_denoised(self.model_sampling, x, sigma, self.s_cond)
        uncond = gaussian_denoised(self.model_sampling, x, sigma, self.s_uncond)
        denoised = uncond + (cond - uncond) * self.cfg
        for fn in options.get("sampler_post_cfg_function", []):
            denoised = fn(
                {
                    "denoised": denoised,
                    "cond_denoised": cond,
                    "uncond_denoised": uncond,
                    "sigma": sigma,
                    "input": x,
                    "cond_scale": self.cfg,
                    "model_options": options,
                }
            )
        return denoised


@dataclass
class CountingNoise:
    """A noise sampler that records every (σ, σ') it is asked for (a seeded N(0, 1) draw each time)."""

    shape: tuple[int, ...]
    seed: int = 0
    calls: list[tuple[float, float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.generator = torch.Generator().manual_seed(self.seed)

    def __call__(self, sigma: torch.Tensor, sigma_next: torch.Tensor) -> torch.Tensor:
        self.calls.append((float(sigma), float(sigma_next)))
        return torch.randn(self.shape, generator=self.generator)


def karras(
    n: int, sigma_min: float = 0.0291675, sigma_max: float = 14.614642, rho: float = 7.0
) -> torch.Tensor:
    """Karras sigmas (n values, then 0), float32."""
    ramp = torch.linspace(0, 1, n)
    lo, hi = sigma_min ** (1 / rho), sigma_max ** (1 / rho)
    return torch.cat([(hi + ramp * (lo - hi)) ** rho, torch.zeros(1)])


def exponential(n: int, sigma_min: float = 0.0291675, sigma_max: float = 14.614642) -> torch.Tensor:
    """n log-uniform sigmas from sigma_max to sigma_min (no trailing 0), float32."""
    return torch.linspace(math.log(sigma_max), math.log(sigma_min), n).exp()


def flow_sigmas(n: int, last: float = 0.0) -> torch.Tensor:
    """SD3-style shifted flow sigmas: n values from 1 down, then ``last``."""
    t = torch.linspace(1, 0, n + 1)[:-1]
    shifted = 3.0 * t / (1 + 2.0 * t)
    return torch.cat([shifted, torch.full((1,), last)])


def start_noise(
    sampling: ms.ModelSampling,
    sigma0: float,
    shape: tuple[int, ...] = (2, 4, 32, 32),
    seed: int = 7,
    scale: float = 0.5,
) -> torch.Tensor:
    """x at σ₀ distributed as the toy's marginal: std(σ₀)·N(0, 1)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g) * data_std_at(sampling, sigma0, scale)
