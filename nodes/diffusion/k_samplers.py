"""Shared helpers of the samplers.

A sampler is ``fn(model, x, sigmas, extra_args=None, callback=None, disable=None, **options) -> x``
(see the package docstring for the conventions). The helpers here are the vocabulary the samplers
share: the per-step progress report, the Karras ODE derivative, the ancestral split of a step,
half-log-SNR for flow models, exponential-integrator phi functions, the post-CFG hook and the
unconditional-prediction capture of the CFG++ samplers, and the set-up of a sampler with per-step noise.
The algorithms live in ``k_euler``, ``k_dpm``, ``k_dpmpp``, ``k_cfgpp``, ``k_multistep``, ``k_seeds``,
``sa_solver`` and ``uni_pc``; ``sampler_table.SAMPLERS`` names them.

Half-logSNR: λ = log(α/σ_vp). For variance-exploding (EPS / V / EDM) sigmas α = 1 and λ = −log σ; for
flow models (x_σ = (1−σ)·x0 + σ·ε) α = 1−σ and λ = log((1−σ)/σ). Samplers written in λ use the helpers
below so they work for both, as ComfyUI's do (``comfy/k_diffusion/sampling.py``: sigma_to_half_log_snr,
half_log_snr_to_sigma, offset_first_sigma_for_snr).
References: k-diffusion (Crowson, MIT) ``k_diffusion/sampling.py``; ComfyUI ``comfy/k_diffusion/sampling.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
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


def report(
    callback: StepCallback | None,
    x: torch.Tensor,
    i: int,
    sigma: torch.Tensor,
    denoised: torch.Tensor,
    sigma_hat: torch.Tensor | None = None,
) -> None:
    """Send step ``i``'s progress dict of the package convention to ``callback`` (if any);
    ``sigma_hat`` is the sigma the model was evaluated at when churn raised it (default ``sigma``)."""
    if callback is not None:
        sigma_hat = sigma if sigma_hat is None else sigma_hat
        callback({"x": x, "i": i, "sigma": sigma, "sigma_hat": sigma_hat, "denoised": denoised})


def batch_sigma(x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """σ repeated once per batch item, the form the model wrapper takes."""
    return sigma * x.new_ones([x.shape[0]])


def as_args(extra_args: dict[str, Any] | None) -> dict[str, Any]:
    """``extra_args``, or a new empty dict for None."""
    return {} if extra_args is None else extra_args


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


def noise_scale(model_sampling: ModelSampling) -> float:
    """The multiplier a flow prediction puts on its noise (``noise_scale``; 1 otherwise).

    Newer ComfyUI scales the samplers' injected noise by it, as the initial noise is; at 618b803d no model
    sampling had one, which is the default 1 here, so the results are the same.
    """
    return float(getattr(model_sampling.prediction, "noise_scale", 1.0))


@dataclass
class UncondCapture:
    """A post-CFG function that remembers the latest unconditional prediction and changes nothing.

    CFG++ samplers (Chung et al. 2024, arXiv:2406.08070) step with the unconditional prediction; the
    guider hands it to every function in ``model_options['sampler_post_cfg_function']``.
    """

    value: torch.Tensor | None = None

    def __call__(self, args: dict[str, Any]) -> torch.Tensor:
        self.value = args["uncond_denoised"]
        return args["denoised"]  # type: ignore[no-any-return]

    def latest(self) -> torch.Tensor:
        if self.value is None:
            raise RuntimeError(
                "a CFG++ sampler needs the unconditional prediction, but the model never called the "
                "post-CFG functions in model_options['sampler_post_cfg_function'] (or passed None); sample "
                "through a guider (KSampler, CFGGuider) rather than a bare model"
            )
        return self.value


def capture_uncond(extra_args: dict[str, Any]) -> tuple[dict[str, Any], UncondCapture]:
    """A copy of ``extra_args`` whose model options report the uncond prediction to the returned capture.

    As ComfyUI's CFG++ samplers do, the capture goes last in the post-CFG list and the cfg = 1 shortcut
    (which skips the negative) is switched off so an unconditional prediction always exists.
    """
    capture = UncondCapture()
    options = with_post_cfg(extra_args.get("model_options"), capture, disable_cfg1_optimization=True)
    return {**extra_args, "model_options": options}, capture


@dataclass(frozen=True)
class NoisyRun:
    """What a sampler with per-step noise sets up first: its model args, the noise source, the model
    sampling and the effective noise multiplier (``s_noise`` × the prediction's noise scale)."""

    args: dict[str, Any]
    noise: NoiseSampler
    sampling: ModelSampling
    s_noise: float


def noisy_run(
    model: Any,
    x: torch.Tensor,
    extra_args: dict[str, Any] | None,
    noise_sampler: NoiseSampler | None,
    s_noise: float,
) -> NoisyRun:
    """Set up a stochastic sampler (default noise: seed + 1 generator from ``extra_args['seed']``)."""
    args = as_args(extra_args)
    sampling = model_sampling_of(model)
    return NoisyRun(
        args, noise_sampler_for(x, args, noise_sampler), sampling, s_noise * noise_scale(sampling)
    )
