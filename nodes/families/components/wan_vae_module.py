"""The module the Wan VAE kind builds: diffusers' ``AutoencoderKLQwenImage`` (the Wan 2.1 causal 3-D
VAE that Qwen-Image uses) taking and giving the 4-D image tensors Loom's VAE nodes use.

The 3-D VAE works on (B, C, T, H, W); an image is one frame (T = 1). ``encode`` and ``decode`` add
that axis on the way in and remove it on the way out, so VAEEncode, VAEDecode and the tiled variants
treat it like the 2-D KL VAE; 5-D clips (B, C, T, H, W) pass through to the causal video encode and
decode (``nodes.latent.video_vae``), which ``loom_temporal_compression`` announces. Imported only when a module is built (it imports diffusers)."""

from __future__ import annotations

from typing import Any

import torch
from diffusers import AutoencoderKLQwenImage
from diffusers.models.autoencoders.vae import DecoderOutput, DiagonalGaussianDistribution
from diffusers.models.modeling_outputs import AutoencoderKLOutput


class QwenImageVae2D(AutoencoderKLQwenImage):  # type: ignore[misc]
    """``AutoencoderKLQwenImage`` on single images (see the module docstring)."""

    @property
    def latent_channels(self) -> int:
        return int(self.config.z_dim)  # type: ignore[attr-defined]

    @property
    def loom_temporal_compression(self) -> int:
        """Pixel frames per latent frame: 2 per temporal downsampling stage (Wan: 4)."""
        return 2 ** sum(bool(d) for d in self.config.temperal_downsample)  # type: ignore[attr-defined]

    def encode(self, x: torch.Tensor, return_dict: bool = True) -> Any:
        parent: Any = super()
        if x.ndim != 4:
            return parent.encode(x, return_dict=return_dict)
        posterior = parent.encode(x.unsqueeze(2), return_dict=False)[0]
        flat = DiagonalGaussianDistribution(posterior.parameters.squeeze(2))
        return AutoencoderKLOutput(latent_dist=flat) if return_dict else (flat,)

    def decode(self, z: torch.Tensor, return_dict: bool = True, **kwargs: Any) -> Any:
        parent: Any = super()
        if z.ndim != 4:
            return parent.decode(z, return_dict=return_dict, **kwargs)
        image = parent.decode(z.unsqueeze(2), return_dict=False)[0].squeeze(2)
        return DecoderOutput(sample=image) if return_dict else (image,)
