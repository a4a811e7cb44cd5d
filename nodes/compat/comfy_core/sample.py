"""Stand-in for ComfyUI's ``comfy.sample``: the noise and latent helpers packs call around sampling.

``prepare_noise`` is Loom's own (``nodes.diffusion.noise``: the same draws as ComfyUI's for a seed and
a ``batch_index``); ``fix_empty_latent_channels`` is Loom's ``fit_empty_latent`` on the MODEL
handle's latent format. Sampling itself is ``nodes.common_ksampler`` (Loom's KSampler nodes).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from nodes.diffusion.noise import prepare_noise as loom_prepare_noise
from nodes.latent.vae import fit_empty_latent


def prepare_noise(
    latent_image: torch.Tensor, seed: int, noise_inds: Sequence[int] | None = None
) -> torch.Tensor:
    """Initial noise for ``latent_image`` from ``seed`` (``noise_inds``: a LATENT's ``batch_index``)."""
    return loom_prepare_noise(latent_image, seed, noise_inds)


def fix_empty_latent_channels(model: Any, latent_image: torch.Tensor, *_: Any) -> torch.Tensor:
    """An all-zero ``latent_image`` widened to the MODEL handle's latent channels (Loom's
    ``fit_empty_latent``, what its KSampler does); any other latent is returned unchanged."""
    fmt = getattr(model, "latent_format", None)
    if fmt is None:
        return latent_image
    fitted: torch.Tensor = fit_empty_latent({"samples": latent_image}, fmt)["samples"]
    return fitted


def sample(model: Any, noise: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """ComfyUI's ``comfy.sample.sample`` from given noise: not Loom's way (its KSampler draws the
    noise from the seed). Packs wrap this name at import (Impact); calling it explains the way."""
    raise NotImplementedError(
        "comfy.sample.sample (sampling from a given noise tensor over ComfyUI's model objects) is not "
        "provided by Loom; sample with nodes.common_ksampler(model, seed, steps, cfg, sampler_name, "
        "scheduler, positive, negative, latent), which runs Loom's KSampler"
    )


sample_custom = sample

__all__ = ["prepare_noise", "fix_empty_latent_channels", "sample", "sample_custom"]
