"""Small pieces shared by the extra samplers (``k_cfgpp``, ``k_multistep``, ``k_seeds``, ``sa_solver``).

Conventions (the package's sampler contract): a sampler is
``fn(model, x, sigmas, extra_args=None, callback=None, disable=None, **options) -> x``;
``model(x, sigma_batch, **extra_args)`` returns the denoised (x0) prediction and ``model.model_sampling``
is the model's ModelSampling. ``extra_args`` carries ``"seed"`` (int) and ``"model_options"`` (dict).

Half-logSNR: λ = log(α/σ_vp). For variance-exploding (EPS / V / EDM) sigmas α = 1 and λ = −log σ; for
flow models (x_σ = (1−σ)·x0 + σ·ε) α = 1−σ and λ = log((1−σ)/σ). Samplers written in λ use the helpers
below so they work for both, as ComfyUI's do (``comfy/k_diffusion/sampling.py``: sigma_to_half_log_snr,
half_log_snr_to_sigma, offset_first_sigma_for_snr).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor

from nodes.diffusion.k_samplers import (
    StepCallback,
    get_ancestral_step,
    half_log_snr_to_sigma,
    model_sampling_of,
    noise_sampler_for,
    offset_first_sigma_for_snr,
    sigma_to_half_log_snr,
    to_d,
    with_post_cfg,
)
from nodes.diffusion.model_sampling import ModelSampling
from nodes.diffusion.noise import NoiseSampler

Callback = StepCallback

__all__ = [
    "Callback",
    "NoiseSampler",
    "NoisyRun",
    "UncondCapture",
    "as_args",
    "batch_sigma",
    "capture_uncond",
    "get_ancestral_step",
    "half_log_snr_to_sigma",
    "model_sampling_of",
    "noise_sampler_for",
    "noise_scale",
    "noisy_run",
    "offset_first_sigma_for_snr",
    "report",
    "sigma_to_half_log_snr",
    "to_d",
]


def noise_scale(model_sampling: ModelSampling) -> float:
    """The multiplier a flow prediction puts on its noise (``noise_scale``; 1 otherwise).

    Newer ComfyUI scales the samplers' injected noise by it, as the initial noise is; at 618b803d no model
    sampling had one, which is the default 1 here, so the results are the same.
    """
    return float(getattr(model_sampling.prediction, "noise_scale", 1.0))


def report(callback: Callback | None, x: Tensor, i: int, sigma: Tensor, denoised: Tensor) -> None:
    """Send one step's progress to ``callback`` (the package's callback dict)."""
    if callback is not None:
        callback({"x": x, "i": i, "sigma": sigma, "sigma_hat": sigma, "denoised": denoised})


def batch_sigma(x: Tensor, sigma: Tensor) -> Tensor:
    """σ repeated once per batch item, the form the model wrapper takes."""
    return sigma * x.new_ones([x.shape[0]])


def as_args(extra_args: dict[str, Any] | None) -> dict[str, Any]:
    return {} if extra_args is None else extra_args


@dataclass
class UncondCapture:
    """A post-CFG function that remembers the latest unconditional prediction and changes nothing.

    CFG++ samplers (Chung et al. 2024, arXiv:2406.08070) step with the unconditional prediction; the
    guider hands it to every function in ``model_options['sampler_post_cfg_function']``.
    """

    value: Tensor | None = None

    def __call__(self, args: dict[str, Any]) -> Tensor:
        self.value = args["uncond_denoised"]
        return args["denoised"]  # type: ignore[no-any-return]

    def latest(self) -> Tensor:
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
    x: Tensor,
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
