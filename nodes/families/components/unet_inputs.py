"""Extra UNet input channels, by what the UNet's first convolution takes (its variant):

- ``inpaint`` (latent channels + 1): the mask, then the masked image in model space (ComfyUI's
  ``c_concat`` of an inpainting model): from InpaintModelConditioning (``concat_mask`` /
  ``concat_latent_image``), else from the sampled latent and its noise mask (``denoise_mask`` /
  ``latent_image``), else a full mask and ComfyUI's blank image;
- ``ip2p`` (2 × latent channels): InstructPix2Pix's source image latent (``concat_latent_image``
  from InstructPixToPixConditioning), as the VAE encoded it (not scaled into model space), zeros
  without one; resized to the latent (bilinear, centre crop to the aspect) and to the batch as
  ComfyUI's ``IP2P.concat_cond`` does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from nodes.core.sampling_hooks import ConditioningError

if TYPE_CHECKING:
    from torch import Tensor

    from nodes.families.latent_format import LatentFormat

# ComfyUI's "zero image" in SD latent space: the masked image of an inpainting UNet given no image
BLANK_INPAINT_LATENT = (0.8223, -0.6876, 0.6364, 0.1380)


def concat_kind(in_channels: int, latent_channels: int) -> str:
    """The UNet variant from its input width: ``"inpaint"``, ``"ip2p"`` or ``"none"``."""
    extra = int(in_channels) - int(latent_channels)
    if extra == 0:
        return "none"
    if extra == latent_channels:
        return "ip2p"
    if extra == latent_channels + 1:
        return "inpaint"
    raise ConditioningError(
        f"a UNet with {in_channels} input channels for {latent_channels}-channel latents is "
        "neither an inpainting nor an InstructPix2Pix model; Loom cannot feed its extra inputs"
    )


@dataclass
class ConcatSource:
    """The entries' extras a UNet's extra channels are built from, built once per kind."""

    extras: tuple[Mapping[str, Any], ...]  # one per entry; () = no inputs at all
    batch: int  # rows per entry
    latent: tuple[int, int]
    latent_format: LatentFormat | None
    built: dict[str, Any] = field(default_factory=dict)

    def build(self, kind: str) -> Tensor:
        if kind not in self.built:
            if kind == "ip2p":
                parts = [ip2p_concat(e, self.batch, self.latent) for e in (self.extras or ({},))]
            else:
                parts = [
                    inpaint_concat(e, self.batch, self.latent, self.latent_format)
                    for e in (self.extras or ({},))
                ]
            self.built[kind] = torch.cat(parts)
        return self.built[kind]


def resize_to_batch(t: Tensor, batch: int) -> Tensor:
    """ComfyUI's ``resize_to_batch_size``: pick rows spread evenly over the input batch."""
    n = t.shape[0]
    if n == batch:
        return t
    if batch <= 1:
        return t[:batch]
    if batch < n:
        scale = (n - 1) / (batch - 1)
        index = [min(round(i * scale), n - 1) for i in range(batch)]
    else:
        scale = n / batch
        index = [min(math.floor((i + 0.5) * scale), n - 1) for i in range(batch)]
    return t[index]


def center_resize(t: Tensor, size: tuple[int, int]) -> Tensor:
    """ComfyUI's ``common_upscale(..., "bilinear", "center")``: crop to the target aspect, resize."""
    h, w = t.shape[-2:]
    old, new = w / h, size[1] / size[0]
    if old > new:
        x = round((w - w * (new / old)) / 2)
        t = t[..., :, x : w - x]
    elif old < new:
        y = round((h - h * (old / new)) / 2)
        t = t[..., y : h - y, :]
    return F.interpolate(t, size=size, mode="bilinear", align_corners=False)


def ip2p_concat(extras: Mapping[str, Any], batch: int, latent: tuple[int, int]) -> Tensor:
    image = extras.get("concat_latent_image")
    if image is None:
        channels = extras["latent_image"].shape[1] if extras.get("latent_image") is not None else 4
        return torch.zeros(batch, channels, *latent)
    image = image.float()
    if tuple(image.shape[-2:]) != latent:
        image = center_resize(image, latent)
    return resize_to_batch(image, batch)


def inpaint_concat(
    extras: Mapping[str, Any], batch: int, latent: tuple[int, int], latent_format: LatentFormat | None
) -> Tensor:
    """An inpainting UNet's extra input channels (see the module docstring)."""
    image = extras.get("concat_latent_image")
    if image is not None and latent_format is not None:
        image = latent_format.process_in(image.float())
    elif image is None:
        image = extras.get("latent_image")
    mask = extras.get("concat_mask", extras.get("denoise_mask"))

    def fit(t: Tensor) -> Tensor:
        t = t.float()
        if tuple(t.shape[-2:]) != latent:
            t = F.interpolate(t, size=latent, mode="bilinear", align_corners=False)
        if t.shape[0] != batch and batch % t.shape[0]:
            raise ConditioningError(
                f"the inpainting image or mask has a batch of {t.shape[0]} but the "
                f"latent has {batch}; give one image or one per latent"
            )
        return t.repeat(batch // t.shape[0], 1, 1, 1) if t.shape[0] != batch else t

    if image is None or mask is None:  # no noise mask: ComfyUI's full mask and blank image
        mask_t = torch.ones(batch, 1, *latent)
        image_t = torch.tensor(BLANK_INPAINT_LATENT).reshape(1, -1, 1, 1).expand(batch, -1, *latent)
    else:
        mask_t = fit(mask.reshape(-1, 1, *mask.shape[-2:])[:, :1]).round()
        image_t = fit(image)
    return torch.cat([mask_t, image_t], dim=1)
