"""What ComfyUI's Wan conditioning nodes (``comfy_extras/nodes_wan.py``) share, for
:mod:`nodes.family_nodes.wan_nodes` and :mod:`nodes.family_nodes.wan_vace`: the frames are resized
as ComfyUI's ``common_upscale(..., "bilinear", "center")`` does, a frame sequence [T, H, W, C] is
encoded by the video VAE as one clip ([1, C, (T - 1) // 4 + 1, H / 8, W / 8], the posterior's mode,
raw latents), and the values are set on every conditioning entry as ComfyUI's
``conditioning_set_values`` sets them (replaced, or with ``append`` added to the lists already
there)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch

from engine.context import NodeContext
from engine.node import Node, OutputSizes
from engine.schema import CONDITIONING, INT, LATENT, VAE, Input, Output
from nodes.core.cond import Conditioning
from nodes.core.resize import resize_image
from nodes.core.tensor_sizes import video_latent_size
from nodes.latent.vae import MAX_RESOLUTION, LatentError, crop_to_8, vae_latent_channels

CATEGORY = "conditioning/video_models"


class WanInputError(ValueError):
    """An input a Wan conditioning node cannot use; the message says what to connect instead."""


def size_inputs(length: int = 81) -> tuple[Input, ...]:
    """positive, negative, vae, width, height, length, batch_size: the head every Wan node shares."""
    return (
        Input("positive", CONDITIONING, "Positive conditioning (the prompt)."),
        Input("negative", CONDITIONING, "Negative conditioning."),
        Input("vae", VAE, "The video VAE (Wan's) that encodes the frames."),
        Input("width", INT, "Video width in pixels.", default=832, min=16, max=MAX_RESOLUTION, step=16),
        Input("height", INT, "Video height in pixels.", default=480, min=16, max=MAX_RESOLUTION, step=16),
        Input(
            "length",
            INT,
            "Frames of the video (4k + 1 fills the latent frames exactly).",
            default=length,
            min=1,
            max=MAX_RESOLUTION,
            step=4,
        ),
        Input("batch_size", INT, "Videos to make at once.", default=1, min=1, max=4096),
    )


COND_OUTPUTS = (
    Output("positive", CONDITIONING, "Positive conditioning with the video inputs set."),
    Output("negative", CONDITIONING, "Negative conditioning with the video inputs set."),
    Output("latent", LATENT, "Empty (zero) video latents to sample."),
)


def latent_frames(length: int) -> int:
    """Latent frames of a ``length``-frame video: the first frame, then one per 4 frames."""
    return (length - 1) // 4 + 1


def frames(image: Any, name: str) -> torch.Tensor:
    """``image`` checked as an IMAGE [frames, H, W, 3 or 4]; its RGB channels."""
    if not isinstance(image, torch.Tensor) or image.ndim != 4:
        shape = tuple(image.shape) if isinstance(image, torch.Tensor) else type(image).__name__
        raise WanInputError(
            f"input '{name}' must be an IMAGE [frames, height, width, channels]; got {shape}. Connect a "
            "LoadImage, LoadVideo → GetVideoComponents or other IMAGE output"
        )
    if image.shape[-1] < 3:
        raise WanInputError(
            f"input '{name}' has {image.shape[-1]} colour channel(s); the video VAE encodes RGB frames "
            "(3 channels, a 4th alpha channel is dropped). Convert it to RGB first (e.g. a mask through "
            "MaskToImage, or the image through an RGB conversion)"
        )
    return image[..., :3]


def fit(image: torch.Tensor, width: int, height: int) -> torch.Tensor:
    """IMAGE frames resized to ``width`` × ``height``: bilinear after a centre crop to that aspect
    (ComfyUI's ``common_upscale(..., "bilinear", "center")``)."""
    return resize_image(image.float(), width, height, "bilinear", "center")


def video_module(module: Any) -> Any:
    """``module`` if it is a video (3-D) VAE, else a teaching error."""
    config = getattr(module, "config", None)
    if getattr(config, "temperal_downsample", None) is None and not getattr(module, "loom_video", False):
        raise WanInputError(
            "input 'vae' encodes single images, but the Wan video nodes need the Wan video VAE (3-D, "
            "4 frames per latent frame). Load wan_2.1_vae.safetensors (or, for Wan 2.2 5B, "
            "wan2.2_vae.safetensors) with VAELoader"
        )
    return module


def cell(module: Any) -> int:
    """Pixels per latent cell side of the video VAE ``module``: what Loom's module says, else the
    diffusers config's ``scale_factor_spatial`` (Wan 2.2's VAE: 16), else 8."""
    config = getattr(module, "config", None)
    return int(getattr(module, "loom_downscale", None) or getattr(config, "scale_factor_spatial", None) or 8)


@torch.no_grad()
def encode_clip(module: Any, clip: torch.Tensor) -> torch.Tensor:
    """Frames [T, H, W, 3] in 0..1 -> raw latents [1, C, (T - 1) // 4 + 1, h, w], cropped to the
    VAE's multiple first (centred, as ComfyUI's VAE.encode)."""
    clip = crop_to_8(clip, cell(module))
    param = next(module.parameters())
    pixels = clip[..., :3].permute(3, 0, 1, 2).unsqueeze(0).to(param) * 2 - 1  # (1, 3, T, H, W)
    dist = module.encode(pixels, return_dict=False)[0]
    return dist.mode().float().cpu()


def encode_clips(ctx: NodeContext, vae: Any, clips: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Each of ``clips`` encoded by ``vae`` (one residency for all)."""
    with ctx.models.use(vae) as module:
        video = video_module(module)
        return [encode_clip(video, clip) for clip in clips]


def vae_layout(ctx: NodeContext, vae: Any) -> tuple[int, int]:
    """(latent channels, pixels per latent cell) of the video VAE ``vae`` (ComfyUI's
    ``vae.latent_channels`` and ``vae.spacial_compression_encode()``)."""
    with ctx.models.use(vae) as module:
        video = video_module(module)
        channels = vae_latent_channels(video) or getattr(getattr(video, "config", None), "z_dim", None)
        if channels is None:
            raise LatentError("input 'vae': this VAE does not say how many latent channels it makes")
        return int(channels), cell(video)


def with_values(conditioning: Conditioning, values: dict[str, Any], append: bool = False) -> Conditioning:
    """Every entry with ``values`` set in its extras (ComfyUI's ``conditioning_set_values``); with
    ``append``, a list value is added after the list the entry already holds under that key."""
    out = []
    for entry in conditioning:
        extras = dict(entry.extras)
        for key, value in values.items():
            old = extras.get(key) if append else None
            extras[key] = [*old, *value] if old is not None else value
        out.append(replace(entry, extras=extras))
    return out


def both(
    positive: Conditioning, negative: Conditioning, values: dict[str, Any], append: bool = False
) -> tuple[Conditioning, Conditioning]:
    """``values`` set on both sides."""
    return with_values(positive, values, append), with_values(negative, values, append)


def frame_mask(latent_t: int, h: int, w: int, start: int | None, end: int | None) -> torch.Tensor:
    """The ``concat_mask`` of the first/last-frame nodes: [1, 4, latent_t, h, w], 0 on known frames
    (the ``start`` first video frames and the 3 after them; the ``end`` last of 4·latent_t frames),
    1 where the model generates; each latent frame's 4 video frames on the channel axis."""
    mask = torch.ones(1, 1, latent_t * 4, h, w)
    if start is not None:
        mask[:, :, : start + 3] = 0.0
    if end is not None:
        mask[:, :, -end:] = 0.0
    return mask.view(1, latent_t, 4, h, w).transpose(1, 2)


def zero_latent(batch: int, channels: int, length: int, height: int, width: int, scale: int) -> torch.Tensor:
    """The empty video latent [batch, channels, latent frames, height / scale, width / scale]."""
    return torch.zeros(batch, channels, latent_frames(length), height // scale, width // scale)


class VideoLatentNode(Node):
    """A Wan node whose LATENT output (``LATENT_OUTPUT``) is [batch, ``LATENT_CHANNELS``, latent frames,
    height / ``LATENT_SCALE``, width / ``LATENT_SCALE``]: it declares that size before it runs."""

    LATENT_CHANNELS = 16
    LATENT_SCALE = 8
    LATENT_OUTPUT = 2

    @classmethod
    def estimate_outputs(
        cls, *, width: Any = None, height: Any = None, length: Any = None, batch_size: Any = None, **_: Any
    ) -> OutputSizes:
        sizes: list[Any] = [None] * len(cls.SCHEMA.outputs)
        sizes[cls.LATENT_OUTPUT] = video_latent_size(
            batch_size, cls.LATENT_CHANNELS, length, height, width, cls.LATENT_SCALE
        )
        return tuple(sizes)
