"""SA-Solver: stochastic Adams predictor–corrector in data prediction (Xue et al. 2023, NeurIPS,
arXiv:2309.05019; reference code scxue/SA-Solver), as ComfyUI's ``sample_sa_solver`` /
``sample_sa_solver_pece`` run it (``comfy/k_diffusion/sampling.py``, ``comfy/k_diffusion/sa_solver.py``).

Between half-logSNR times λ_s → λ_t the SDE with stochasticity τ gives
x_t = (σ_t/σ_s)·e^(−τ²h)·x_s + Σᵢ bᵢ·D(λᵢ) + σ_t·√(1 − e^(−2τ²h))·ε, where the bᵢ integrate the Lagrange
basis through the last K model outputs against α_t·e^((1+τ²)(λ−λ_t)). The predictor uses K =
predictor_order past outputs; the corrector re-solves the same step with the new output included
(K = corrector_order). τ is η inside a σ window (by default between 20 % and 80 % of sampling) and 0
elsewhere.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from nodes.diffusion.k_samplers import (
    StepCallback,
    batch_sigma,
    noisy_run,
    offset_first_sigma_for_snr,
    report,
    sigma_to_half_log_snr,
)
from nodes.diffusion.noise import NoiseSampler

TauFunction = Callable[[Tensor | float], float]


def exponential_moments(lam_s: Tensor, lam_t: Tensor, order: int, tau: float) -> Tensor:
    """Jₚ = k·∫_{λ_s}^{λ_t} e^(k(λ−λ_t))·λᵖ dλ for p < order, with k = 1 + τ².

    Integration by parts gives Jₚ = Bₚ − (p/k)·J_{p−1} with Bₚ = λ_tᵖ − λ_sᵖ·e^(−k·h); unrolled,
    Jₚ = Σ_{j≤p} (−1)^(p−j)·(p!/j!)·k^(j−p)·Bⱼ. The weights are formed in log space as a lower-triangular
    matrix (the reference's arithmetic, so results agree to the last bit).
    """
    k = 1 + tau**2
    powers = torch.arange(order, dtype=lam_s.dtype, device=lam_s.device)
    boundary = lam_t**powers - lam_s**powers * (-k * (lam_t - lam_s)).exp()
    depth = powers.unsqueeze(1) - powers.unsqueeze(0)  # p − j
    log_factorial = (powers + 1).lgamma()
    log_weight = log_factorial.unsqueeze(1) - log_factorial.unsqueeze(0)
    if tau > 0:
        log_weight = log_weight - depth * math.log(k)
    sign = torch.where(depth % 2 == 0, 1.0, -1.0)
    return (log_weight.exp() * sign).tril() @ boundary


def _simple_order_2(
    sigma_next: Tensor, lambdas: Tensor, lam_s: Tensor, lam_t: Tensor, tau: float, corrector: bool
) -> Tensor:
    """The paper's simplified order-2 weights (Appendix D), for (older, newer) outputs."""
    k = 1 + tau**2
    h = lam_t - lam_s
    alpha_t = sigma_next * lam_t.exp()
    total = alpha_t * (-h * k).expm1().neg()
    if corrector:
        newer = alpha_t * (0.5 * k * h)
        return torch.stack([total - newer, newer])
    older = alpha_t * (0.5 * k * h**2) / (lambdas[-2] - lam_s)
    return torch.stack([older, total - older])


def adams_weights(
    sigma_next: Tensor,
    lambdas: Tensor,
    lam_s: Tensor,
    lam_t: Tensor,
    tau: float,
    simple_order_2: bool = False,
    corrector: bool = False,
) -> Tensor:
    """The bᵢ of one predictor or corrector step, one per entry of ``lambdas`` (oldest first)."""
    count = lambdas.shape[0]
    if simple_order_2 and count == 2:
        return _simple_order_2(sigma_next, lambdas, lam_s, lam_t, tau, corrector)
    moments = exponential_moments(lam_s, lam_t, count, tau)
    # Lagrange integrals: solve Vᵀ·w = J with V the Vandermonde matrix of the λ nodes.
    vandermonde_t = torch.vander(lambdas, count, increasing=True).T
    weights = torch.linalg.solve(vandermonde_t, moments)
    return sigma_next * lam_t.exp() * weights


def tau_interval(start_sigma: float, end_sigma: float, eta: float = 1.0) -> TauFunction:
    """τ(σ) = η for end_sigma ≤ σ ≤ start_sigma, else 0 (always 0 when η ≤ 0: the ODE)."""

    def tau(sigma: Tensor | float) -> float:
        if eta <= 0:
            return 0.0
        value = sigma.item() if isinstance(sigma, Tensor) else sigma
        return eta if start_sigma >= value >= end_sigma else 0.0

    return tau


def sa_solver_options(
    model_sampling: Any,
    eta: float = 1.0,
    sde_start_percent: float = 0.2,
    sde_end_percent: float = 0.8,
    s_noise: float = 1.0,
    predictor_order: int = 3,
    corrector_order: int = 4,
    use_pece: bool = False,
    simple_order_2: bool = False,
) -> dict[str, Any]:
    """The ``sa_solver`` keyword options for SamplerSASolver's widgets (ComfyUI's mapping)."""
    start = float(model_sampling.percent_to_sigma(sde_start_percent))
    end = float(model_sampling.percent_to_sigma(sde_end_percent))
    return {
        "tau_func": tau_interval(start, end, eta=eta),
        "s_noise": s_noise,
        "predictor_order": predictor_order,
        "corrector_order": corrector_order,
        "use_pece": use_pece,
        "simple_order_2": simple_order_2,
    }


def _combine(outputs: list[Tensor], weights: Tensor) -> Tensor:
    stacked = torch.stack(outputs, dim=1)  # (B, K, ...)
    return torch.tensordot(stacked, weights.to(stacked.device), dims=([1], [0]))  # (B, ...)


@torch.no_grad()
def sample_sa_solver(
    model: Any,
    x: Tensor,
    sigmas: Tensor,
    extra_args: dict[str, Any] | None = None,
    callback: StepCallback | None = None,
    disable: bool | None = False,
    tau_func: TauFunction | None = None,
    s_noise: float = 1.0,
    noise_sampler: NoiseSampler | None = None,
    predictor_order: int = 3,
    corrector_order: int = 4,
    use_pece: bool = False,
    simple_order_2: bool = False,
) -> Tensor:
    """SA-Solver (predictor order ≤ 3, corrector order ≤ 4 by default; PECE re-evaluates after correcting)."""
    if len(sigmas) <= 1:
        return x
    run = noisy_run(model, x, extra_args, noise_sampler, s_noise)
    args, noise_draw, sampling, s_noise = run.args, run.noise, run.sampling, run.s_noise
    sigmas = offset_first_sigma_for_snr(sigmas, sampling)
    lambdas = sigma_to_half_log_snr(sigmas, sampling)
    if tau_func is None:
        start, end = sampling.percent_to_sigma(0.2), sampling.percent_to_sigma(0.8)
        tau_func = tau_interval(float(start), float(end), eta=1.0)

    keep = max(predictor_order, corrector_order)
    x_pred = x
    h = sigmas.new_zeros(())
    tau = 0.0
    noise: Tensor | float = 0.0
    outputs: list[Tensor] = []
    lower_order_to_end = sigmas[-1].item() == 0
    steps = len(sigmas) - 1
    for i in range(steps):
        denoised = model(x_pred, batch_sigma(x, sigmas[i]), **args)
        report(callback, x_pred, i, sigmas[i], denoised)
        outputs = [*outputs, denoised][-keep:]

        p_order = min(predictor_order, len(outputs))
        no_corrector = i == 0 or (sigmas[i + 1] == 0 and not use_pece)
        c_order = 0 if no_corrector else min(corrector_order, len(outputs))
        if lower_order_to_end:
            p_order = min(p_order, steps - 1 - i)
            c_order = min(c_order, steps - i)

        if c_order == 0:
            x = x_pred
        else:
            weights = adams_weights(
                sigmas[i],
                lambdas[i - c_order + 1 : i + 1],
                lambdas[i - 1],
                lambdas[i],
                tau,
                simple_order_2,
                corrector=True,
            )
            x = sigmas[i] / sigmas[i - 1] * (-(tau**2) * h).exp() * x + _combine(outputs[-c_order:], weights)
            if tau > 0 and s_noise > 0:
                x = x + noise  # the predictor's noise, reused so predictor and corrector share a path
            if use_pece:
                denoised = model(x, batch_sigma(x, sigmas[i]), **args)
                outputs[-1] = denoised

        if sigmas[i + 1] == 0:
            x_pred = denoised
            continue
        tau = tau_func(sigmas[i + 1])
        weights = adams_weights(
            sigmas[i + 1],
            lambdas[i - p_order + 1 : i + 1],
            lambdas[i],
            lambdas[i + 1],
            tau,
            simple_order_2,
            corrector=False,
        )
        h = lambdas[i + 1] - lambdas[i]
        x_pred = sigmas[i + 1] / sigmas[i] * (-(tau**2) * h).exp() * x + _combine(outputs[-p_order:], weights)
        if tau > 0 and s_noise > 0:
            spread = (-2 * tau**2 * h).expm1().neg().sqrt()
            noise = noise_draw(sigmas[i], sigmas[i + 1]) * sigmas[i + 1] * spread * s_noise
            x_pred = x_pred + noise
    return x_pred


def sample_sa_solver_pece(
    model: Any,
    x: Tensor,
    sigmas: Tensor,
    extra_args: dict[str, Any] | None = None,
    callback: StepCallback | None = None,
    disable: bool | None = False,
    tau_func: TauFunction | None = None,
    s_noise: float = 1.0,
    noise_sampler: NoiseSampler | None = None,
    predictor_order: int = 3,
    corrector_order: int = 4,
    simple_order_2: bool = False,
) -> Tensor:
    """SA-Solver in PECE mode (predict, evaluate, correct, evaluate)."""
    return sample_sa_solver(
        model,
        x,
        sigmas,
        extra_args,
        callback,
        disable,
        tau_func,
        s_noise,
        noise_sampler,
        predictor_order,
        corrector_order,
        use_pece=True,
        simple_order_2=simple_order_2,
    )
