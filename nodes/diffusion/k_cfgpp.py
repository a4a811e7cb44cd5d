"""CFG++ samplers: they step along the unconditional prediction and re-add the guided one.

CFG++ (Chung et al. 2024, "CFG++: Manifold-constrained Classifier Free Guidance", arXiv:2406.08070)
renoises with the unconditional ε instead of the guided one. Behaviour follows ComfyUI's
``sample_euler_ancestral_cfg_pp``, ``sample_euler_cfg_pp``, ``sample_dpmpp_2s_ancestral_cfg_pp`` and
``sample_dpmpp_2m_cfg_pp`` (``comfy/k_diffusion/sampling.py`` at 618b803d), including where the per-step
noise is drawn, so seeded runs give ComfyUI's latents. The unconditional prediction reaches the
sampler through a post-CFG function (:func:`nodes.diffusion.k_samplers.capture_uncond`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from nodes.diffusion.k_samplers import (
    StepCallback,
    as_args,
    batch_sigma,
    capture_uncond,
    get_ancestral_step,
    noisy_run,
    report,
    sigma_to_half_log_snr,
    to_d,
)
from nodes.diffusion.noise import NoiseSampler


@torch.no_grad()
def sample_euler_ancestral_cfg_pp(
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
    callback: StepCallback | None = None,
    disable: bool | None = None,
) -> Tensor:
    """Deterministic Euler with CFG++ (the ancestral form with η = 0)."""
    return sample_euler_ancestral_cfg_pp(
        model, x, sigmas, extra_args, callback, disable, eta=0.0, s_noise=0.0
    )


@torch.no_grad()
def sample_dpmpp_2s_ancestral_cfg_pp(
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
    """DPM-Solver++(2S) ancestral (Lu et al. 2022, arXiv:2211.01095) with CFG++, as ComfyUI 618b803d runs it.

    Both half steps start from x + (D − D_uncond) and move along D; the final half step reads the
    unconditional prediction the post-CFG hook holds after the midpoint call (ComfyUI's behaviour at that
    version, later reworked upstream). The same update serves flow models (no flow-specific branch there).
    """
    run = noisy_run(model, x, extra_args, noise_sampler, s_noise)
    args, noise, s_noise = run.args, run.noise, run.s_noise
    args, uncond = capture_uncond(args)
    for i in range(len(sigmas) - 1):
        sigma, sigma_next = sigmas[i], sigmas[i + 1]
        denoised = model(x, batch_sigma(x, sigma), **args)
        sigma_down, sigma_up = get_ancestral_step(sigma, sigma_next, eta=eta)
        report(callback, x, i, sigma, denoised)
        if sigma_down == 0:
            x = denoised + to_d(x, sigma, uncond.latest()) * sigma_down
        else:
            t, t_next = sigma.log().neg(), sigma_down.log().neg()  # t = −log σ
            h = t_next - t
            t_mid = t + h / 2
            x_mid = (t_mid.neg().exp() / t.neg().exp()) * (x + (denoised - uncond.latest())) - (
                -h / 2
            ).expm1() * denoised
            denoised_mid = model(x_mid, batch_sigma(x, t_mid.neg().exp()), **args)
            x = (t_next.neg().exp() / t.neg().exp()) * (x + (denoised - uncond.latest())) - (
                -h
            ).expm1() * denoised_mid
        if sigma_next > 0:
            x = x + noise(sigma, sigma_next) * s_noise * sigma_up
    return x


@torch.no_grad()
def sample_dpmpp_2m_cfg_pp(
    model: Any,
    x: Tensor,
    sigmas: Tensor,
    extra_args: dict[str, Any] | None = None,
    callback: StepCallback | None = None,
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
