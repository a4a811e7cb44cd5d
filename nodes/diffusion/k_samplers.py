"""Shared helpers of the k-diffusion-style samplers.

A sampler is ``fn(model, x, sigmas, extra_args=None, callback=None, disable=None, **options) -> x``
(see the package docstring for the conventions). The helpers here are the vocabulary the samplers
share: the Karras ODE derivative, the ancestral split of a step, half-log-SNR for flow models,
exponential-integrator phi functions and the post-CFG hook used by the CFG++ samplers.
The algorithms themselves live in ``k_euler.py``, ``k_dpm.py`` and ``k_dpmpp.py``.
References: k-diffusion (Crowson, MIT) ``k_diffusion/sampling.py``; ComfyUI ``comfy/k_diffusion/sampling.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

import torch

from nodes.diffusion.model_sampling import ModelSampling
from nodes.diffusion.noise import NoiseSampler, default_noise_sampler

StepCallback = Callable[[dict[str, Any]], None]
"""``callback({"x", "i", "sigma", "sigma_hat", "denoised"})`` after each model evaluation of a step."""

PostCfgFunction = Callable[[dict[str, Any]], torch.Tensor]


class Denoiser(Protocol):
    """What a sampler calls: ``model(x, sigma_batch, **extra_args) -> denoised`` (x0 prediction)."""

    model_sampling: ModelSampling

    def __call__(self, x: torch.Tensor, sigma: torch.Tensor, **extra_args: Any) -> torch.Tensor: ...


class SamplerFunction(Protocol):
    def __call__(
        self,
        model: Any,
        x: torch.Tensor,
        sigmas: torch.Tensor,
        extra_args: dict[str, Any] | None = None,
        callback: StepCallback | None = None,
        disable: bool | None = None,
        **options: Any,
    ) -> torch.Tensor: ...


def append_dims(x: torch.Tensor | float, target_dims: int) -> torch.Tensor:
    """``x`` with trailing singleton dims so it has ``target_dims`` dims (a [B] sigma over [B, C, H, W])."""
    x = torch.as_tensor(x)
    missing = target_dims - x.ndim
    if missing < 0:
        raise ValueError(f"input has {x.ndim} dims but target_dims is {target_dims}, which is less")
    return x[(...,) + (None,) * missing]


def to_d(x: torch.Tensor, sigma: torch.Tensor, denoised: torch.Tensor) -> torch.Tensor:
    """The Karras ODE derivative dx/dsigma = (x - D(x)) / sigma."""
    return (x - denoised) / append_dims(sigma, x.ndim)


def get_ancestral_step(
    sigma_from: torch.Tensor | float, sigma_to: torch.Tensor | float, eta: float = 1.0
) -> tuple[Any, Any]:
    """Split a step sigma_from -> sigma_to into a deterministic step down to ``sigma_down`` and fresh
    noise of std ``sigma_up`` (sigma_down^2 + sigma_up^2 = sigma_to^2). Returns (sigma_down, sigma_up)."""
    if not eta:
        return sigma_to, 0.0
    sigma_up = min(sigma_to, eta * (sigma_to**2 * (sigma_from**2 - sigma_to**2) / sigma_from**2) ** 0.5)  # type: ignore[type-var,operator]
    sigma_down = (sigma_to**2 - sigma_up**2) ** 0.5
    return sigma_down, sigma_up


def model_sampling_of(model: Any) -> ModelSampling:
    """The :class:`ModelSampling` of the denoiser a sampler was given (``model.model_sampling``)."""
    sampling = getattr(model, "model_sampling", None)
    if not isinstance(sampling, ModelSampling):
        raise TypeError(
            f"the sampler's model must expose .model_sampling (a ModelSampling), got {type(model).__name__} "
            f"with model_sampling={sampling!r}; wrap the denoiser with the guider or KSamplerFn"
        )
    return sampling


def is_flow(model: Any) -> bool:
    """True when the model is a rectified-flow ("CONST") model (samplers switch to their RF forms)."""
    sampling = getattr(model, "model_sampling", None)
    return isinstance(sampling, ModelSampling) and sampling.is_flow


def sigma_to_half_log_snr(sigma: torch.Tensor, model_sampling: ModelSampling) -> torch.Tensor:
    """lambda = log(alpha / sigma): -log(sigma) for VE/eps models, log((1 - s) / s) for flow models."""
    sigma = torch.as_tensor(sigma)
    if model_sampling.is_flow:
        return sigma.logit().neg()
    return sigma.log().neg()


def half_log_snr_to_sigma(half_log_snr: torch.Tensor, model_sampling: ModelSampling) -> torch.Tensor:
    """Inverse of :func:`sigma_to_half_log_snr`."""
    if model_sampling.is_flow:
        return half_log_snr.neg().sigmoid()
    return half_log_snr.neg().exp()


def offset_first_sigma_for_snr(
    sigmas: torch.Tensor, model_sampling: ModelSampling, percent_offset: float = 1e-4
) -> torch.Tensor:
    """For flow models a first sigma of 1 has infinite -lambda: nudge it to percent_to_sigma(1e-4)."""
    if len(sigmas) <= 1:
        return sigmas
    if model_sampling.is_flow and sigmas[0] >= 1:
        sigmas = sigmas.clone()
        sigmas[0] = model_sampling.percent_to_sigma(percent_offset)
    return sigmas


def ei_h_phi_1(h: torch.Tensor) -> torch.Tensor:
    """h * phi_1(h) = e^h - 1 (exponential integrators)."""
    return torch.expm1(h)


def ei_h_phi_2(h: torch.Tensor) -> torch.Tensor:
    """h * phi_2(h) = (e^h - 1 - h) / h."""
    return (torch.expm1(h) - h) / h


def with_post_cfg(
    model_options: Mapping[str, Any] | None, fn: PostCfgFunction, disable_cfg1_optimization: bool = False
) -> dict[str, Any]:
    """A copy of ``model_options`` with ``fn`` appended to ``sampler_post_cfg_function`` (and, if
    asked, ``disable_cfg1_optimization`` set so the guider evaluates the uncond branch at cfg 1)."""
    options = dict(model_options or {})
    options["sampler_post_cfg_function"] = [*options.get("sampler_post_cfg_function", []), fn]
    if disable_cfg1_optimization:
        options["disable_cfg1_optimization"] = True
    return options


def noise_sampler_for(
    x: torch.Tensor, extra_args: Mapping[str, Any], noise_sampler: NoiseSampler | None
) -> NoiseSampler:
    """``noise_sampler`` if given, else the seeded default one (seed from ``extra_args["seed"]``)."""
    if noise_sampler is not None:
        return noise_sampler
    return default_noise_sampler(x, seed=extra_args.get("seed"))


def step_range(n: int, disable: bool | None = None) -> Iterable[int]:
    """The step indices of a run (``disable`` is accepted for k-diffusion compatibility; Loom reports
    progress through the callback, not a progress bar)."""
    return range(n)
