"""Latents: empty latents, resizing, VAE decode/encode (also tiled), inpainting masks.

``LATENT`` is ComfyUI's dict ``{"samples": [B, C, h, w], "noise_mask"?: [B|1, 1, H, W] (1 = repaint),
"batch_index"?: [int]}``. As in ComfyUI, ``samples`` are the VAE's raw latents (not multiplied
by the model's latent scale; the sampler scales on the way in and out), so any VAE decodes them
and third-party latent nodes see the values they expect. Loom adds ``latent_space`` (channels and
latent scale: the family's ``LatentFormat.tag``) and ``latent_family`` to the latents a sampler produced, so an
SDXL latent reaching an SD1.5 sampler fails with a clear message instead of a garbage image.
``IMAGE`` is float [B, H, W, C] in 0..1 and ``MASK`` [B, H, W].
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from engine.context import NodeContext
from engine.node import Node, OutputSizes
from engine.schema import COMBO, FLOAT, IMAGE, INT, LATENT, MASK, VAE, Input, NodeSchema, Output
from nodes.core.resize import resize
from nodes.core.tensor_sizes import decoded_size, latent_resized, latent_size, scaled_by
from nodes.latent.tiling import tiled
from nodes.latent.video_vae import (
    TEMPORAL_OVERLAP,
    TEMPORAL_SIZE,
    decode_video,
    decode_video_tiled,
    encode_video,
    temporal_compression,
)

MAX_RESOLUTION = 16384
UPSCALE_METHODS = ("nearest-exact", "bilinear", "area", "bicubic", "bislerp")  # ComfyUI's, for latents


class LatentError(ValueError):
    """A latent or image that a node cannot use; the message says how to fix it."""


def latent_space(family: Any) -> str:
    return str(family.latent_format.tag)


def tag_latent(latent: dict, family: Any) -> dict:
    """``latent`` (a new dict) tagged with the latent space of ``family``."""
    return {**latent, "latent_space": latent_space(family), "latent_family": family.title}


def check_latent_for(latent: dict, family: Any, input_name: str) -> None:
    """Raise if ``latent`` was made in another latent space than ``family``'s."""
    if not isinstance(latent, dict) or "samples" not in latent:
        raise LatentError(f"{input_name} is not a LATENT dict with 'samples'; connect a LATENT output")
    made = latent.get("latent_space")
    if made is not None and made != latent_space(family):
        raise LatentError(
            f"{input_name} was made by a {latent.get('latent_family', 'different')} model (latent space {made}) "
            f"but this is a {family.title} model (latent space {latent_space(family)}); decode it with its own "
            f"VAE and re-encode with this model's VAE, or start from EmptyLatentImage"
        )


def fit_empty_latent(latent: dict, fmt: Any) -> dict:
    """ComfyUI's ``fix_empty_latent_channels``: an all-zero 4-D latent with another channel count
    than the model's latent format ``fmt`` (EmptyLatentImage's 4 channels fed to a 16-channel Flux
    model, as ComfyUI's own Flux schnell example does) becomes zeros of ``fmt.channels``, and, as
    the empty-latent nodes make 1/8-size latents, is resized to ``fmt.downscale`` (Flux.2: 1/16);
    any other latent is returned as it is, so a real latent of the wrong width still meets the
    sampler's channel check."""
    samples = latent.get("samples") if isinstance(latent, dict) else None
    if (
        not isinstance(samples, torch.Tensor)
        or samples.ndim != 4
        or samples.shape[1] == fmt.channels
        or torch.count_nonzero(samples) > 0
    ):
        return latent
    h, w = (round(n * 8 / fmt.downscale) for n in samples.shape[2:])
    return {**latent, "samples": samples.new_zeros((samples.shape[0], fmt.channels, h, w))}


def vae_latent_channels(vae: Any) -> int | None:
    """How many channels the latents of the VAE module ``vae`` have (None: it does not say)."""
    channels = getattr(vae, "loom_latent_channels", None) or getattr(
        getattr(vae, "config", None), "latent_channels", None
    )
    return None if channels is None else int(channels)


def check_latent_for_vae(vae: Any, samples: torch.Tensor, made_by: str | None = None) -> None:
    """Raise unless the VAE module ``vae`` decodes latents of ``samples``' channel count. VAE nodes
    check only this, never the latent scale: a VAE works on raw latents, so a separate VAE file of
    the right width decodes any family's latents (an SD3 VAE file is read as a 16-channel VAE)."""
    expected = vae_latent_channels(vae)
    if expected is not None and samples.shape[1] != expected:
        source = f" (made by a {made_by} model)" if made_by else ""
        raise LatentError(
            f"the latents{source} have {samples.shape[1]} channels but this VAE decodes "
            f"{expected}-channel latents; use the VAE that belongs to the model that made them "
            "(a 16-channel model needs its 16-channel VAE, e.g. ae.safetensors)"
        )


@torch.no_grad()
def decode(vae: Any, samples: torch.Tensor) -> torch.Tensor:
    """Raw latents [B, C, h, w] -> IMAGE [B, H, W, 3] in 0..1 (as diffusers' pipelines post-process)."""
    check_latent_for_vae(vae, samples)
    if samples.ndim == 5:  # a video latent: every frame of every clip (nodes.latent.video_vae)
        return decode_video(vae, samples)
    param = next(vae.parameters())
    pixels = vae.decode(samples.to(param), return_dict=False)[0]  # (B, 3, H, W) in -1..1
    return (pixels.float() / 2 + 0.5).clamp(0, 1).permute(0, 2, 3, 1).cpu()


@torch.no_grad()
def encode(vae: Any, image: torch.Tensor) -> torch.Tensor:
    """IMAGE [B, H, W, C] -> raw latents [B, C, h, w] (the posterior's mode, as ComfyUI). Through a
    video VAE a batch of frames is one clip (:func:`nodes.latent.video_vae.encode_video`): [1, C, T,
    h, w], or [1, C, h, w] when it makes one latent frame (an image, as the image families take it)."""
    if temporal_compression(vae) > 1 and image.shape[0] > 1:
        latent = encode_video(vae, image)
        return latent[:, :, 0] if latent.shape[2] == 1 else latent
    param = next(vae.parameters())
    pixels = image[..., :3].permute(0, 3, 1, 2).to(param) * 2 - 1  # (B, 3, H, W)
    dist = vae.encode(pixels, return_dict=False)[0]
    return dist.mode().float().cpu()


def downscale(vae: Any) -> int:
    """How many pixels one latent pixel of ``vae`` covers per side (8; 16 for a VAE whose module says so)."""
    return int(getattr(vae, "loom_downscale", 8))


def crop_to_8(image: torch.Tensor, multiple: int = 8) -> torch.Tensor:
    """Centre-crop an IMAGE so both sides are multiples of ``multiple`` (what the VAE needs: 8, or 16)."""
    h, w = image.shape[1] // multiple * multiple, image.shape[2] // multiple * multiple
    if h == 0 or w == 0:
        raise LatentError(
            f"image is {image.shape[2]}x{image.shape[1]}; the VAE needs at least {multiple}x{multiple} pixels"
        )
    y, x = (image.shape[1] % multiple) // 2, (image.shape[2] % multiple) // 2
    return image[:, y : y + h, x : x + w, :]


class EmptyLatentImage(Node):
    SCHEMA = NodeSchema(
        node_id="EmptyLatentImage",
        display_name="Empty Latent Image",
        category="latent",
        description="A batch of empty (zero) latents of a given image size, for txt2img.",
        inputs=(
            Input(
                "width",
                INT,
                "Image width in pixels (multiple of 8).",
                default=512,
                min=16,
                max=MAX_RESOLUTION,
                step=8,
            ),
            Input(
                "height",
                INT,
                "Image height in pixels (multiple of 8).",
                default=512,
                min=16,
                max=MAX_RESOLUTION,
                step=8,
            ),
            Input("batch_size", INT, "Number of images.", default=1, min=1, max=4096),
        ),
        outputs=(Output("LATENT", LATENT, "Zero latents [batch, 4, height/8, width/8]."),),
    )

    @classmethod
    def validate_inputs(cls, **inputs: Any) -> bool | str:
        bad = [
            f"{k}={inputs[k]}"
            for k in ("width", "height")
            if isinstance(inputs.get(k), int) and inputs[k] % 8
        ]
        if bad:
            return (
                f"{', '.join(bad)} is not a multiple of 8; latents are 1/8 of the image, use e.g. 512 or 520"
            )
        return True

    def run(self, ctx: NodeContext, *, width: int, height: int, batch_size: int) -> tuple[dict]:
        message = self.validate_inputs(width=width, height=height)
        if message is not True:
            raise LatentError(str(message))
        return ({"samples": torch.zeros(batch_size, 4, height // 8, width // 8)},)

    @classmethod
    def estimate_outputs(
        cls, *, width: Any = None, height: Any = None, batch_size: Any = None, **_: Any
    ) -> OutputSizes:
        return (latent_size(batch_size, 4, height, width),)


class LatentUpscale(Node):
    SCHEMA = NodeSchema(
        node_id="LatentUpscale",
        display_name="Upscale Latent",
        category="latent",
        description="Resize latents to an image size (0 for one side keeps the aspect ratio).",
        inputs=(
            Input("samples", LATENT, "The latents to resize."),
            Input(
                "upscale_method", COMBO, "Interpolation.", options=UPSCALE_METHODS, default="nearest-exact"
            ),
            Input(
                "width",
                INT,
                "Target width in pixels; 0 = from height.",
                default=512,
                min=0,
                max=MAX_RESOLUTION,
                step=8,
            ),
            Input(
                "height",
                INT,
                "Target height in pixels; 0 = from width.",
                default=512,
                min=0,
                max=MAX_RESOLUTION,
                step=8,
            ),
            Input(
                "crop",
                COMBO,
                "Centre-crop to the target aspect first.",
                options=("disabled", "center"),
                default="disabled",
            ),
        ),
        outputs=(Output("LATENT", LATENT, "Resized latents."),),
    )

    def run(
        self, ctx: NodeContext, *, samples: dict, upscale_method: str, width: int, height: int, crop: str
    ) -> tuple[dict]:
        s = samples["samples"]
        if width == 0 and height == 0:
            return (samples,)
        width, height = upscale_target(width, height, s.shape[-1], s.shape[-2])
        return ({**samples, "samples": resize(s, width // 8, height // 8, upscale_method, crop)},)

    @classmethod
    def estimate_outputs(
        cls, *, samples: Any = None, width: Any = None, height: Any = None, **_: Any
    ) -> OutputSizes:
        if not isinstance(width, int) or not isinstance(height, int):
            return (None,)
        if width == 0 and height == 0:
            return (samples,)

        def to(w: int, h: int) -> tuple[int, int]:
            target_w, target_h = upscale_target(width, height, w, h)
            return target_w // 8, target_h // 8

        return (latent_resized(samples, to),)


def upscale_target(width: int, height: int, latent_w: int, latent_h: int) -> tuple[int, int]:
    """LatentUpscale's target in pixels (ComfyUI's rule): 0 on one side keeps the aspect ratio of the
    ``latent_w`` x ``latent_h`` latents; each side is at least 64 pixels."""
    if width == 0:
        height = max(64, height)
        return max(64, round(latent_w * height / latent_h)), height
    if height == 0:
        width = max(64, width)
        return width, max(64, round(latent_h * width / latent_w))
    return max(64, width), max(64, height)


class LatentUpscaleBy(Node):
    SCHEMA = NodeSchema(
        node_id="LatentUpscaleBy",
        display_name="Upscale Latent By",
        category="latent",
        description="Resize latents by a factor.",
        inputs=(
            Input("samples", LATENT, "The latents to resize."),
            Input(
                "upscale_method", COMBO, "Interpolation.", options=UPSCALE_METHODS, default="nearest-exact"
            ),
            Input("scale_by", FLOAT, "Factor.", default=1.5, min=0.01, max=8.0, step=0.01),
        ),
        outputs=(Output("LATENT", LATENT, "Resized latents."),),
    )

    def run(self, ctx: NodeContext, *, samples: dict, upscale_method: str, scale_by: float) -> tuple[dict]:
        s = samples["samples"]
        width, height = max(1, round(s.shape[-1] * scale_by)), max(1, round(s.shape[-2] * scale_by))
        return ({**samples, "samples": resize(s, width, height, upscale_method, "disabled")},)

    @classmethod
    def estimate_outputs(cls, *, samples: Any = None, scale_by: Any = None, **_: Any) -> OutputSizes:
        to = scaled_by(scale_by)
        return (latent_resized(samples, to) if to is not None else None,)


class VAEDecode(Node):
    SCHEMA = NodeSchema(
        node_id="VAEDecode",
        display_name="VAE Decode",
        category="latent",
        description="Decode latents into images with a VAE.",
        inputs=(Input("samples", LATENT, "The latents to decode."), Input("vae", VAE, "The VAE.")),
        outputs=(Output("IMAGE", IMAGE, "Images [B, H, W, 3] in 0..1."),),
    )

    def run(self, ctx: NodeContext, *, samples: dict, vae: Any) -> tuple[torch.Tensor]:
        with ctx.models.use(vae) as module:
            check_latent_for_vae(module, samples["samples"], samples.get("latent_family"))
            return (decode(module, samples["samples"]),)

    @classmethod
    def estimate_outputs(cls, *, samples: Any = None, **_: Any) -> OutputSizes:
        return (decoded_size(samples),)


class VAEEncode(Node):
    SCHEMA = NodeSchema(
        node_id="VAEEncode",
        display_name="VAE Encode",
        category="latent",
        description="Encode images into latents with a VAE (for img2img).",
        inputs=(
            Input("pixels", IMAGE, "Images to encode (cropped to multiples of 8)."),
            Input("vae", VAE, "The VAE."),
        ),
        outputs=(Output("LATENT", LATENT, "The latents."),),
    )

    def run(self, ctx: NodeContext, *, pixels: torch.Tensor, vae: Any) -> tuple[dict]:
        with ctx.models.use(vae) as module:
            return ({"samples": encode(module, crop_to_8(pixels, downscale(module)))},)


_TILE = Input("tile_size", INT, "Tile side in pixels.", default=512, min=64, max=4096, step=32)
_OVERLAP = Input(
    "overlap", INT, "Overlap between tiles in pixels (blended).", default=64, min=0, max=4096, step=32
)


class VAEDecodeTiled(Node):
    SCHEMA = NodeSchema(
        node_id="VAEDecodeTiled",
        display_name="VAE Decode (Tiled)",
        category="_for_testing",
        description="Decode latents tile by tile with blended overlaps, so large images fit in little memory.",
        inputs=(
            Input("samples", LATENT, "The latents to decode."),
            Input("vae", VAE, "The VAE."),
            _TILE,
            _OVERLAP,
            TEMPORAL_SIZE,
            TEMPORAL_OVERLAP,
        ),
        outputs=(Output("IMAGE", IMAGE, "Images [B, H, W, 3] in 0..1 (every frame of a video latent)."),),
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        samples: dict,
        vae: Any,
        tile_size: int,
        overlap: int,
        temporal_size: int = 64,
        temporal_overlap: int = 8,
    ) -> tuple[torch.Tensor]:
        with ctx.models.use(vae) as module:
            z = samples["samples"]
            check_latent_for_vae(module, z, samples.get("latent_family"))
            ratio = downscale(module)
            if z.ndim == 5:  # a video: ComfyUI's limits on the overlaps, then its 3-D tiling
                overlap = tile_size // 4 if tile_size < overlap * 4 else overlap
                temporal_overlap //= 2 if temporal_size < temporal_overlap * 2 else 1
                frames = temporal_compression(module)
                tile_t = max(2, temporal_size // frames)
                return (
                    decode_video_tiled(
                        module,
                        z,
                        tile=tile_size // ratio,
                        overlap=overlap // ratio,
                        tile_t=tile_t,
                        overlap_t=max(1, min(tile_t // 2, temporal_overlap // frames)),
                        downscale=ratio,
                        check=ctx.check_interrupt,
                    ),
                )

            def fn(z: torch.Tensor) -> torch.Tensor:
                ctx.check_interrupt()
                return decode(module, z).permute(0, 3, 1, 2)

            image = tiled(z, fn, tile_size // ratio, overlap // ratio, float(ratio))
        return (image.permute(0, 2, 3, 1),)


class VAEEncodeTiled(Node):
    SCHEMA = NodeSchema(
        node_id="VAEEncodeTiled",
        display_name="VAE Encode (Tiled)",
        category="_for_testing",
        description="Encode images tile by tile with blended overlaps.",
        inputs=(Input("pixels", IMAGE, "Images to encode."), Input("vae", VAE, "The VAE."), _TILE, _OVERLAP),
        outputs=(Output("LATENT", LATENT, "The latents."),),
    )

    def run(
        self, ctx: NodeContext, *, pixels: torch.Tensor, vae: Any, tile_size: int, overlap: int
    ) -> tuple[dict]:
        with ctx.models.use(vae) as module:

            def fn(x: torch.Tensor) -> torch.Tensor:
                ctx.check_interrupt()
                return encode(module, x.permute(0, 2, 3, 1))

            ratio = downscale(module)
            image = crop_to_8(pixels, ratio).permute(0, 3, 1, 2)
            samples = tiled(image, fn, tile_size, overlap, 1 / ratio)
        return ({"samples": samples},)


class SetLatentNoiseMask(Node):
    SCHEMA = NodeSchema(
        node_id="SetLatentNoiseMask",
        display_name="Set Latent Noise Mask",
        category="latent/inpaint",
        description="Only denoise where the mask is 1; the sampler keeps the rest of the latent.",
        inputs=(
            Input("samples", LATENT, "The latents."),
            Input("mask", MASK, "Where to repaint (1), [B, H, W]."),
        ),
        outputs=(Output("LATENT", LATENT, "The latents with a noise mask."),),
    )

    def run(self, ctx: NodeContext, *, samples: dict, mask: torch.Tensor) -> tuple[dict]:
        return ({**samples, "noise_mask": mask.reshape(-1, 1, mask.shape[-2], mask.shape[-1]).float()},)


class VAEEncodeForInpaint(Node):
    SCHEMA = NodeSchema(
        node_id="VAEEncodeForInpaint",
        display_name="VAE Encode (for Inpainting)",
        category="latent/inpaint",
        description="Grey out the masked pixels, encode, and attach the (grown) mask for the sampler.",
        inputs=(
            Input("pixels", IMAGE, "The image to inpaint."),
            Input("vae", VAE, "The VAE."),
            Input("mask", MASK, "Where to repaint (1), [B, H, W]."),
            Input(
                "grow_mask_by", INT, "Dilate the mask by this many pixels.", default=6, min=0, max=64, step=1
            ),
        ),
        outputs=(Output("LATENT", LATENT, "Latents with a noise mask."),),
    )

    def run(
        self, ctx: NodeContext, *, pixels: torch.Tensor, vae: Any, mask: torch.Tensor, grow_mask_by: int
    ) -> tuple[dict]:
        pixels = crop_to_8(pixels)
        m = mask.reshape(-1, 1, mask.shape[-2], mask.shape[-1]).float()
        m = F.interpolate(m, size=pixels.shape[1:3], mode="bilinear").clamp(0, 1)  # (B|1, 1, H, W)
        if grow_mask_by > 0:
            k = grow_mask_by * 2 + 1
            m = F.max_pool2d(m, kernel_size=k, stride=1, padding=grow_mask_by)
        keep = (1 - m.round()).permute(0, 2, 3, 1)  # (B|1, H, W, 1)
        grey = (pixels[..., :3] - 0.5) * keep + 0.5
        with ctx.models.use(vae) as module:
            samples = encode(module, grey)
        return ({"samples": samples, "noise_mask": m},)


NODES: list[type[Node]] = [
    EmptyLatentImage,
    LatentUpscale,
    LatentUpscaleBy,
    VAEDecode,
    VAEEncode,
    VAEDecodeTiled,
    VAEEncodeTiled,
    SetLatentNoiseMask,
    VAEEncodeForInpaint,
]
