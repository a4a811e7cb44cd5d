"""Video through a causal video VAE (the Wan VAEs): IMAGE frames ⇄ 5-D latents, as ComfyUI's ``VAE``.

A VAE module that compresses time says so (``loom_temporal_compression``, 4 for Wan: latent frame 0
is pixel frame 0, each further latent frame four pixel frames); a 2-D VAE says nothing (1).

- **Encode**: an IMAGE batch [N, H, W, C] is the frames of one clip, [1, C, N, H, W] (ComfyUI's
  ``VAE.encode`` for a 3-D VAE), encoded causally (frame 0, then chunks of 4 with the cache) to
  [1, z, (N - 1) // 4 + 1, h, w]. A length that is not 4k + 1 is encoded as ComfyUI does: the
  frames after the last whole chunk are not used (logged).
- **Decode**: [B, z, T, h, w] → [B, 3, 4 (T - 1) + 1, H, W] → the IMAGE batch of every frame of
  every clip, [B · F, H, W, 3] (ComfyUI's VAEDecode flattens the clips into the batch).
- **Tiled decode** (:func:`decode_video_tiled`, ComfyUI's ``decode_tiled_3d``): tiles in time and
  space, each decoded afresh and blended (:func:`nodes.latent.tiling.tiled_video`), so a long clip's
  decode holds one tile's activations instead of the whole clip's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from engine.schema import INT, Input
from nodes.latent.tiling import tiled_video

TEMPORAL_SIZE = Input(  # VAEDecodeTiled's (ComfyUI's widgets)
    "temporal_size",
    INT,
    "Only used for video VAEs: amount of frames to decode at a time.",
    default=64,
    min=8,
    max=4096,
    step=4,
)
TEMPORAL_OVERLAP = Input(
    "temporal_overlap",
    INT,
    "Only used for video VAEs: amount of frames to overlap.",
    default=8,
    min=4,
    max=4096,
    step=4,
)

log = logging.getLogger(__name__)


def temporal_compression(vae: Any) -> int:
    """Pixel frames per latent frame of the VAE module ``vae`` (1: an image VAE)."""
    return int(getattr(vae, "loom_temporal_compression", 1))


def frames_of(latent_frames: int, compression: int) -> int:
    """Pixel frames a causal VAE decodes ``latent_frames`` into (ComfyUI's ``max(0, 4 t - 3)``)."""
    return max(0, latent_frames * compression - (compression - 1))


def latent_frames_of(frames: int, compression: int) -> int:
    """Latent frames ``frames`` pixel frames encode into (the causal VAE's ``1 + (n - 1) // 4``)."""
    return 1 + (frames - 1) // compression if frames > 0 else 0


def to_pixels(vae: Any, image: torch.Tensor) -> torch.Tensor:
    """IMAGE [N, H, W, C] in 0..1 → one clip [1, 3, N, H, W] in -1..1 in the module's dtype."""
    param = next(vae.parameters())
    return (image[..., :3].permute(3, 0, 1, 2).unsqueeze(0).to(param) * 2 - 1).contiguous()


def to_image(pixels: torch.Tensor) -> torch.Tensor:
    """Decoded clips [B, 3, F, H, W] in -1..1 → IMAGE [B · F, H, W, 3] in 0..1."""
    image = (pixels.float() / 2 + 0.5).clamp(0, 1).permute(0, 2, 3, 4, 1)
    return image.reshape(-1, *image.shape[2:]).cpu()


@torch.no_grad()
def encode_video(vae: Any, image: torch.Tensor) -> torch.Tensor:
    """IMAGE frames [N, H, W, C] → the clip's raw latents [1, z, T, h, w] (the posterior's mode)."""
    compression = temporal_compression(vae)
    used = frames_of(latent_frames_of(image.shape[0], compression), compression)
    if used != image.shape[0]:
        log.warning(
            "VAE encode: %d frames are not 4k+1; the causal VAE encodes the first %d (as ComfyUI)",
            image.shape[0],
            used,
        )
    dist = vae.encode(to_pixels(vae, image), return_dict=False)[0]
    return dist.mode().float().cpu()


@torch.no_grad()
def decode_video(vae: Any, samples: torch.Tensor) -> torch.Tensor:
    """Raw video latents [B, z, T, h, w] → IMAGE [B · F, H, W, 3] of every frame."""
    param = next(vae.parameters())
    return to_image(vae.decode(samples.to(param), return_dict=False)[0])


def decode_video_tiled(
    vae: Any,
    samples: torch.Tensor,
    *,
    tile: int,
    overlap: int,
    tile_t: int,
    overlap_t: int,
    downscale: int,
    check: Callable[[], None] = lambda: None,
) -> torch.Tensor:
    """:func:`decode_video` tile by tile: ``tile_t`` latent frames (overlapping by ``overlap_t``) and
    ``tile`` latent pixels per side (overlapping by ``overlap``), blended as ComfyUI's
    ``decode_tiled_3d``."""
    compression = temporal_compression(vae)
    param = next(vae.parameters())

    def fn(z: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return vae.decode(z.to(param), return_dict=False)[0].float().cpu()

    def space(n: int) -> int:
        return n * downscale

    pixels = tiled_video(
        samples,
        fn,
        (tile_t, tile, tile),
        (overlap_t, overlap, overlap),
        (lambda t: frames_of(t, compression), space, space),
        (lambda t: t * compression, space, space),
        check,
    )
    return to_image(pixels)
