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
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from nodes.diffusion.k_samplers import (
    NoisyRun,
    StepCallback,
    batch_sigma,
    ei_h_phi_1,
    ei_h_phi_2,
    half_log_snr_to_sigma,
    noisy_run,
    offset_first_sigma_for_snr,
    report,
    sigma_to_half_log_snr,
)
from nodes.diffusion.noise import NoiseSampler

SEEDS2_SOLVER_TYPES = ("phi_1", "phi_2")
ER_SDE_SOLVER_TYPES = ("ER-SDE", "Reverse-time SDE", "ODE")
_ER_SDE_INTEGRATION_POINTS = 200


@dataclass
class _SeedsStep:
    """One SEEDS step σ → σ' in half-logSNR time; stages sit at λ + r·h (r = 1 is σ' itself).

    The stage noise is carried from stage to stage (decayed by e^((r_prev − r)hη), topped up with fresh
    noise) so that each step injects noise of the variance the SDE prescribes.
    """

    run: NoisyRun
    eta: float
    sigma: Tensor
    sigma_next: Tensor
    lam: Tensor
    lam_next: Tensor
    stage_noise: Tensor | None = None

    @property
    def h(self) -> Tensor:
        return self.lam_next - self.lam

    @property
    def h_eta(self) -> Tensor:
        return self.h * (self.eta + 1)

    def point(self, r: float) -> tuple[Tensor, Tensor]:
        """(σ_r, α_r) at λ + r·h."""
        lam_r = torch.lerp(self.lam, self.lam_next, r)
        sigma_r = half_log_snr_to_sigma(lam_r, self.run.sampling)
        return sigma_r, sigma_r * lam_r.exp()

    def decay(self, sigma_r: Tensor, r: float) -> Tensor:
        return sigma_r / self.sigma * (-r * self.h * self.eta).exp()

    def add_noise(self, x_r: Tensor, sigma_from: Tensor, sigma_r: Tensor, r_from: float, r: float) -> Tensor:
        if not (self.eta > 0 and self.run.s_noise > 0):
            return x_r
        factor = (r_from - r) * self.h * self.eta
        fresh = factor.mul(2).expm1().neg().sqrt() * self.run.noise(sigma_from, sigma_r)
        self.stage_noise = fresh if self.stage_noise is None else self.stage_noise * factor.exp() + fresh
        return x_r + self.stage_noise * sigma_r * self.run.s_noise


def _seeds_loop(
    model: Any,
    x: Tensor,
    sigmas: Tensor,
    run: NoisyRun,
    eta: float,
    callback: StepCallback | None,
    step: Callable[[_SeedsStep, Tensor, Tensor], Tensor],
) -> Tensor:
    """The step loop SEEDS-2 and SEEDS-3 share; ``step(state, x, denoised)`` returns x at σ'."""
    sigmas = offset_first_sigma_for_snr(sigmas, run.sampling)
    for i in range(len(sigmas) - 1):
        sigma, sigma_next = sigmas[i], sigmas[i + 1]
        denoised = model(x, batch_sigma(x, sigma), **run.args)
        report(callback, x, i, sigma, denoised)
        if sigma_next == 0:
            x = denoised
            continue
        lam, lam_next = (
            sigma_to_half_log_snr(sigma, run.sampling),
            sigma_to_half_log_snr(sigma_next, run.sampling),
        )
        x = step(_SeedsStep(run, eta, sigma, sigma_next, lam, lam_next), x, denoised)
    return x


@torch.no_grad()
def sample_seeds_2(
    model: Any,
    x: Tensor,
    sigmas: Tensor,
    extra_args: dict[str, Any] | None = None,
    callback: StepCallback | None = None,
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
    run = noisy_run(model, x, extra_args, noise_sampler, s_noise)

    def step(state: _SeedsStep, x: Tensor, denoised: Tensor) -> Tensor:
        h_eta, sigma, sigma_next = state.h_eta, state.sigma, state.sigma_next
        sigma_mid, alpha_mid = state.point(r)
        x_mid = state.decay(sigma_mid, r) * x - alpha_mid * ei_h_phi_1(-r * h_eta) * denoised
        x_mid = state.add_noise(x_mid, sigma, sigma_mid, 0.0, r)
        denoised_mid = model(x_mid, batch_sigma(x, sigma_mid), **run.args)
        alpha_next = sigma_next * state.lam_next.exp()
        if solver_type == "phi_1":
            x = state.decay(sigma_next, 1.0) * x - alpha_next * ei_h_phi_1(-h_eta) * torch.lerp(
                denoised, denoised_mid, 1 / (2 * r)
            )
        else:
            b2 = ei_h_phi_2(-h_eta) / r
            b1 = ei_h_phi_1(-h_eta) - b2
            x = state.decay(sigma_next, 1.0) * x - alpha_next * (b1 * denoised + b2 * denoised_mid)
        return state.add_noise(x, sigma_mid, sigma_next, r, 1.0)

    return _seeds_loop(model, x, sigmas, run, eta, callback, step)


def sample_exp_heun_2_x0(
    model: Any,
    x: Tensor,
    sigmas: Tensor,
    extra_args: dict[str, Any] | None = None,
    callback: StepCallback | None = None,
    disable: bool | None = None,
    solver_type: str = "phi_2",
) -> Tensor:
    """Deterministic exponential Heun (SEEDS-2 with r = 1, η = 0)."""
    return sample_seeds_2(
        model, x, sigmas, extra_args, callback, disable, eta=0.0, s_noise=0.0, r=1.0, solver_type=solver_type
    )


def sample_exp_heun_2_x0_sde(
    model: Any,
    x: Tensor,
    sigmas: Tensor,
    extra_args: dict[str, Any] | None = None,
    callback: StepCallback | None = None,
    disable: bool | None = None,
    eta: float = 1.0,
    s_noise: float = 1.0,
    noise_sampler: NoiseSampler | None = None,
    solver_type: str = "phi_2",
) -> Tensor:
    """Stochastic exponential Heun (SEEDS-2 with r = 1)."""
    return sample_seeds_2(
        model,
        x,
        sigmas,
        extra_args,
        callback,
        disable,
        eta=eta,
        s_noise=s_noise,
        noise_sampler=noise_sampler,
        r=1.0,
        solver_type=solver_type,
    )


@torch.no_grad()
def sample_seeds_3(
    model: Any,
    x: Tensor,
    sigmas: Tensor,
    extra_args: dict[str, Any] | None = None,
    callback: StepCallback | None = None,
    disable: bool | None = None,
    eta: float = 1.0,
    s_noise: float = 1.0,
    noise_sampler: NoiseSampler | None = None,
    r_1: float = 1.0 / 3,
    r_2: float = 2.0 / 3,
) -> Tensor:
    """SEEDS-3: stages at λ + r₁h and λ + r₂h, then the φ₂-weighted final combination."""
    run = noisy_run(model, x, extra_args, noise_sampler, s_noise)

    def step(state: _SeedsStep, x: Tensor, denoised: Tensor) -> Tensor:
        h_eta, sigma, sigma_next = state.h_eta, state.sigma, state.sigma_next
        sigma_1, alpha_1 = state.point(r_1)
        sigma_2, alpha_2 = state.point(r_2)
        x_1 = state.decay(sigma_1, r_1) * x - alpha_1 * ei_h_phi_1(-r_1 * h_eta) * denoised
        x_1 = state.add_noise(x_1, sigma, sigma_1, 0.0, r_1)
        denoised_1 = model(x_1, batch_sigma(x, sigma_1), **run.args)

        a2 = r_2 / r_1 * ei_h_phi_2(-r_2 * h_eta)
        a1 = ei_h_phi_1(-r_2 * h_eta) - a2
        x_2 = state.decay(sigma_2, r_2) * x - alpha_2 * (a1 * denoised + a2 * denoised_1)
        x_2 = state.add_noise(x_2, sigma_1, sigma_2, r_1, r_2)
        denoised_2 = model(x_2, batch_sigma(x, sigma_2), **run.args)

        b3 = ei_h_phi_2(-h_eta) / r_2
        b1 = ei_h_phi_1(-h_eta) - b3
        alpha_next = sigma_next * state.lam_next.exp()
        x = state.decay(sigma_next, 1.0) * x - alpha_next * (b1 * denoised + b3 * denoised_2)
        return state.add_noise(x, sigma_2, sigma_next, r_2, 1.0)

    return _seeds_loop(model, x, sigmas, run, eta, callback, step)


def er_sde_default_noise_scaler(x: Tensor) -> Tensor:
    """The ER-SDE paper's default noise scaler x·(e^(x^0.3) + 10)."""
    return x * ((x**0.3).exp() + 10.0)


def er_sde_power_noise_scaler(eta: float) -> Callable[[Tensor], Tensor]:
    """x^(η+1): the reverse-time SDE's noise scaler (η = 0 gives the probability-flow ODE)."""

    def scaler(x: Tensor) -> Tensor:
        return x ** (eta + 1)

    return scaler


def er_sde_options(
    solver_type: str = "ER-SDE", max_stage: int = 3, eta: float = 1.0, s_noise: float = 1.0
) -> dict[str, Any]:
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
    callback: StepCallback | None = None,
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
    run = noisy_run(model, x, extra_args, noise_sampler, s_noise)
    args, noise, sampling, s_noise = run.args, run.noise, run.sampling, run.s_noise
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
