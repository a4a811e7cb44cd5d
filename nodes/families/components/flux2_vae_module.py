"""The Flux.2 VAE module whose latent is the model's (imported only when a Flux.2 VAE is built):
diffusers' ``AutoencoderKLFlux2`` with ``encode`` returning a posterior whose ``mode``/``sample`` are
2×2-patchified and BatchNorm-normalised (128 channels at 1/16), and ``decode`` taking such latents.
The formulas are diffusers' Flux2 pipelines' (and ComfyUI's ``batch_norm_latent``)."""

from __future__ import annotations

from typing import Any, cast

import torch
from diffusers import AutoencoderKLFlux2
from diffusers.models.autoencoders.vae import DecoderOutput


def patchify(z: torch.Tensor) -> torch.Tensor:
    """(B, C, H, W) → (B, 4C, H/2, W/2); channel ``c·4 + row·2 + col`` of each 2×2 patch."""
    b, c, h, w = z.shape
    return z.reshape(b, c, h // 2, 2, w // 2, 2).permute(0, 1, 3, 5, 2, 4).reshape(b, c * 4, h // 2, w // 2)


def unpatchify(z: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`patchify`."""
    b, c, h, w = z.shape
    return z.reshape(b, c // 4, 2, 2, h, w).permute(0, 1, 4, 2, 5, 3).reshape(b, c // 4, h * 2, w * 2)


class PatchedPosterior:
    """The VAE posterior seen in the model's latent space."""

    def __init__(self, vae: Flux2LatentVAE, dist: Any) -> None:
        self.vae, self.dist = vae, dist

    def mode(self) -> torch.Tensor:
        return self.vae.normalise(patchify(self.dist.mode()))

    def sample(self, generator: torch.Generator | None = None) -> torch.Tensor:
        return self.vae.normalise(patchify(self.dist.sample(generator)))


class Flux2LatentVAE(AutoencoderKLFlux2):  # type: ignore[misc]
    """``AutoencoderKLFlux2`` that encodes to and decodes from 128-channel patchified latents."""

    config: Any
    bn: Any

    @property
    def loom_latent_channels(self) -> int:
        """The channels of the latents ``decode`` takes (4 × the KL latent channels)."""
        return 4 * int(self.config.latent_channels)

    @property
    def loom_downscale(self) -> int:
        """Image pixels per latent pixel and side: the KL VAE's 8, times the 2×2 patches."""
        return 2 ** (len(self.config.block_out_channels) - 1) * 2

    def _stats(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean = self.bn.running_mean.view(1, -1, 1, 1).to(like)
        std = torch.sqrt(self.bn.running_var.view(1, -1, 1, 1) + self.config.batch_norm_eps).to(like)
        return mean, std

    def normalise(self, z: torch.Tensor) -> torch.Tensor:
        mean, std = self._stats(z)
        return (z - mean) / std

    def encode(self, x: torch.Tensor, return_dict: bool = True) -> Any:
        h, w = x.shape[-2] // 16 * 16, x.shape[-1] // 16 * 16  # whole 2×2 patches of the 1/8 latent
        dist = cast(Any, super()).encode(x[..., :h, :w], return_dict=False)[0]
        return (PatchedPosterior(self, dist),)

    def decode(self, z: torch.Tensor, return_dict: bool = True, generator: Any = None) -> Any:
        mean, std = self._stats(z)
        out = cast(Any, super()).decode(unpatchify(z * std + mean), return_dict=False)[0]
        return DecoderOutput(sample=out) if return_dict else (out,)
