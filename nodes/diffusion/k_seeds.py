"""Stochastic exponential samplers in data prediction and half-logSNR time: SEEDS-2/3, exponential Heun,
ER-SDE.

- ``seeds_2`` / ``seeds_3``: SEEDS (Gonzalez et al. 2023, "Stochastic Explicit Exponential
  Derivative-free Solvers", arXiv:2305.14267), VP data-prediction form with 2 or 3 stages; noise is
  drawn per stage and carried across the stages so each step's total noise has the right variance.
- ``exp_heun_2_x0`` / ``exp_heun_2_x0_sde``: SEEDS-2 with r = 1 and the φ₂ combination, i.e. the
  exponential Heun method (deterministic, or with η-scaled noise).
- ``er_sde``: ER-SDE-Solver-3 (Cui et al. 2023, arXiv:2309.06169), VP form, with a configurable noise
  scaler (the "ER-SDE" default, or x^(η+1) for the reverse-time SDE / ODE variants).

They follow ComfyUI's ``sample_seeds_2``, ``sample_seeds_3``, ``sample_exp_heun_2_x0(_sde)`` and
``sample_er_sde`` (``comfy/k_diffusion/sampling.py``), including every noise draw, and work for
variance-exploding and flow model samplings.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from nodes.diffusion.k_common import (
    Callback,
    NoiseSampler,
    as_args,
    batch_sigma,
    half_log_snr_to_sigma,
    model_sampling_of,
    noise_sampler_for,
    noise_scale,
    offset_first_sigma_for_snr,
    report,
    sigma_to_half_log_snr,
)
from nodes.diffusion.k_samplers import ei_h_phi_1, ei_h_phi_2

SEEDS2_SOLVER_TYPES = ("phi_1", "phi_2")
ER_SDE_SOLVER_TYPES = ("ER-SDE", "Reverse-time SDE", "ODE")
_ER_SDE_INTEGRATION_POINTS = 200


def _carry_noise(noise: Tensor, factor: Tensor, fresh: Tensor) -> Tensor:
    """Decay the stage noise by e^factor and top it up with fresh noise to keep unit variance."""
    return noise * factor.exp() + factor.mul(2).expm1().neg().sqrt() * fresh


@torch.no_grad()
def sample_seeds_2(
    model: Any,
    x: Tensor,
    sigmas: Tensor,
    extra_args: dict[str, Any] | None = None,
    callback: Callback | None = None,
    disable: bool | None = None,
    eta: float = 1.0,
    s_noise: float = 1.0,
    noise_sampler: NoiseSampler | None = None,
    r: float = 0.5,
    solver_type: str = "phi_1",
) -> Tensor:
    """SEEDS-2. Options (SamplerSEEDS2): ``solver_type`` phi_1 | phi_2, ``eta``, ``s_noise``, ``r`` (stage 2 at λ + r·h)."""
    if solver_type not in SEEDS2_SOLVER_TYPES:
        raise ValueError(f"seeds_2 solver_type must be one of {SEEDS2_SOLVER_TYPES}, got {solver_type!r}")
    args = as_args(extra_args)
    noise = noise_sampler_for(x, args, noise_sampler)
    sampling = model_sampling_of(model)
    s_noise = s_noise * noise_scale(sampling)
    inject = eta > 0 and s_noise > 0
    sigmas = offset_first_sigma_for_snr(sigmas, sampling)
    for i in range(len(sigmas) - 1):
        sigma, sigma_next = sigmas[i], sigmas[i + 1]
        denoised = model(x, batch_sigma(x, sigma), **args)
        report(callback, x, i, sigma, denoised)
        if sigma_next == 0:
            x = denoised
            continue
        lam, lam_next = sigma_to_half_log_snr(sigma, sampling), sigma_to_half_log_snr(sigma_next, sampling)
        h = lam_next - lam
        h_eta = h * (eta + 1)
        lam_mid = torch.lerp(lam, lam_next, r)
        sigma_mid = half_log_snr_to_sigma(lam_mid, sampling)
        alpha_mid = sigma_mid * lam_mid.exp()
        alpha_next = sigma_next * lam_next.exp()

        x_mid = sigma_mid / sigma * (-r * h * eta).exp() * x - alpha_mid * ei_h_phi_1(-r * h_eta) * denoised
        if inject:
            stage_noise = (-2 * r * h * eta).expm1().neg().sqrt() * noise(sigma, sigma_mid)
            x_mid = x_mid + stage_noise * sigma_mid * s_noise
        denoised_mid = model(x_mid, batch_sigma(x, sigma_mid), **args)

        decay = sigma_next / sigma * (-h * eta).exp()
        if solver_type == "phi_1":
            x = decay * x - alpha_next * ei_h_phi_1(-h_eta) * torch.lerp(denoised, denoised_mid, 1 / (2 * r))
        else:
            b2 = ei_h_phi_2(-h_eta) / r
            b1 = ei_h_phi_1(-h_eta) - b2
            x = decay * x - alpha_next * (b1 * denoised + b2 * denoised_mid)
        if inject:
            stage_noise = _carry_noise(stage_noise, (r - 1) * h * eta, noise(sigma_mid, sigma_next))
            x = x + stage_noise * sigma_next * s_noise
    return x


def sample_exp_heun_2_x0(model: Any, x: Tensor, sigmas: Tensor, extra_args: dict[str, Any] | None = None,
                         callback: Callback | None = None, disable: bool | None = None,
                         solver_type: str = "phi_2") -> Tensor:
    """Deterministic exponential Heun (SEEDS-2 with r = 1, η = 0)."""
    return sample_seeds_2(model, x, sigmas, extra_args, callback, disable, eta=0.0, s_noise=0.0, r=1.0,
                          solver_type=solver_type)


def sample_exp_heun_2_x0_sde(model: Any, x: Tensor, sigmas: Tensor, extra_args: dict[str, Any] | None = None,
                             callback: Callback | None = None, disable: bool | None = None, eta: float = 1.0,
                             s_noise: float = 1.0, noise_sampler: NoiseSampler | None = None,
                             solver_type: str = "phi_2") -> Tensor:
    """Stochastic exponential Heun (SEEDS-2 with r = 1)."""
    return sample_seeds_2(model, x, sigmas, extra_args, callback, disable, eta=eta, s_noise=s_noise,
                          noise_sampler=noise_sampler, r=1.0, solver_type=solver_type)


@torch.no_grad()
def sample_seeds_3(
    model: Any,
    x: Tensor,
    sigmas: Tensor,
    extra_args: dict[str, Any] | None = None,
    callback: Callback | None = None,
    disable: bool | None = None,
    eta: float = 1.0,
    s_noise: float = 1.0,
    noise_sampler: NoiseSampler | None = None,
    r_1: float = 1.0 / 3,
    r_2: float = 2.0 / 3,
) -> Tensor:
    """SEEDS-3: stages at λ + r₁h and λ + r₂h, then the φ₂-weighted final combination."""
    args = as_args(extra_args)
    noise = noise_sampler_for(x, args, noise_sampler)
    sampling = model_sampling_of(model)
    s_noise = s_noise * noise_scale(sampling)
    inject = eta > 0 and s_noise > 0
    sigmas = offset_first_sigma_for_snr(sigmas, sampling)
    for i in range(len(sigmas) - 1):
        sigma, sigma_next = sigmas[i], sigmas[i + 1]
        denoised = model(x, batch_sigma(x, sigma), **args)
        report(callback, x, i, sigma, denoised)
        if sigma_next == 0:
            x = denoised
            continue
        lam, lam_next = sigma_to_half_log_snr(sigma, sampling), sigma_to_half_log_snr(sigma_next, sampling)
        h = lam_next - lam
        h_eta = h * (eta + 1)
        lam_1, lam_2 = torch.lerp(lam, lam_next, r_1), torch.lerp(lam, lam_next, r_2)
        sigma_1, sigma_2 = half_log_snr_to_sigma(lam_1, sampling), half_log_snr_to_sigma(lam_2, sampling)
        alpha_1, alpha_2 = sigma_1 * lam_1.exp(), sigma_2 * lam_2.exp()
        alpha_next = sigma_next * lam_next.exp()

        x_1 = sigma_1 / sigma * (-r_1 * h * eta).exp() * x - alpha_1 * ei_h_phi_1(-r_1 * h_eta) * denoised
        if inject:
            stage_noise = (-2 * r_1 * h * eta).expm1().neg().sqrt() * noise(sigma, sigma_1)
            x_1 = x_1 + stage_noise * sigma_1 * s_noise
        denoised_1 = model(x_1, batch_sigma(x, sigma_1), **args)

        a2 = r_2 / r_1 * ei_h_phi_2(-r_2 * h_eta)
        a1 = ei_h_phi_1(-r_2 * h_eta) - a2
        x_2 = sigma_2 / sigma * (-r_2 * h * eta).exp() * x - alpha_2 * (a1 * denoised + a2 * denoised_1)
        if inject:
            stage_noise = _carry_noise(stage_noise, (r_1 - r_2) * h * eta, noise(sigma_1, sigma_2))
            x_2 = x_2 + stage_noise * sigma_2 * s_noise
        denoised_2 = model(x_2, batch_sigma(x, sigma_2), **args)

        b3 = ei_h_phi_2(-h_eta) / r_2
        b1 = ei_h_phi_1(-h_eta) - b3
        x = sigma_next / sigma * (-h * eta).exp() * x - alpha_next * (b1 * denoised + b3 * denoised_2)
        if inject:
            stage_noise = _carry_noise(stage_noise, (r_2 - 1) * h * eta, noise(sigma_2, sigma_next))
            x = x + stage_noise * sigma_next * s_noise
    return x


def er_sde_default_noise_scaler(x: Tensor) -> Tensor:
    """The ER-SDE paper's default noise scaler x·(e^(x^0.3) + 10)."""
    return x * ((x**0.3).exp() + 10.0)


def er_sde_power_noise_scaler(eta: float) -> Callable[[Tensor], Tensor]:
    """x^(η+1): the reverse-time SDE's noise scaler (η = 0 gives the probability-flow ODE)."""

    def scaler(x: Tensor) -> Tensor:
        return x ** (eta + 1)

    return scaler


def er_sde_options(solver_type: str = "ER-SDE", max_stage: int = 3, eta: float = 1.0,
                   s_noise: float = 1.0) -> dict[str, Any]:
    """The ``er_sde`` keyword options for SamplerER_SDE's widgets (ComfyUI's mapping)."""
    if solver_type not in ER_SDE_SOLVER_TYPES:
        raise ValueError(f"er_sde solver_type must be one of {ER_SDE_SOLVER_TYPES}, got {solver_type!r}")
    if solver_type == "ODE" or (solver_type == "Reverse-time SDE" and eta == 0):
        eta, s_noise = 0.0, 0.0
    scaler = None if solver_type == "ER-SDE" else er_sde_power_noise_scaler(eta)
    return {"s_noise": s_noise, "noise_scaler": scaler, "max_stage": max_stage}


@torch.no_grad()
def sample_er_sde(
    model: Any,
    x: Tensor,
    sigmas: Tensor,
    extra_args: dict[str, Any] | None = None,
    callback: Callback | None = None,
    disable: bool | None = None,
    s_noise: float = 1.0,
    noise_sampler: NoiseSampler | None = None,
    noise_scaler: Callable[[Tensor], Tensor] | None = None,
    max_stage: int = 3,
) -> Tensor:
    """ER-SDE-Solver (VP, up to 3 stages) in er_λ = σ_vp/α = e^(−λ).

    Stages 2 and 3 add finite-difference corrections of D weighted by integrals of 1/noise_scaler, taken
    with a 200-point Riemann sum as the reference does.
    """
    args = as_args(extra_args)
    noise = noise_sampler_for(x, args, noise_sampler)
    sampling = model_sampling_of(model)
    s_noise = s_noise * noise_scale(sampling)
    scaler = er_sde_default_noise_scaler if noise_scaler is None else noise_scaler
    point_index = torch.arange(0, float(_ER_SDE_INTEGRATION_POINTS), dtype=torch.float32, device=x.device)
    sigmas = offset_first_sigma_for_snr(sigmas, sampling)
    er_lambdas = sigma_to_half_log_snr(sigmas, sampling).neg().exp()
    old_denoised: Tensor | None = None
    old_denoised_d: Tensor | None = None
    for i in range(len(sigmas) - 1):
        sigma, sigma_next = sigmas[i], sigmas[i + 1]
        denoised = model(x, batch_sigma(x, sigma), **args)
        report(callback, x, i, sigma, denoised)
        stages = min(max_stage, i + 1)
        if sigma_next == 0:
            x = denoised
        else:
            er_s, er_t = er_lambdas[i], er_lambdas[i + 1]
            alpha_s, alpha_t = sigma / er_s, sigma_next / er_t
            r = scaler(er_t) / scaler(er_s)
            x = alpha_t / alpha_s * r * x + alpha_t * (1 - r) * denoised
            if stages >= 2 and old_denoised is not None:
                dt = er_t - er_s
                step = -dt / _ER_SDE_INTEGRATION_POINTS
                positions = er_t + point_index * step
                scaled = scaler(positions)
                integral = torch.sum(1 / scaled) * step
                denoised_d = (denoised - old_denoised) / (er_s - er_lambdas[i - 1])
                x = x + alpha_t * (dt + integral * scaler(er_t)) * denoised_d
                if stages >= 3 and old_denoised_d is not None:
                    integral_u = torch.sum((positions - er_s) / scaled) * step
                    denoised_u = (denoised_d - old_denoised_d) / ((er_s - er_lambdas[i - 2]) / 2)
                    x = x + alpha_t * ((dt**2) / 2 + integral_u * scaler(er_t)) * denoised_u
                old_denoised_d = denoised_d
            if s_noise > 0:
                spread = (er_t**2 - er_s**2 * r**2).sqrt().nan_to_num(nan=0.0)
                x = x + alpha_t * noise(sigma, sigma_next) * s_noise * spread
        old_denoised = denoised
    return x
