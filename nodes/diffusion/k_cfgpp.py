"""CFG++ samplers: they step along the unconditional prediction and re-add the guided one.

CFG++ (Chung et al. 2024, "CFG++: Manifold-constrained Classifier Free Guidance", arXiv:2406.08070)
renoises with the unconditional ε instead of the guided one. Behaviour follows ComfyUI's
``sample_euler_ancestral_cfg_pp``, ``sample_euler_cfg_pp``, ``sample_dpmpp_2s_ancestral_cfg_pp`` (with its
flow-model variant) and ``sample_dpmpp_2m_cfg_pp`` (``comfy/k_diffusion/sampling.py``), including where the
per-step noise is drawn, so seeded runs give ComfyUI's latents. The unconditional prediction reaches the
sampler through a post-CFG function (:func:`nodes.diffusion.k_common.capture_uncond`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from nodes.diffusion.k_common import (
    Callback,
    NoiseSampler,
    as_args,
    batch_sigma,
    capture_uncond,
    get_ancestral_step,
    noisy_run,
    report,
    sigma_to_half_log_snr,
    to_d,
)


@torch.no_grad()
def sample_euler_ancestral_cfg_pp(
    model: Any,
    x: Tensor,
    sigmas: Tensor,
    extra_args: dict[str, Any] | None = None,
    callback: Callback | None = None,
    disable: bool | None = None,
    eta: float = 1.0,
    s_noise: float = 1.0,
    noise_sampler: NoiseSampler | None = None,
) -> Tensor:
    """Euler ancestral with CFG++: x ← α'·D + σ_down·ε_uncond (+ α'·σ_up·noise), in VP-normalised σ/α.

    Options (SamplerEulerAncestralCFGPP): ``eta`` (ancestral noise amount), ``s_noise`` (noise multiplier).
    """
    run = noisy_run(model, x, extra_args, noise_sampler, s_noise)
    args, noise, sampling, s_noise = run.args, run.noise, run.sampling, run.s_noise
    args, uncond = capture_uncond(args)
    for i in range(len(sigmas) - 1):
        sigma, sigma_next = sigmas[i], sigmas[i + 1]
        denoised = model(x, batch_sigma(x, sigma), **args)
        report(callback, x, i, sigma, denoised)
        if sigma_next == 0:
            x = denoised
            continue
        alpha = sigma * sigma_to_half_log_snr(sigma, sampling).exp()
        alpha_next = sigma_next * sigma_to_half_log_snr(sigma_next, sampling).exp()
        d = to_d(x, sigma, alpha * uncond.latest())  # the unconditional noise direction
        sigma_down, sigma_up = get_ancestral_step(sigma / alpha, sigma_next / alpha_next, eta=eta)
        x = alpha_next * denoised + alpha_next * sigma_down * d
        if eta > 0 and s_noise > 0:
            x = x + alpha_next * noise(sigma, sigma_next) * s_noise * sigma_up
    return x


@torch.no_grad()
def sample_euler_cfg_pp(
    model: Any,
    x: Tensor,
    sigmas: Tensor,
    extra_args: dict[str, Any] | None = None,
    callback: Callback | None = None,
    disable: bool | None = None,
) -> Tensor:
    """Deterministic Euler with CFG++ (the ancestral form with η = 0)."""
    return sample_euler_ancestral_cfg_pp(model, x, sigmas, extra_args, callback, disable, eta=0.0, s_noise=0.0)


@torch.no_grad()
def sample_dpmpp_2s_ancestral_cfg_pp(
    model: Any,
    x: Tensor,
    sigmas: Tensor,
    extra_args: dict[str, Any] | None = None,
    callback: Callback | None = None,
    disable: bool | None = None,
    eta: float = 1.0,
    s_noise: float = 1.0,
    noise_sampler: NoiseSampler | None = None,
) -> Tensor:
    """DPM-Solver++(2S) ancestral (Lu et al. 2022, arXiv:2211.01095) with CFG++.

    The midpoint model call only refreshes the unconditional prediction; the guidance vector of the
    step's first call (D − D_uncond) is added back at the end of the step (scaled by 1 − σ' for flow).
    """
    run = noisy_run(model, x, extra_args, noise_sampler, s_noise)
    args, noise, sampling, s_noise = run.args, run.noise, run.sampling, run.s_noise
    args, uncond = capture_uncond(args)
    step = _flow_2s_cfg_pp_step if sampling.is_flow else _ve_2s_cfg_pp_step
    for i in range(len(sigmas) - 1):
        sigma = sigmas[i]
        denoised = model(x, batch_sigma(x, sigma), **args)
        guidance = denoised - uncond.latest()
        report(callback, x, i, sigma, denoised)
        x = step(model, x, sigmas, i, args, uncond.latest, noise, eta, s_noise)
        x = x + guidance if not sampling.is_flow else x + (1 - sigmas[i + 1]) * guidance
    return x


def _ve_2s_cfg_pp_step(
    model: Any, x: Tensor, sigmas: Tensor, i: int, args: dict[str, Any], uncond: Any,
    noise: NoiseSampler, eta: float, s_noise: float,
) -> Tensor:
    sigma, sigma_next = sigmas[i], sigmas[i + 1]
    sigma_down, sigma_up = get_ancestral_step(sigma, sigma_next, eta=eta)
    if sigma_down == 0:
        x = x + to_d(x, sigma, uncond()) * (sigma_down - sigma)
    else:
        t, t_next = sigma.log().neg(), sigma_down.log().neg()
        h = t_next - t
        s = t + h / 2
        x_mid = (s.neg().exp() / t.neg().exp()) * x - (-h / 2).expm1() * uncond()
        model(x_mid, batch_sigma(x, s.neg().exp()), **args)  # refreshes the unconditional prediction
        x = (t_next.neg().exp() / t.neg().exp()) * x - (-h).expm1() * uncond()
    if sigma_next > 0:
        x = x + noise(sigma, sigma_next) * s_noise * sigma_up
    return x


def _flow_2s_cfg_pp_step(
    model: Any, x: Tensor, sigmas: Tensor, i: int, args: dict[str, Any], uncond: Any,
    noise: NoiseSampler, eta: float, s_noise: float,
) -> Tensor:
    sigma, sigma_next = sigmas[i], sigmas[i + 1]
    sigma_down = sigma_next * (1 + (sigma_next / sigma - 1) * eta)
    alpha_next, alpha_down = 1 - sigma_next, 1 - sigma_down
    renoise = (sigma_next**2 - sigma_down**2 * alpha_next**2 / alpha_down**2) ** 0.5
    if sigma_next == 0:
        x = x + to_d(x, sigma, uncond()) * (sigma_down - sigma)
    else:
        if sigma == 1.0:
            sigma_mid: Tensor | float = 0.9999
        else:
            lam, lam_down = ((1 - sigma) / sigma).log(), ((1 - sigma_down) / sigma_down).log()
            sigma_mid = ((lam + (lam_down - lam) / 2).exp() + 1) ** -1
        ratio_mid = sigma_mid / sigma
        x_mid = ratio_mid * x + (1 - ratio_mid) * uncond()
        model(x_mid, batch_sigma(x, torch.as_tensor(sigma_mid, dtype=sigmas.dtype)), **args)
        ratio_down = sigma_down / sigma
        x = ratio_down * x + (1 - ratio_down) * uncond()
    if sigma_next > 0 and eta > 0:
        x = (alpha_next / alpha_down) * x + noise(sigma, sigma_next) * s_noise * renoise
    return x


@torch.no_grad()
def sample_dpmpp_2m_cfg_pp(
    model: Any,
    x: Tensor,
    sigmas: Tensor,
    extra_args: dict[str, Any] | None = None,
    callback: Callback | None = None,
    disable: bool | None = None,
) -> Tensor:
    """DPM-Solver++(2M) with CFG++: the multistep correction uses D − D_uncond(previous step)."""
    args, uncond = capture_uncond(as_args(extra_args))
    old_uncond: Tensor | None = None
    for i in range(len(sigmas) - 1):
        sigma, sigma_next = sigmas[i], sigmas[i + 1]
        denoised = model(x, batch_sigma(x, sigma), **args)
        report(callback, x, i, sigma, denoised)
        h = sigma.log() - sigma_next.log()  # t' − t with t = −log σ
        decay = torch.exp(-h)
        mix = -decay * uncond.latest()
        if old_uncond is not None and sigma_next != 0:
            r = (sigmas[i - 1].log() - sigma.log()) / h
            mix = mix - torch.expm1(-h) * (1 / (2 * r)) * (denoised - old_uncond)
        x = denoised + mix + decay * x
        old_uncond = uncond.latest()
    return x
