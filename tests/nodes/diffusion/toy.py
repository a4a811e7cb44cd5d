"""A toy denoiser with a known answer: data x0 ~ N(0, s^2) elementwise, so E[x0 | x_sigma] is linear.

For eps-style models x_sigma = x0 + sigma * n and D(x, sigma) = x * s^2 / (s^2 + sigma^2); for flow
("const") models x_sigma = (1 - sigma) x0 + sigma * n and D = (1 - sigma) s^2 x / ((1 - sigma)^2 s^2 + sigma^2).
An exact ODE sampler therefore ends with samples of std s; ``calls`` counts model evaluations.
"""

from __future__ import annotations

from typing import Any

import torch

from nodes.diffusion.model_sampling import ModelSampling

DATA_STD = 0.5


class ToyDenoiser:
    """Sampler-facing model: ``model(x, sigma_batch, **extra_args) -> denoised`` with ``model_sampling``.
    It also accepts the guider call ``model(x, sigma, model_options=..., seed=...)``."""

    def __init__(self, model_sampling: ModelSampling, data_std: float = DATA_STD) -> None:
        self.model_sampling = model_sampling
        self.data_std = data_std
        self.calls = 0
        self.sigmas_seen: list[float] = []

    def __call__(self, x: torch.Tensor, sigma: torch.Tensor, **extra_args: Any) -> torch.Tensor:
        self.calls += 1
        self.sigmas_seen.append(float(sigma.reshape(-1)[0]))
        s2 = self.data_std**2
        sg = sigma.reshape(-1, *([1] * (x.ndim - 1)))
        if self.model_sampling.is_flow:
            a = 1 - sg
            return a * s2 * x / (a * a * s2 + sg * sg)
        return x * s2 / (s2 + sg * sg)


def start_noise(shape: tuple[int, ...] = (2, 4, 32, 32), seed: int = 0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))
