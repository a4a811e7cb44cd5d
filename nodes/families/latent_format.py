"""LatentFormat: what a family's latent space is, for the sampler, previews and latent checks.

The VAE produces "raw" latents; the denoiser works on ``(raw - shift) * scale_factor`` (ComfyUI's
``LatentFormat.process_in``), and ``process_out`` is the inverse. Previews decode a latent either
with a small linear map (``rgb_factors``: one RGB row per latent channel, plus ``rgb_bias``) or
with the family's TAESD decoder (``taesd_decoder``: the file stem ComfyUI uses in
``models/vae_approx``). The numbers are ComfyUI's (``comfy/latent_formats.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor

RGB = tuple[float, float, float]


@dataclass(frozen=True)
class LatentFormat:
    """One family's latent space (see the module docstring)."""

    channels: int
    scale_factor: float
    shift: float = 0.0
    rgb_factors: tuple[RGB, ...] = ()
    rgb_bias: RGB = (0.0, 0.0, 0.0)
    taesd_decoder: str | None = None
    empty_node: str = "EmptyLatentImage"  # ComfyUI's node that makes empty latents of this space
    downscale: int = 8  # image pixels per latent cell (ComfyUI's spacial_downscale_ratio)

    def process_in(self, latent: Tensor) -> Tensor:
        """VAE latent -> model space: ``(latent - shift) * scale_factor``."""
        if self.shift:
            latent = latent - self.shift
        return latent * self.scale_factor

    def process_out(self, latent: Tensor) -> Tensor:
        """Model space -> VAE latent: ``latent / scale_factor + shift``."""
        out = latent / self.scale_factor
        return out + self.shift if self.shift else out

    @property
    def tag(self) -> str:
        """What a latent made in this space is tagged with (``latent_space``): channels and scale."""
        return f"{self.channels}x{self.scale_factor}"


SD15_LATENT = LatentFormat(
    channels=4,
    scale_factor=0.18215,
    rgb_factors=(
        (0.3512, 0.2297, 0.3227),
        (0.3250, 0.4974, 0.2350),
        (-0.2829, 0.1762, 0.2721),
        (-0.2120, -0.2616, -0.7177),
    ),
    taesd_decoder="taesd_decoder",
)

SDXL_LATENT = LatentFormat(
    channels=4,
    scale_factor=0.13025,
    rgb_factors=(
        (0.3651, 0.4232, 0.4341),
        (-0.2533, -0.0042, 0.1068),
        (0.1076, 0.1111, -0.0362),
        (-0.3165, -0.2492, -0.2188),
    ),
    rgb_bias=(0.1084, -0.0175, -0.0011),
    taesd_decoder="taesdxl_decoder",
)

# ComfyUI's .latent files written before "latent_format_version_0" hold latents multiplied by SD1's
# scale; LoadLatent divides them back (comfy's nodes.py LoadLatent). A file-format fact kept here
# because it is a family's number.
LEGACY_LATENT_FILE_SCALE = SD15_LATENT.scale_factor
