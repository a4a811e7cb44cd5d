"""DPM-Solver++ samplers: dpmpp_2s_ancestral, dpmpp_sde, dpmpp_2m, dpmpp_2m_sde (midpoint/heun),
dpmpp_3m_sde, and the ``_gpu`` variants whose Brownian tree lives on the latent's device.

The SDE samplers work in half-log-SNR lambda = log(alpha / sigma), which makes them correct for
flow ("CONST") models too (alpha = 1 - sigma there, 1 for eps models); a flow schedule that starts
at sigma 1 is nudged to percent_to_sigma(1e-4) first. Their noise is a torchsde Brownian tree over
[smallest positive sigma, largest sigma] seeded with the run's seed, queried per step exactly where
ComfyUI queries it. Ancestral noise comes from the seed + 1 generator.
References: Lu et al. 2022 (DPM-Solver++, arXiv:2211.01095); k-diffusion ``sampling.py`` (MIT);
ComfyUI ``comfy/k_diffusion/sampling.py`` for the half-log-SNR and flow forms.
"""

from __future__ import annotations

from typing import Any

import torch

from nodes.diffusion.k_euler import rf_ancestral_split
from nodes.diffusion.k_samplers import (
    StepCallback,
    get_ancestral_step,
    half_log_snr_to_sigma,
    is_flow,
    model_sampling_of,
    noise_sampler_for,
    offset_first_sigma_for_snr,
    report,
    sigma_to_half_log_snr,
    step_range,
    to_d,
)
from nodes.diffusion.model_sampling import ModelSampling
from nodes.diffusion.noise import NoiseSampler, brownian_noise_sampler


def _t(sigma: torch.Tensor) -> torch.Tensor:
    return sigma.log().neg()


def _sigma(t: torch.Tensor) -> torch.Tensor:
    return t.neg().exp()


@torch.no_grad()
def sample_dpmpp_2s_ancestral(
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
    """Ancestral DPM-Solver++(2S): a single-step second-order update to sigma_down, then noise."""
    if is_flow(model):
        return sample_dpmpp_2s_ancestral_rf(
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
            x = x + to_d(x, sigmas[i], denoised) * (sigma_down - sigmas[i])
        else:
            t, t_next = _t(sigmas[i]), _t(sigma_down)
            h = t_next - t
            s = t + 0.5 * h
            x_2 = (_sigma(s) / _sigma(t)) * x - (-h * 0.5).expm1() * denoised
            denoised_2 = model(x_2, _sigma(s) * s_in, **extra_args)
            x = (_sigma(t_next) / _sigma(t)) * x - (-h).expm1() * denoised_2
        if sigmas[i + 1] > 0:
            x = x + noise(sigmas[i], sigmas[i + 1]) * s_noise * sigma_up
    return x


@torch.no_grad()
def sample_dpmpp_2s_ancestral_rf(
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
    """dpmpp_2s_ancestral for rectified flow: the midpoint in lambda = log((1 - s) / s)."""
    extra_args = {} if extra_args is None else extra_args
    noise = noise_sampler_for(x, extra_args, noise_sampler)
    s_in = x.new_ones([x.shape[0]])
    for i in step_range(len(sigmas) - 1, disable):
        denoised = model(x, sigmas[i] * s_in, **extra_args)
        sigma_down, alpha_ratio, renoise = rf_ancestral_split(sigmas[i], sigmas[i + 1], eta)
        report(callback, x, i, sigmas[i], denoised)
        if sigmas[i + 1] == 0:
            x = x + to_d(x, sigmas[i], denoised) * (sigma_down - sigmas[i])
        else:
            if sigmas[i] == 1.0:
                sigma_s: Any = 0.9999
            else:
                lam_i, lam_down = ((1 - sigmas[i]) / sigmas[i]).log(), ((1 - sigma_down) / sigma_down).log()
                sigma_s = ((lam_i + 0.5 * (lam_down - lam_i)).exp() + 1) ** -1
            ratio_s = sigma_s / sigmas[i]
            u = ratio_s * x + (1 - ratio_s) * denoised
            denoised_2 = model(u, sigma_s * s_in, **extra_args)
            ratio_down = sigma_down / sigmas[i]
            x = ratio_down * x + (1 - ratio_down) * denoised_2
        if sigmas[i + 1] > 0 and eta > 0:
            x = alpha_ratio * x + noise(sigmas[i], sigmas[i + 1]) * s_noise * renoise
    return x


def _brownian_or(
    x: torch.Tensor,
    sigmas: torch.Tensor,
    extra_args: dict[str, Any],
    noise_sampler: NoiseSampler | None,
    cpu: bool,
) -> NoiseSampler:
    if noise_sampler is not None:
        return noise_sampler
    return brownian_noise_sampler(x, sigmas, extra_args.get("seed"), cpu=cpu)


@torch.no_grad()
def sample_dpmpp_sde(
    model: Any,
    x: torch.Tensor,
    sigmas: torch.Tensor,
    extra_args: dict[str, Any] | None = None,
    callback: StepCallback | None = None,
    disable: bool | None = None,
    eta: float = 1.0,
    s_noise: float = 1.0,
    noise_sampler: NoiseSampler | None = None,
    r: float = 1 / 2,
    cpu_tree: bool = True,
) -> torch.Tensor:
    """DPM-Solver++ (stochastic, single-step 2nd order): an SDE half step to lambda + r h, then the
    full step with the blended denoised. Brownian noise at (sigma_i, sigma_mid) and (sigma_i, sigma_i+1)."""
    if len(sigmas) <= 1:
        return x
    extra_args = {} if extra_args is None else extra_args
    noise = _brownian_or(x, sigmas, extra_args, noise_sampler, cpu_tree)
    s_in = x.new_ones([x.shape[0]])
    sampling = model_sampling_of(model)
    sigmas = offset_first_sigma_for_snr(sigmas, sampling)
    fac = 1 / (2 * r)
    for i in step_range(len(sigmas) - 1, disable):
        denoised = model(x, sigmas[i] * s_in, **extra_args)
        report(callback, x, i, sigmas[i], denoised)
        if sigmas[i + 1] == 0:
            x = denoised
            continue
        lambda_s, lambda_t = (
            sigma_to_half_log_snr(sigmas[i], sampling),
            sigma_to_half_log_snr(sigmas[i + 1], sampling),
        )
        h = lambda_t - lambda_s
        lambda_s_1 = lambda_s + r * h
        sigma_s_1 = half_log_snr_to_sigma(lambda_s_1, sampling)
        alpha_s = sigmas[i] * lambda_s.exp()
        alpha_s_1 = sigma_s_1 * lambda_s_1.exp()
        alpha_t = sigmas[i + 1] * lambda_t.exp()

        sd, su = get_ancestral_step(lambda_s.neg().exp(), lambda_s_1.neg().exp(), eta)
        h_ = sd.log().neg() - lambda_s
        x_2 = (alpha_s_1 / alpha_s) * (-h_).exp() * x - alpha_s_1 * (-h_).expm1() * denoised
        if eta > 0 and s_noise > 0:
            x_2 = x_2 + alpha_s_1 * noise(sigmas[i], sigma_s_1) * s_noise * su
        denoised_2 = model(x_2, sigma_s_1 * s_in, **extra_args)

        sd, su = get_ancestral_step(lambda_s.neg().exp(), lambda_t.neg().exp(), eta)
        h_ = sd.log().neg() - lambda_s
        denoised_d = (1 - fac) * denoised + fac * denoised_2
        x = (alpha_t / alpha_s) * (-h_).exp() * x - alpha_t * (-h_).expm1() * denoised_d
        if eta > 0 and s_noise > 0:
            x = x + alpha_t * noise(sigmas[i], sigmas[i + 1]) * s_noise * su
    return x


@torch.no_grad()
def sample_dpmpp_2m(
    model: Any,
    x: torch.Tensor,
    sigmas: torch.Tensor,
    extra_args: dict[str, Any] | None = None,
    callback: StepCallback | None = None,
    disable: bool | None = None,
) -> torch.Tensor:
    """DPM-Solver++(2M): second-order multistep in t = -log(sigma); first order on the first and
    the last (to 0) step."""
    extra_args = {} if extra_args is None else extra_args
    s_in = x.new_ones([x.shape[0]])
    old_denoised: torch.Tensor | None = None
    for i in step_range(len(sigmas) - 1, disable):
        denoised = model(x, sigmas[i] * s_in, **extra_args)
        report(callback, x, i, sigmas[i], denoised)
        t, t_next = _t(sigmas[i]), _t(sigmas[i + 1])
        h = t_next - t
        if old_denoised is None or sigmas[i + 1] == 0:
            x = (_sigma(t_next) / _sigma(t)) * x - (-h).expm1() * denoised
        else:
            r = (t - _t(sigmas[i - 1])) / h
            denoised_d = (1 + 1 / (2 * r)) * denoised - (1 / (2 * r)) * old_denoised
            x = (_sigma(t_next) / _sigma(t)) * x - (-h).expm1() * denoised_d
        old_denoised = denoised
    return x


def _sde_setup(
    model: Any,
    x: torch.Tensor,
    sigmas: torch.Tensor,
    extra_args: dict[str, Any],
    noise_sampler: NoiseSampler | None,
    cpu_tree: bool,
) -> tuple[NoiseSampler, ModelSampling, torch.Tensor]:
    """(noise sampler, model sampling, sigmas) of a half-log-SNR SDE sampler: the Brownian tree spans
    the given sigmas; a flow schedule starting at 1 is nudged afterwards."""
    noise = _brownian_or(x, sigmas, extra_args, noise_sampler, cpu_tree)
    sampling = model_sampling_of(model)
    return noise, sampling, offset_first_sigma_for_snr(sigmas, sampling)


def _sde_first_order(
    x: torch.Tensor,
    denoised: torch.Tensor,
    sigma: torch.Tensor,
    sigma_next: torch.Tensor,
    sampling: ModelSampling,
    eta: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The exponential-integrator SDE step to sigma_next in lambda; returns (x, h, h * (1 + eta), alpha_next)."""
    lambda_s, lambda_t = sigma_to_half_log_snr(sigma, sampling), sigma_to_half_log_snr(sigma_next, sampling)
    h = lambda_t - lambda_s
    h_eta = h * (eta + 1)
    alpha_t = sigma_next * lambda_t.exp()
    x = sigma_next / sigma * (-h * eta).exp() * x + alpha_t * (-h_eta).expm1().neg() * denoised
    return x, h, h_eta, alpha_t


def _sde_noise(
    x: torch.Tensor,
    noise: NoiseSampler,
    sigma: torch.Tensor,
    sigma_next: torch.Tensor,
    h: torch.Tensor,
    eta: float,
    s_noise: float,
) -> torch.Tensor:
    """Add the step's Brownian noise, std sigma_next * sqrt(1 - e^(-2 h eta))."""
    if eta > 0 and s_noise > 0:
        x = x + noise(sigma, sigma_next) * sigma_next * (-2 * h * eta).expm1().neg().sqrt() * s_noise
    return x


@torch.no_grad()
def sample_dpmpp_2m_sde(
    model: Any,
    x: torch.Tensor,
    sigmas: torch.Tensor,
    extra_args: dict[str, Any] | None = None,
    callback: StepCallback | None = None,
    disable: bool | None = None,
    eta: float = 1.0,
    s_noise: float = 1.0,
    noise_sampler: NoiseSampler | None = None,
    solver_type: str = "midpoint",
    cpu_tree: bool = True,
) -> torch.Tensor:
    """DPM-Solver++(2M) SDE in half-log-SNR, with the ``midpoint`` or ``heun`` second-order correction."""
    if len(sigmas) <= 1:
        return x
    if solver_type not in {"heun", "midpoint"}:
        raise ValueError(f"solver_type must be 'heun' or 'midpoint', got {solver_type!r}")
    extra_args = {} if extra_args is None else extra_args
    noise, sampling, sigmas = _sde_setup(model, x, sigmas, extra_args, noise_sampler, cpu_tree)
    s_in = x.new_ones([x.shape[0]])
    old_denoised: torch.Tensor | None = None
    h: torch.Tensor | None = None
    h_last: torch.Tensor | None = None
    for i in step_range(len(sigmas) - 1, disable):
        denoised = model(x, sigmas[i] * s_in, **extra_args)
        report(callback, x, i, sigmas[i], denoised)
        if sigmas[i + 1] == 0:
            x = denoised
        else:
            x, h, h_eta, alpha_t = _sde_first_order(x, denoised, sigmas[i], sigmas[i + 1], sampling, eta)
            if old_denoised is not None and h_last is not None:
                r = h_last / h
                if solver_type == "heun":
                    x = x + alpha_t * ((-h_eta).expm1().neg() / (-h_eta) + 1) * (1 / r) * (
                        denoised - old_denoised
                    )
                else:
                    x = x + 0.5 * alpha_t * (-h_eta).expm1().neg() * (1 / r) * (denoised - old_denoised)
            x = _sde_noise(x, noise, sigmas[i], sigmas[i + 1], h, eta, s_noise)
        old_denoised = denoised
        h_last = h
    return x


@torch.no_grad()
def sample_dpmpp_3m_sde(
    model: Any,
    x: torch.Tensor,
    sigmas: torch.Tensor,
    extra_args: dict[str, Any] | None = None,
    callback: StepCallback | None = None,
    disable: bool | None = None,
    eta: float = 1.0,
    s_noise: float = 1.0,
    noise_sampler: NoiseSampler | None = None,
    cpu_tree: bool = True,
) -> torch.Tensor:
    """DPM-Solver++(3M) SDE in half-log-SNR: third order once two previous steps exist."""
    if len(sigmas) <= 1:
        return x
    extra_args = {} if extra_args is None else extra_args
    noise, sampling, sigmas = _sde_setup(model, x, sigmas, extra_args, noise_sampler, cpu_tree)
    s_in = x.new_ones([x.shape[0]])
    denoised_1: Any = None
    denoised_2: Any = None
    h: Any = None
    h_1: Any = None
    h_2: Any = None
    for i in step_range(len(sigmas) - 1, disable):
        denoised = model(x, sigmas[i] * s_in, **extra_args)
        report(callback, x, i, sigmas[i], denoised)
        if sigmas[i + 1] == 0:
            x = denoised
        else:
            x, h, h_eta, alpha_t = _sde_first_order(x, denoised, sigmas[i], sigmas[i + 1], sampling, eta)
            phi_2 = h_eta.neg().expm1() / h_eta + 1
            if h_2 is not None:  # third order from the two previous steps
                r0, r1 = h_1 / h, h_2 / h
                d1_0 = (denoised - denoised_1) / r0
                d1_1 = (denoised_1 - denoised_2) / r1
                d1 = d1_0 + (d1_0 - d1_1) * r0 / (r0 + r1)
                d2 = (d1_0 - d1_1) / (r0 + r1)
                phi_3 = phi_2 / h_eta - 0.5
                x = x + (alpha_t * phi_2) * d1 - (alpha_t * phi_3) * d2
            elif h_1 is not None:  # second order from the previous step
                x = x + (alpha_t * phi_2) * ((denoised - denoised_1) / (h_1 / h))
            x = _sde_noise(x, noise, sigmas[i], sigmas[i + 1], h, eta, s_noise)
        denoised_1, denoised_2 = denoised, denoised_1
        h_1, h_2 = h, h_1
    return x


def _on_device(fn: Any, **fixed: Any) -> Any:
    """The ``_gpu`` twin of an SDE sampler: its Brownian tree is built on the latent's device."""

    def sampler(
        model: Any,
        x: torch.Tensor,
        sigmas: torch.Tensor,
        extra_args: dict[str, Any] | None = None,
        callback: StepCallback | None = None,
        disable: bool | None = None,
        **options: Any,
    ) -> torch.Tensor:
        return fn(
            model,
            x,
            sigmas,
            extra_args=extra_args,
            callback=callback,
            disable=disable,
            **{**fixed, **options, "cpu_tree": False},
        )

    sampler.__name__ = f"{fn.__name__}_gpu"
    sampler.__doc__ = f"{fn.__name__} with the Brownian tree on the latent's device."
    return sampler


def sample_dpmpp_2m_sde_heun(
    model: Any,
    x: torch.Tensor,
    sigmas: torch.Tensor,
    extra_args: dict[str, Any] | None = None,
    callback: StepCallback | None = None,
    disable: bool | None = None,
    **options: Any,
) -> torch.Tensor:
    """dpmpp_2m_sde with the Heun-type correction (``solver_type="heun"``)."""
    options.setdefault("solver_type", "heun")
    return sample_dpmpp_2m_sde(
        model, x, sigmas, extra_args=extra_args, callback=callback, disable=disable, **options
    )


sample_dpmpp_sde_gpu = _on_device(sample_dpmpp_sde)
sample_dpmpp_2m_sde_gpu = _on_device(sample_dpmpp_2m_sde)
sample_dpmpp_2m_sde_heun_gpu = _on_device(sample_dpmpp_2m_sde_heun)
sample_dpmpp_3m_sde_gpu = _on_device(sample_dpmpp_3m_sde)
