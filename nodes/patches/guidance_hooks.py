"""The sampling hooks behind the guidance patches of :mod:`nodes.patches.guidance`: one factory per node,
returning the :class:`~nodes.core.sampling_hooks.SamplingHooks` that the patch installs for a sampling run.

Formulas follow ComfyUI's ``comfy_extras`` nodes (``nodes_model_advanced`` RescaleCFG, ``nodes_cfg``
CFGZeroStar/CFGNorm, ``nodes_apg``, ``nodes_tcfg``, ``nodes_perpneg``, ``nodes_mahiro``,
``nodes_fresca``, ``nodes_eps``, ``nodes_differential_diffusion``) and the papers they cite:
Lin et al. 2023 (RescaleCFG), Fan et al. 2025 (CFG-Zero*), Sadat et al. 2024 (APG),
arXiv:2503.18137 (TCFG), Armandpour et al. 2023 (Perp-Neg), Huang et al. 2025 (FreSca),
Ning et al. 2023 (epsilon scaling), arXiv:2510.01184 (temporal score rescaling), Levin & Fried
2024 (differential diffusion).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from nodes.core.sampling_hooks import SamplingHooks
from nodes.sample.guiders import perp_neg

Args = dict[str, Any]


def _sigma_view(sigma: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return sigma.view(sigma.shape[:1] + (1,) * (like.ndim - 1))


def rescale_cfg(multiplier: float) -> SamplingHooks:
    def cfg(args: Args) -> torch.Tensor:
        x_orig, scale = args["input"], args["cond_scale"]
        sigma = _sigma_view(args["sigma"], args["cond"])
        x = x_orig / (sigma * sigma + 1.0)  # in v-space, as the method is defined
        cond = ((x - (x_orig - args["cond"])) * (sigma**2 + 1.0) ** 0.5) / sigma
        uncond = ((x - (x_orig - args["uncond"])) * (sigma**2 + 1.0) ** 0.5) / sigma
        x_cfg = uncond + scale * (cond - uncond)
        ro_pos = torch.std(cond, dim=(1, 2, 3), keepdim=True)
        ro_cfg = torch.std(x_cfg, dim=(1, 2, 3), keepdim=True)
        x_final = multiplier * x_cfg * (ro_pos / ro_cfg) + (1.0 - multiplier) * x_cfg
        return x_orig - (x - x_final * sigma / (sigma * sigma + 1.0) ** 0.5)

    return SamplingHooks(cfg_function=cfg)


def cfg_zero_star() -> SamplingHooks:
    def post(args: Args) -> torch.Tensor:
        x, cond, uncond = args["input"], args["cond_denoised"], args["uncond_denoised"]
        pos, neg = (x - cond).flatten(1), (x - uncond).flatten(1)
        alpha = (pos * neg).sum(dim=1, keepdim=True) / ((neg**2).sum(dim=1, keepdim=True) + 1e-8)
        alpha = alpha.reshape([cond.shape[0]] + [1] * (cond.ndim - 1))
        return args["denoised"] + uncond * (alpha - 1.0) + args["cond_scale"] * uncond * (1.0 - alpha)

    return SamplingHooks(post_cfg=(post,))


def cfg_norm(strength: float) -> SamplingHooks:
    def post(args: Args) -> torch.Tensor:
        result = args["denoised"]
        scale = (
            torch.norm(args["cond_denoised"], dim=1, keepdim=True)
            / (torch.norm(result, dim=1, keepdim=True) + 1e-8)
        ).clamp(0.0, 1.0)
        return result * scale * strength

    return SamplingHooks(post_cfg=(post,))


def apg(eta: float, norm_threshold: float, momentum: float) -> SamplingHooks:
    state: dict[str, Any] = {"avg": None, "sigma": None}  # per run: sampling_hooks is called per run

    def pre(args: Args) -> list[Any]:
        out = args["conds_out"]
        if len(out) == 1:
            return out
        cond, uncond, sigma = out[0], out[1], args["sigma"][0]
        if state["sigma"] is not None and sigma > state["sigma"]:
            state["avg"] = None
        state["sigma"] = sigma
        guidance = cond - uncond
        if momentum != 0:  # negative momentum too (ComfyUI #8100; the paper's suggestion)
            state["avg"] = guidance if state["avg"] is None else momentum * state["avg"] + guidance
            guidance = state["avg"]
        if norm_threshold > 0:
            norm = guidance.norm(p=2, dim=[-1, -2, -3], keepdim=True)
            guidance = guidance * torch.minimum(torch.ones_like(norm), norm_threshold / norm)
        unit = cond / cond.norm(p=2, dim=[-1, -2, -3], keepdim=True).clamp_min(1e-12)
        parallel = (guidance * unit).sum(dim=[-1, -2, -3], keepdim=True) * unit
        modified = (guidance - parallel) + eta * parallel
        return [(uncond + modified) + (cond - uncond) / args["cond_scale"], uncond, *out[2:]]

    return SamplingHooks(pre_cfg=(pre,))


def tcfg() -> SamplingHooks:
    def pre(args: Args) -> list[Any]:
        out = args["conds_out"]
        if len(out) <= 1 or None in args["conds"][:2]:
            return out
        x = args["input"]
        cond_score, uncond_score = x - out[0], x - out[1]
        b = cond_score.shape[0]
        c_flat = cond_score.reshape(b, 1, -1).float()
        u_flat = uncond_score.reshape(b, 1, -1).float()
        _, _, vh = torch.linalg.svd(torch.cat((u_flat, c_flat), dim=1), full_matrices=False)
        v1 = vh[:, 0:1, :]
        damped = ((u_flat @ v1.transpose(-2, -1)) * v1).reshape_as(uncond_score).to(uncond_score.dtype)
        return [out[0], x - damped, *out[2:]]

    return SamplingHooks(pre_cfg=(pre,))


def perp_neg_patch(empty: tuple[Any, ...], neg_scale: float) -> SamplingHooks:
    def cfg(args: Args) -> torch.Tensor:
        run, x = args["model"], args["input"]
        nocond = run.calc_entries(empty, x, args["sigma"])
        return x - perp_neg(
            args["cond_denoised"], args["uncond_denoised"], nocond, neg_scale, args["cond_scale"]
        )

    return SamplingHooks(cfg_function=cfg)


def mahiro() -> SamplingHooks:
    def post(args: Args) -> torch.Tensor:
        scale, cfg = args["cond_scale"], args["denoised"]
        leap, u_leap = args["cond_denoised"] * scale, args["uncond_denoised"] * scale
        merge = (leap + cfg) / 2
        norm_u = torch.sqrt(u_leap.abs()) * u_leap.sign()
        norm_m = torch.sqrt(merge.abs()) * merge.sign()
        sim = 2 * (torch.nn.functional.cosine_similarity(norm_u, norm_m).mean() + 1)
        return (sim * cfg + (4 - sim) * leap) / 4

    return SamplingHooks(post_cfg=(post,))


def fourier_filter(x: torch.Tensor, scale_low: float, scale_high: float, freq_cutoff: int) -> torch.Tensor:
    """Scale ``x``'s 2-D spectrum (last two axes) by ``scale_low`` inside the centred low-frequency box
    and by ``scale_high`` outside it. As ComfyUI, the box spans ``freq_cutoff`` indices either side of
    the centre on every axis after batch and channel (on a video latent the frame axis too), clamped
    to the axis length."""
    freq = torch.fft.fftshift(torch.fft.fftn(x.float(), dim=(-2, -1)), dim=(-2, -1))
    mask = torch.full(freq.shape, scale_high, device=x.device)
    box = mask
    for dim in range(2, freq.ndim):
        centre = freq.shape[dim] // 2
        half = min(freq_cutoff, centre)
        box = box.narrow(dim, centre - half, 2 * half)
    box.fill_(scale_low)  # a view into mask
    back = torch.fft.ifftshift(freq * mask, dim=(-2, -1))
    return torch.fft.ifftn(back, dim=(-2, -1)).real.to(x.dtype)


def fresca(scale_low: float, scale_high: float, freq_cutoff: int) -> SamplingHooks:
    def pre(args: Args) -> list[Any]:
        cond, uncond = args["conds_out"][0], args["conds_out"][1]
        return [fourier_filter(cond - uncond, scale_low, scale_high, freq_cutoff) + uncond, uncond]

    return SamplingHooks(pre_cfg=(pre,))


def epsilon_scaling(factor: float) -> SamplingHooks:
    factor = factor or 1e-9

    def post(args: Args) -> torch.Tensor:
        x = args["input"]
        return x - (x - args["denoised"]) / factor

    return SamplingHooks(post_cfg=(post,))


def temporal_score_rescaling(tsr_k: float, tsr_sigma: float) -> SamplingHooks:
    from nodes.diffusion.k_samplers import sigma_to_half_log_snr  # lazy: the samplers (~150 ms)

    variance = tsr_sigma**2

    def post(args: Args) -> torch.Tensor:
        denoised, x, sigma = args["denoised"], args["input"], args["sigma"][0]
        if tsr_k == 1 or sigma.item() == 0:
            return denoised
        half_log_snr = sigma_to_half_log_snr(sigma, args["model"].model_sampling)
        snr = (2 * half_log_snr).exp()
        if snr.item() == 0:
            return denoised
        ratio = (snr * variance + 1) / (snr * variance / tsr_k + 1)
        ratio = torch.where(torch.isposinf(snr), torch.as_tensor(tsr_k, dtype=snr.dtype), ratio)
        return torch.lerp(x / (sigma * half_log_snr.exp()), denoised, ratio)

    return SamplingHooks(post_cfg=(post,))


def differential_diffusion(strength: float) -> SamplingHooks:
    def mask_fn(sigma: torch.Tensor, denoise_mask: torch.Tensor, extra_options: Args) -> torch.Tensor:
        ms, steps = extra_options["model"].model_sampling, torch.as_tensor(extra_options["sigmas"])
        sigma_to = max(float(ms.sigma_min), float(steps[-1]))
        ts_from, ts_to = ms.timestep(steps[0]), ms.timestep(torch.tensor(sigma_to))
        threshold = (ms.timestep(sigma[0]) - ts_to) / (ts_from - ts_to)
        binary = (denoise_mask >= threshold).to(denoise_mask.dtype)
        return strength * binary + (1 - strength) * denoise_mask if strength and strength < 1 else binary

    return SamplingHooks(denoise_mask_function=mask_fn)


def latent_operation_cfg(operation: Callable[..., torch.Tensor]) -> SamplingHooks:
    def pre(args: Args) -> list[Any]:
        out = list(args["conds_out"])
        if len(out) == 2:
            out[0] = operation(latent=out[0] - out[1]) + out[1]
        else:
            out[0] = operation(latent=out[0])
        return out

    return SamplingHooks(pre_cfg=(pre,))
