"""The SAMPLER value: a sampler function with its options, run the way ComfyUI's KSAMPLER runs it.

:meth:`KSamplerFn.sample` scales the start noise (``noise_scaling``: sqrt(1 + sigma_0^2) when the run
starts at the model's sigma_max, else sigma_0), wraps the guider for inpainting (every model call
re-imposes the known region noised to the current sigma, and its denoised output keeps the known
latent there), calls the sampler function and undoes the noise scaling at the end
(``inverse_noise_scaling``). ``sampler_object(name)`` maps ComfyUI's 44 sampler names to values:
``ddim`` is euler with fresh inpaint noise, every other name is an entry of
``nodes.diffusion.sampler_table.SAMPLERS``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from nodes.diffusion.k_samplers import model_sampling_of
from nodes.diffusion.model_sampling import ModelSampling, reshape_sigma
from nodes.diffusion.names import SAMPLER_NAMES
from nodes.diffusion.noise import SeedGroups, grouped_randn, seeded_cpu_generator
from nodes.diffusion.sampler_table import SAMPLERS

ProgressCallback = Callable[[int, torch.Tensor, torch.Tensor, int], None]
"""``callback(step, denoised, x, total_steps)``: ComfyUI's sampling callback (previews, progress)."""

DEFAULT_INPAINT_SEED = 41  # ComfyUI's fallback when extra_args carry no seed


class SamplerNotAvailable(LookupError):
    """A sampler name that Loom does not know; the message lists the names it does."""


class InpaintDenoiser:
    """The guider seen through an inpainting mask (ComfyUI's KSamplerX0Inpaint).

    ``denoise_mask`` is 1 where the sampler may change the latent. Before each model call the
    region outside the mask is replaced by the known latent noised to the current sigma (with the
    run's noise, or fresh noise for ``ddim``); after it, the denoised output keeps the known latent
    there. Without a mask it is a plain pass-through."""

    def __init__(
        self, guider: Any, sigmas: torch.Tensor, latent_image: torch.Tensor, noise: torch.Tensor
    ) -> None:
        self.guider = guider
        self.sigmas = sigmas
        self.latent_image = latent_image
        self.noise = noise
        self.model_sampling: ModelSampling = model_sampling_of(guider)

    def __call__(
        self,
        x: torch.Tensor,
        sigma: torch.Tensor,
        denoise_mask: torch.Tensor | None = None,
        model_options: dict[str, Any] | None = None,
        seed: int | None = None,
    ) -> torch.Tensor:
        model_options = {} if model_options is None else model_options
        if denoise_mask is not None:
            mask_fn = model_options.get("denoise_mask_function")
            if mask_fn is not None:
                denoise_mask = mask_fn(
                    sigma, denoise_mask, extra_options={"model": self.guider, "sigmas": self.sigmas}
                )
            keep = 1.0 - denoise_mask
            known = self.model_sampling.noise_scaling(
                reshape_sigma(sigma, self.noise.ndim), self.noise, self.latent_image
            )
            x = x * denoise_mask + known * keep
        out = self.guider(x, sigma, model_options=model_options, seed=seed)
        if denoise_mask is not None:
            out = out * denoise_mask + self.latent_image * keep
        return out


def random_inpaint_noise(noise: torch.Tensor, seed: int | SeedGroups | None) -> torch.Tensor:
    """ddim's inpaint noise: a fresh CPU float32 ``randn`` of the noise's shape seeded with seed + 1
    (ComfyUI's fallback seed 41 when none is given), per run for coalesced seed groups."""
    seed = DEFAULT_INPAINT_SEED if seed is None else seed
    if isinstance(seed, SeedGroups):
        generators = [seeded_cpu_generator(s + 1) for s, _ in seed.groups]
        fresh = grouped_randn(noise.cpu().float(), seed, generators)
    else:
        fresh = torch.randn(noise.shape, generator=seeded_cpu_generator(int(seed) + 1), device="cpu")
    return fresh.to(noise.dtype).to(noise.device)


def starts_at_max_sigma(model_sampling: ModelSampling, sigmas: torch.Tensor) -> bool:
    """ComfyUI's max_denoise test: the run starts at (or above) the model's sigma_max."""
    max_sigma, first = float(model_sampling.sigma_max), float(sigmas[0])
    return math.isclose(max_sigma, first, rel_tol=1e-05) or first > max_sigma


@dataclass(frozen=True, eq=False)
class KSamplerFn:
    """A sampler function with fixed options: the value on a SAMPLER socket.

    ``extra_options`` are passed to the function as keyword arguments (eta, s_noise, solver_type, ...);
    ``inpaint_options`` may hold ``{"random": True}`` (fresh inpaint noise from seed + 1, as ``ddim``).
    ``name`` is informative (logs, cache keys)."""

    sampler_function: Callable[..., torch.Tensor]
    extra_options: Mapping[str, Any] = field(default_factory=dict)
    inpaint_options: Mapping[str, Any] = field(default_factory=dict)
    name: str = ""

    def sample(
        self,
        model_wrap: Any,
        sigmas: torch.Tensor,
        extra_args: dict[str, Any],
        callback: ProgressCallback | None,
        noise: torch.Tensor,
        latent_image: torch.Tensor | None = None,
        denoise_mask: torch.Tensor | None = None,
        disable_pbar: bool = True,
    ) -> torch.Tensor:
        """Run the sampler over ``sigmas`` from ``latent_image`` (model space) with unit ``noise``.

        ``model_wrap`` is the guider: ``model_wrap(x, sigma, model_options=..., seed=...)`` returns the
        guided denoised prediction and ``model_wrap.model_sampling`` is its ModelSampling.
        ``extra_args`` holds "seed" and "model_options". Returns the sampled latent (model space)."""
        sampling = model_sampling_of(model_wrap)
        if latent_image is None:
            latent_image = torch.zeros_like(noise)
        extra_args = {**extra_args, "denoise_mask": denoise_mask}
        inpaint_noise = (
            random_inpaint_noise(noise, extra_args.get("seed"))
            if self.inpaint_options.get("random")
            else noise
        )
        model_k = InpaintDenoiser(model_wrap, sigmas, latent_image, inpaint_noise)
        x = sampling.noise_scaling(sigmas[0], noise, latent_image, starts_at_max_sigma(sampling, sigmas))
        total_steps = len(sigmas) - 1

        def k_callback(info: dict[str, Any]) -> None:
            if callback is not None:
                callback(info["i"], info["denoised"], info["x"], total_steps)

        samples = self.sampler_function(
            model_k,
            x,
            sigmas,
            extra_args=extra_args,
            callback=k_callback,
            disable=disable_pbar,
            **dict(self.extra_options),
        )
        return sampling.inverse_noise_scaling(sigmas[-1], samples)


def ksampler(
    name: str,
    extra_options: Mapping[str, Any] | None = None,
    inpaint_options: Mapping[str, Any] | None = None,
) -> KSamplerFn:
    """The SAMPLER for k-sampler ``name`` (a KSAMPLER_NAMES entry, or uni_pc/uni_pc_bh2) with options."""
    function = SAMPLERS.get(name)
    if function is None:
        raise SamplerNotAvailable(
            f"no sampler function is named {name!r}; expected one of {', '.join(SAMPLERS)} "
            f"(for ddim, ask sampler_object, which runs euler with fresh inpaint noise)"
        )
    return KSamplerFn(function, dict(extra_options or {}), dict(inpaint_options or {}), name)


def sampler_object(name: str) -> KSamplerFn:
    """The SAMPLER that KSampler / KSamplerSelect use for ``name`` (any of ComfyUI's 44 names)."""
    if name not in SAMPLER_NAMES:
        raise SamplerNotAvailable(f"unknown sampler {name!r}; expected one of {', '.join(SAMPLER_NAMES)}")
    if name == "ddim":
        return ksampler("euler", inpaint_options={"random": True})
    return ksampler(name)
