"""Euler-family samplers: euler, euler_ancestral, heun, heunpp2, lms, ddpm, lcm.

Each follows the package conventions (``nodes/diffusion/__init__.py``) and ComfyUI's behaviour,
including where it draws per-step noise: ancestral noise comes from ``default_noise_sampler``
(seed + 1 on CPU) and is drawn only on steps that add noise. Flow ("CONST") models get the
rectified-flow ancestral step (``euler_ancestral``), as in ComfyUI.
References: Karras et al. 2022 (arXiv:2206.00364, algorithm 2); k-diffusion ``sampling.py`` (MIT);
Heun++ from Carzit/sd-webui-samplers-scheduler (MIT); Ho et al. 2020 (DDPM); Luo et al. 2023 (LCM).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from scipy import integrate

from nodes.diffusion.k_samplers import (
    StepCallback,
    get_ancestral_step,
    is_flow,
    model_sampling_of,
    noise_sampler_for,
    report,
    step_range,
    to_d,
)
from nodes.diffusion.noise import NoiseSampler

INF = float("inf")


@dataclass
class ChurnedModel:
    """The first evaluation of a Karras-style step (euler, heun, heunpp2, dpm_2): optional stochastic
    churn raises sigma_i to sigma_hat = sigma_i (1 + gamma) by adding noise, then the model is
    evaluated at sigma_hat and the step is reported. ComfyUI draws churn noise from torch's global
    generator; Loom draws it from the seeded per-step generator so runs stay reproducible."""

    model: Any
    extra_args: dict[str, Any]
    callback: StepCallback | None
    s_churn: float = 0.0
    s_tmin: float = 0.0
    s_tmax: float = INF
    s_noise: float = 1.0
    noise: NoiseSampler | None = None

    def __call__(
        self, x: torch.Tensor, sigmas: torch.Tensor, i: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Returns (x after churn, sigma_hat, denoised, d = (x - denoised) / sigma_hat)."""
        sigma = sigma_hat = sigmas[i]
        if self.s_churn > 0:
            inside = self.s_tmin <= sigma <= self.s_tmax
            gamma = min(self.s_churn / (len(sigmas) - 1), 2**0.5 - 1) if inside else 0.0
            sigma_hat = sigma * (gamma + 1)
            if gamma > 0:
                if self.noise is None:
                    self.noise = noise_sampler_for(x, self.extra_args, None)
                eps = self.noise(sigma, sigma_hat) * self.s_noise
                x = x + eps * (sigma_hat**2 - sigma**2) ** 0.5
        denoised = self.model(x, sigma_hat * x.new_ones([x.shape[0]]), **self.extra_args)
        d = to_d(x, sigma_hat, denoised)
        report(self.callback, x, i, sigma, denoised, sigma_hat)
        return x, sigma_hat, denoised, d


@torch.no_grad()
def sample_euler(
    model: Any,
    x: torch.Tensor,
    sigmas: torch.Tensor,
    extra_args: dict[str, Any] | None = None,
    callback: StepCallback | None = None,
    disable: bool | None = None,
    s_churn: float = 0.0,
    s_tmin: float = 0.0,
    s_tmax: float = INF,
    s_noise: float = 1.0,
) -> torch.Tensor:
    """Euler steps on the probability-flow ODE (Karras et al. 2022, algorithm 2 without the Heun part)."""
    extra_args = {} if extra_args is None else extra_args
    evaluate = ChurnedModel(model, extra_args, callback, s_churn, s_tmin, s_tmax, s_noise)
    for i in step_range(len(sigmas) - 1, disable):
        x, sigma_hat, _, d = evaluate(x, sigmas, i)
        x = x + d * (sigmas[i + 1] - sigma_hat)
    return x


@torch.no_grad()
def sample_euler_ancestral(
    model: Any,
    x: torch.Tensor,
    sigmas: torch.Tensor,
    extra_args: dict[str, Any] | None = None,
    callback: StepCallback | None = None,
    disable: bool | None = None,
    eta: float = 1.0,
    s_noise: float = 1.0,
    noise_sampler: NoiseSampler | None = None,
) -> torch.Tensor:
    """Ancestral Euler: step down to sigma_down, then add fresh noise of std sigma_up."""
    if is_flow(model):
        return sample_euler_ancestral_rf(
            model, x, sigmas, extra_args, callback, disable, eta, s_noise, noise_sampler
        )
    extra_args = {} if extra_args is None else extra_args
    noise = noise_sampler_for(x, extra_args, noise_sampler)
    s_in = x.new_ones([x.shape[0]])
    for i in step_range(len(sigmas) - 1, disable):
        denoised = model(x, sigmas[i] * s_in, **extra_args)
        sigma_down, sigma_up = get_ancestral_step(sigmas[i], sigmas[i + 1], eta=eta)
        report(callback, x, i, sigmas[i], denoised)
        if sigma_down == 0:
            x = denoised
        else:
            d = to_d(x, sigmas[i], denoised)
            x = x + d * (sigma_down - sigmas[i]) + noise(sigmas[i], sigmas[i + 1]) * s_noise * sigma_up
    return x


def rf_ancestral_split(
    sigma: torch.Tensor, sigma_next: torch.Tensor, eta: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The rectified-flow ancestral step: (sigma_down, alpha ratio alpha_next / alpha_down, renoise std).
    Step deterministically to sigma_down, rescale by the alpha ratio, add noise of the renoise std."""
    sigma_down = sigma_next * (1 + (sigma_next / sigma - 1) * eta)
    alpha_next, alpha_down = 1 - sigma_next, 1 - sigma_down
    renoise = (sigma_next**2 - sigma_down**2 * alpha_next**2 / alpha_down**2) ** 0.5
    return sigma_down, alpha_next / alpha_down, renoise


@torch.no_grad()
def sample_euler_ancestral_rf(
    model: Any,
    x: torch.Tensor,
    sigmas: torch.Tensor,
    extra_args: dict[str, Any] | None = None,
    callback: StepCallback | None = None,
    disable: bool | None = None,
    eta: float = 1.0,
    s_noise: float = 1.0,
    noise_sampler: NoiseSampler | None = None,
) -> torch.Tensor:
    """Ancestral Euler for rectified-flow models (x_sigma = (1 - sigma) x0 + sigma noise)."""
    extra_args = {} if extra_args is None else extra_args
    noise = noise_sampler_for(x, extra_args, noise_sampler)
    s_in = x.new_ones([x.shape[0]])
    for i in step_range(len(sigmas) - 1, disable):
        denoised = model(x, sigmas[i] * s_in, **extra_args)
        report(callback, x, i, sigmas[i], denoised)
        if sigmas[i + 1] == 0:
            x = denoised
            continue
        sigma_down, alpha_ratio, renoise = rf_ancestral_split(sigmas[i], sigmas[i + 1], eta)
        ratio = sigma_down / sigmas[i]
        x = ratio * x + (1 - ratio) * denoised
        if eta > 0:
            x = alpha_ratio * x + noise(sigmas[i], sigmas[i + 1]) * s_noise * renoise
    return x


@torch.no_grad()
def sample_heun(
    model: Any,
    x: torch.Tensor,
    sigmas: torch.Tensor,
    extra_args: dict[str, Any] | None = None,
    callback: StepCallback | None = None,
    disable: bool | None = None,
    s_churn: float = 0.0,
    s_tmin: float = 0.0,
    s_tmax: float = INF,
    s_noise: float = 1.0,
) -> torch.Tensor:
    """Heun's second-order method (Karras et al. 2022, algorithm 2); Euler on the last step to 0."""
    extra_args = {} if extra_args is None else extra_args
    s_in = x.new_ones([x.shape[0]])
    evaluate = ChurnedModel(model, extra_args, callback, s_churn, s_tmin, s_tmax, s_noise)
    for i in step_range(len(sigmas) - 1, disable):
        x, sigma_hat, _, d = evaluate(x, sigmas, i)
        dt = sigmas[i + 1] - sigma_hat
        if sigmas[i + 1] == 0:
            x = x + d * dt
        else:
            x_2 = x + d * dt
            denoised_2 = model(x_2, sigmas[i + 1] * s_in, **extra_args)
            d_2 = to_d(x_2, sigmas[i + 1], denoised_2)
            x = x + (d + d_2) / 2 * dt
    return x


@torch.no_grad()
def sample_heunpp2(
    model: Any,
    x: torch.Tensor,
    sigmas: torch.Tensor,
    extra_args: dict[str, Any] | None = None,
    callback: StepCallback | None = None,
    disable: bool | None = None,
    s_churn: float = 0.0,
    s_tmin: float = 0.0,
    s_tmax: float = INF,
    s_noise: float = 1.0,
) -> torch.Tensor:
    """Heun++: a Heun step whose slope also looks one more step ahead, weights proportional to sigma."""
    extra_args = {} if extra_args is None else extra_args
    s_in = x.new_ones([x.shape[0]])
    s_end = sigmas[-1]
    evaluate = ChurnedModel(model, extra_args, callback, s_churn, s_tmin, s_tmax, s_noise)
    for i in step_range(len(sigmas) - 1, disable):
        x, sigma_hat, _, d = evaluate(x, sigmas, i)
        dt = sigmas[i + 1] - sigma_hat
        if sigmas[i + 1] == s_end:
            x = x + d * dt
            continue
        x_2 = x + d * dt
        denoised_2 = model(x_2, sigmas[i + 1] * s_in, **extra_args)
        d_2 = to_d(x_2, sigmas[i + 1], denoised_2)
        if sigmas[i + 2] == s_end:
            w2 = sigmas[i + 1] / (2 * sigmas[0])
            x = x + (d * (1 - w2) + d_2 * w2) * dt
            continue
        x_3 = x_2 + d_2 * (sigmas[i + 2] - sigmas[i + 1])
        denoised_3 = model(x_3, sigmas[i + 2] * s_in, **extra_args)
        d_3 = to_d(x_3, sigmas[i + 2], denoised_3)
        w = 3 * sigmas[0]
        w2, w3 = sigmas[i + 1] / w, sigmas[i + 2] / w
        x = x + ((1 - w2 - w3) * d + w2 * d_2 + w3 * d_3) * dt
    return x


def linear_multistep_coeff(order: int, t: Any, i: int, j: int) -> float:
    """Integral over [t_i, t_{i+1}] of the j-th Lagrange basis polynomial on t_i, ..., t_{i-order+1}."""
    if order - 1 > i:
        raise ValueError(f"order {order} is too high for step {i}")

    def basis(tau: float) -> float:
        prod = 1.0
        for k in range(order):
            if j != k:
                prod *= (tau - t[i - k]) / (t[i - j] - t[i - k])
        return prod

    return float(integrate.quad(basis, t[i], t[i + 1], epsrel=1e-4)[0])


@torch.no_grad()
def sample_lms(
    model: Any,
    x: torch.Tensor,
    sigmas: torch.Tensor,
    extra_args: dict[str, Any] | None = None,
    callback: StepCallback | None = None,
    disable: bool | None = None,
    order: int = 4,
) -> torch.Tensor:
    """Linear multistep (Adams-Bashforth in sigma) over the last ``order`` derivatives."""
    extra_args = {} if extra_args is None else extra_args
    s_in = x.new_ones([x.shape[0]])
    sigmas_np = sigmas.detach().cpu().numpy()
    ds: list[torch.Tensor] = []
    for i in step_range(len(sigmas) - 1, disable):
        denoised = model(x, sigmas[i] * s_in, **extra_args)
        ds.append(to_d(x, sigmas[i], denoised))
        if len(ds) > order:
            ds.pop(0)
        report(callback, x, i, sigmas[i], denoised)
        if sigmas[i + 1] == 0:
            x = denoised
            continue
        cur_order = min(i + 1, order)
        coeffs = [linear_multistep_coeff(cur_order, sigmas_np, i, j) for j in range(cur_order)]
        step: Any = 0
        for coeff, d in zip(coeffs, reversed(ds), strict=False):
            step = step + coeff * d
        x = x + step
    return x


def ddpm_step(
    x: torch.Tensor, sigma: torch.Tensor, sigma_prev: torch.Tensor, eps: torch.Tensor, noise: NoiseSampler
) -> torch.Tensor:
    """One DDPM posterior step in variance-preserving space (x is the VP latent at sigma)."""
    alpha_bar = 1 / (sigma * sigma + 1)
    alpha_bar_prev = 1 / (sigma_prev * sigma_prev + 1)
    alpha = alpha_bar / alpha_bar_prev
    mu = (1.0 / alpha).sqrt() * (x - (1 - alpha) * eps / (1 - alpha_bar).sqrt())
    if sigma_prev > 0:
        mu = mu + ((1 - alpha) * (1.0 - alpha_bar_prev) / (1.0 - alpha_bar)).sqrt() * noise(sigma, sigma_prev)
    return mu


@torch.no_grad()
def sample_ddpm(
    model: Any,
    x: torch.Tensor,
    sigmas: torch.Tensor,
    extra_args: dict[str, Any] | None = None,
    callback: StepCallback | None = None,
    disable: bool | None = None,
    noise_sampler: NoiseSampler | None = None,
) -> torch.Tensor:
    """Ancestral DDPM sampling (Ho et al. 2020): each step in VP space, then back to sigma space."""
    extra_args = {} if extra_args is None else extra_args
    noise = noise_sampler_for(x, extra_args, noise_sampler)
    s_in = x.new_ones([x.shape[0]])
    for i in step_range(len(sigmas) - 1, disable):
        denoised = model(x, sigmas[i] * s_in, **extra_args)
        report(callback, x, i, sigmas[i], denoised)
        eps = (x - denoised) / sigmas[i]
        x = ddpm_step(x / torch.sqrt(1.0 + sigmas[i] ** 2.0), sigmas[i], sigmas[i + 1], eps, noise)
        if sigmas[i + 1] != 0:
            x = x * torch.sqrt(1.0 + sigmas[i + 1] ** 2.0)
    return x


@torch.no_grad()
def sample_lcm(
    model: Any,
    x: torch.Tensor,
    sigmas: torch.Tensor,
    extra_args: dict[str, Any] | None = None,
    callback: StepCallback | None = None,
    disable: bool | None = None,
    noise_sampler: NoiseSampler | None = None,
) -> torch.Tensor:
    """Consistency sampling: jump to the denoised estimate, then re-noise it to the next sigma."""
    extra_args = {} if extra_args is None else extra_args
    noise = noise_sampler_for(x, extra_args, noise_sampler)
    sampling = model_sampling_of(model)
    s_in = x.new_ones([x.shape[0]])
    for i in step_range(len(sigmas) - 1, disable):
        denoised = model(x, sigmas[i] * s_in, **extra_args)
        report(callback, x, i, sigmas[i], denoised)
        x = denoised
        if sigmas[i + 1] > 0:
            x = sampling.noise_scaling(sigmas[i + 1], noise(sigmas[i], sigmas[i + 1]), x)
    return x
