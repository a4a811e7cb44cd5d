"""Multistep samplers that reuse past model outputs: iPNDM, iPNDM-v, DEIS, RES multistep, gradient estimation.

- ``ipndm`` / ``ipndm_v``: improved pseudo-numerical methods (Zhang & Chen 2023, arXiv:2204.13902, as in
  zju-pi/diff-sampler): Adams–Bashforth on dx/dσ with fixed (iPNDM) or step-size-aware (iPNDM-v) weights.
- ``deis``: DEIS t-AB (Zhang & Chen 2023, arXiv:2204.13902), coefficients in :mod:`nodes.diffusion.k_deis`.
- ``res_multistep`` (+ ``_cfg_pp``, ``_ancestral``, ``_ancestral_cfg_pp``): the second-order multistep
  RES method (Zhang et al. 2023, arXiv:2308.02157) in t = −log σ.
- ``gradient_estimation`` (+ ``_cfg_pp``): Euler plus a (γ−1)·Δd correction (Permenter & Yuan 2024,
  "Interpreting and Improving Diffusion Models from an Optimization Perspective").

Behaviour and noise draw points follow ComfyUI's functions of the same names
(``comfy/k_diffusion/sampling.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from nodes.diffusion.k_deis import deis_coefficients
from nodes.diffusion.k_samplers import (
    StepCallback,
    as_args,
    batch_sigma,
    capture_uncond,
    get_ancestral_step,
    noisy_run,
    report,
    to_d,
)
from nodes.diffusion.noise import NoiseSampler

# Adams–Bashforth weights for orders 1–4 as (numerators, newest derivative first; denominator).
ADAMS_BASHFORTH = (
    ((1,), 1),
    ((3, -1), 2),
    ((23, -16, 5), 12),
    ((55, -59, 37, -9), 24),
)


def _ab_step(delta: Tensor, order: int, derivs: list[Tensor]) -> Tensor:
    """Δσ·Σ wₖ·dₖ for the fixed-step Adams–Bashforth rule of ``order`` (``derivs`` newest first)."""
    numerators, denominator = ADAMS_BASHFORTH[order - 1]
    total = numerators[0] * derivs[0]
    for n, d in zip(numerators[1:], derivs[1:], strict=True):
        total = total + n * d
    return delta * total if order == 1 else delta * total / denominator


StepRule = Callable[[int, Tensor, Tensor, Tensor, list[Tensor]], Tensor]
"""``rule(i, x, denoised, d, history) -> x_next`` with ``history`` the past derivatives, newest first."""


def _run_on_derivatives(
    model: Any,
    x: Tensor,
    sigmas: Tensor,
    extra_args: dict[str, Any] | None,
    callback: StepCallback | None,
    max_order: int,
    rule: StepRule,
) -> Tensor:
    """The loop the d-based multistep samplers share: one model call per step, d = (x − D)/σ kept."""
    args = as_args(extra_args)
    history: list[Tensor] = []
    for i in range(len(sigmas) - 1):
        denoised = model(x, batch_sigma(x, sigmas[i]), **args)
        report(callback, x, i, sigmas[i], denoised)
        d = (x - denoised) / sigmas[i]
        x = rule(i, x, denoised, d, history)
        history = [d, *history][: max(max_order - 1, 1)]
    return x


@torch.no_grad()
def sample_ipndm(
    model: Any,
    x: Tensor,
    sigmas: Tensor,
    extra_args: dict[str, Any] | None = None,
    callback: StepCallback | None = None,
    disable: bool | None = None,
    max_order: int = 4,
) -> Tensor:
    """iPNDM: Adams–Bashforth of order min(i+1, max_order) on d = (x − D)/σ; the last step to σ = 0 gives D."""

    def rule(i: int, x: Tensor, denoised: Tensor, d: Tensor, history: list[Tensor]) -> Tensor:
        if sigmas[i + 1] == 0:
            return denoised
        order = min(max_order, i + 1)
        return x + _ab_step(sigmas[i + 1] - sigmas[i], order, [d, *history[: order - 1]])

    return _run_on_derivatives(model, x, sigmas, extra_args, callback, max_order, rule)


def ipndm_v_weights(steps: Tensor, i: int, order: int) -> list[Tensor]:
    """Variable-step Adams–Bashforth weights of iPNDM-v for the step steps[i] → steps[i+1] (newest first)."""
    if order == 1:
        return [torch.ones_like(steps[i])]
    h0 = steps[i + 1] - steps[i]
    h1 = steps[i] - steps[i - 1]
    w1 = (2 + h0 / h1) / 2
    w2 = -(h0 / h1) / 2
    if order == 2:
        return [w1, w2]
    h2 = steps[i - 1] - steps[i - 2]
    k1 = (1 - h0 / (3 * (h0 + h1)) * (h0 * (h0 + h1)) / (h1 * (h1 + h2))) / 2
    if order == 3:
        return [w1 + k1, w2 - (1 + h1 / h2) * k1, k1 * h1 / h2]
    h3 = steps[i - 2] - steps[i - 3]
    k2 = (
        ((1 - h0 / (3 * (h0 + h1))) / 2 + (1 - h0 / (2 * (h0 + h1))) * h0 / (6 * (h0 + h1 + h2)))
        * (h0 * (h0 + h1) * (h0 + h1 + h2))
        / (h1 * (h1 + h2) * (h1 + h2 + h3))
    )
    ratio = h1 * (h1 + h2) / (h2 * (h2 + h3))
    return [
        w1 + k1 + k2,
        w2 - (1 + h1 / h2) * k1 - (1 + h1 / h2 + ratio) * k2,
        k1 * h1 / h2 + (h1 / h2 + ratio * (1 + h2 / h3)) * k2,
        -k2 * ratio * h1 / h2,
    ]


@torch.no_grad()
def sample_ipndm_v(
    model: Any,
    x: Tensor,
    sigmas: Tensor,
    extra_args: dict[str, Any] | None = None,
    callback: StepCallback | None = None,
    disable: bool | None = None,
    max_order: int = 4,
) -> Tensor:
    """iPNDM-v: like :func:`sample_ipndm` with weights that account for unequal σ steps."""

    def rule(i: int, x: Tensor, denoised: Tensor, d: Tensor, history: list[Tensor]) -> Tensor:
        if sigmas[i + 1] == 0:
            return denoised
        weights = ipndm_v_weights(sigmas, i, min(max_order, i + 1))
        step = weights[0] * d
        for w, past in zip(weights[1:], history, strict=False):
            step = step + w * past
        return x + (sigmas[i + 1] - sigmas[i]) * step

    return _run_on_derivatives(model, x, sigmas, extra_args, callback, max_order, rule)


@torch.no_grad()
def sample_deis(
    model: Any,
    x: Tensor,
    sigmas: Tensor,
    extra_args: dict[str, Any] | None = None,
    callback: StepCallback | None = None,
    disable: bool | None = None,
    max_order: int = 3,
    deis_mode: str = "tab",
) -> Tensor:
    """DEIS multistep: x' = x + Σⱼ Cᵢⱼ·d_{i−j} with exponential-integrator coefficients (Euler when σ' = 0)."""
    coefficients = deis_coefficients(sigmas, max_order, mode=deis_mode)

    def rule(i: int, x: Tensor, denoised: Tensor, d: Tensor, history: list[Tensor]) -> Tensor:
        if not coefficients[i]:  # first step, and the step to σ = 0
            return x + (sigmas[i + 1] - sigmas[i]) * d
        for c, past in zip(coefficients[i], [d, *history], strict=False):
            x = x + c * past
        return x

    return _run_on_derivatives(model, x, sigmas, extra_args, callback, max_order, rule)


@torch.no_grad()
def res_multistep(
    model: Any,
    x: Tensor,
    sigmas: Tensor,
    extra_args: dict[str, Any] | None = None,
    callback: StepCallback | None = None,
    disable: bool | None = None,
    s_noise: float = 1.0,
    noise_sampler: NoiseSampler | None = None,
    eta: float = 1.0,
    cfg_pp: bool = False,
) -> Tensor:
    """RES second-order multistep (arXiv:2308.02157) with optional ancestral noise and CFG++."""
    run = noisy_run(model, x, extra_args, noise_sampler, s_noise)
    args, noise, s_noise = run.args, run.noise, run.s_noise
    uncond = None
    if cfg_pp:
        args, uncond = capture_uncond(args)
    old_denoised: Tensor | None = None
    old_sigma_down: Tensor | None = None
    for i in range(len(sigmas) - 1):
        sigma, sigma_next = sigmas[i], sigmas[i + 1]
        denoised = model(x, batch_sigma(x, sigma), **args)
        sigma_down, sigma_up = get_ancestral_step(sigma, sigma_next, eta=eta)
        report(callback, x, i, sigma, denoised)
        direction = denoised if uncond is None else uncond.latest()
        if sigma_down == 0 or old_denoised is None or old_sigma_down is None:
            if uncond is not None:
                x = denoised + to_d(x, sigma, direction) * sigma_down
            else:
                x = x + to_d(x, sigma, denoised) * (sigma_down - sigma)
        else:
            t, t_next = sigma.log().neg(), sigma_down.log().neg()
            h = t_next - t
            c2 = (sigmas[i - 1].log().neg() - old_sigma_down.log().neg()) / h
            phi1 = torch.expm1(-h) / -h
            phi2 = (phi1 - 1.0) / -h
            b1 = torch.nan_to_num(phi1 - phi2 / c2, nan=0.0)
            b2 = torch.nan_to_num(phi2 / c2, nan=0.0)
            if uncond is not None:
                x = x + (denoised - direction)
            x = h.neg().exp() * x + h * (b1 * direction + b2 * old_denoised)
        if sigma_next > 0:
            x = x + noise(sigma, sigma_next) * s_noise * sigma_up
        old_denoised = direction
        old_sigma_down = sigma_down
    return x


def sample_res_multistep(
    model: Any,
    x: Tensor,
    sigmas: Tensor,
    extra_args: dict[str, Any] | None = None,
    callback: StepCallback | None = None,
    disable: bool | None = None,
    s_noise: float = 1.0,
    noise_sampler: NoiseSampler | None = None,
) -> Tensor:
    """Deterministic RES multistep (η = 0)."""
    return res_multistep(model, x, sigmas, extra_args, callback, disable, s_noise, noise_sampler, eta=0.0)


def sample_res_multistep_cfg_pp(
    model: Any,
    x: Tensor,
    sigmas: Tensor,
    extra_args: dict[str, Any] | None = None,
    callback: StepCallback | None = None,
    disable: bool | None = None,
    s_noise: float = 1.0,
    noise_sampler: NoiseSampler | None = None,
) -> Tensor:
    """Deterministic RES multistep with CFG++."""
    return res_multistep(
        model, x, sigmas, extra_args, callback, disable, s_noise, noise_sampler, eta=0.0, cfg_pp=True
    )


def sample_res_multistep_ancestral(
    model: Any,
    x: Tensor,
    sigmas: Tensor,
    extra_args: dict[str, Any] | None = None,
    callback: StepCallback | None = None,
    disable: bool | None = None,
    eta: float = 1.0,
    s_noise: float = 1.0,
    noise_sampler: NoiseSampler | None = None,
) -> Tensor:
    """Ancestral RES multistep (options ``eta``, ``s_noise``)."""
    return res_multistep(model, x, sigmas, extra_args, callback, disable, s_noise, noise_sampler, eta=eta)


def sample_res_multistep_ancestral_cfg_pp(
    model: Any,
    x: Tensor,
    sigmas: Tensor,
    extra_args: dict[str, Any] | None = None,
    callback: StepCallback | None = None,
    disable: bool | None = None,
    eta: float = 1.0,
    s_noise: float = 1.0,
    noise_sampler: NoiseSampler | None = None,
) -> Tensor:
    """Ancestral RES multistep with CFG++."""
    return res_multistep(
        model, x, sigmas, extra_args, callback, disable, s_noise, noise_sampler, eta=eta, cfg_pp=True
    )


@torch.no_grad()
def sample_gradient_estimation(
    model: Any,
    x: Tensor,
    sigmas: Tensor,
    extra_args: dict[str, Any] | None = None,
    callback: StepCallback | None = None,
    disable: bool | None = None,
    ge_gamma: float = 2.0,
    cfg_pp: bool = False,
) -> Tensor:
    """Euler steps plus (γ − 1)·(d − d_prev)·Δσ from the second step on; the last step to σ = 0 gives D."""
    args = as_args(extra_args)
    uncond = None
    if cfg_pp:
        args, uncond = capture_uncond(args)
    old_d: Tensor | None = None
    for i in range(len(sigmas) - 1):
        sigma, sigma_next = sigmas[i], sigmas[i + 1]
        denoised = model(x, batch_sigma(x, sigma), **args)
        d = to_d(x, sigma, denoised if uncond is None else uncond.latest())
        report(callback, x, i, sigma, denoised)
        dt = sigma_next - sigma
        if sigma_next == 0:
            x = denoised
        else:
            x = x + d * dt if uncond is None else denoised + d * sigma_next
            if old_d is not None:
                x = x + (ge_gamma - 1) * (d - old_d) * dt
        old_d = d
    return x


def sample_gradient_estimation_cfg_pp(
    model: Any,
    x: Tensor,
    sigmas: Tensor,
    extra_args: dict[str, Any] | None = None,
    callback: StepCallback | None = None,
    disable: bool | None = None,
    ge_gamma: float = 2.0,
) -> Tensor:
    """Gradient estimation with CFG++."""
    return sample_gradient_estimation(model, x, sigmas, extra_args, callback, disable, ge_gamma, cfg_pp=True)
