"""ComfyUI's Wan image-to-video conditioning nodes (``comfy_extras/nodes_wan.py``): same names, inputs,
input order, outputs and values. VACE and camera control are :mod:`nodes.family_nodes.wan_vace`.

Each node returns the empty video latent to sample ([batch, 16, (length - 1) // 4 + 1, height / 8,
width / 8]; Wan 2.2 5B's VAE: 48 channels, / 16) and sets, on every entry of both conditionings,
the keys the Wan model reads (frames resized bilinear after a centre crop, encoded as one clip by
the video VAE; latents raw, as VAEEncode gives them):

- ``concat_latent_image``: the encoded frames, [1, C, t, h, w] (Fun control: [B, 2C, t, h, w], the
  control video's latents in channels ``:C``, the start image's in ``C:``; where no frames were
  given, Wan's latent zero, i.e. ``process_out(0)``, the per-channel mean);
- ``concat_mask``: 1 where the model generates, 0 on given frames: [1, 1, t, h, w] for
  WanImageToVideo (0 on the latent frames the start image covers), else [1, 4, t, h, w] with each
  latent frame's 4 video frames on the channel axis (the start image's frames and the 3 after them,
  the end image's last frames);
- ``concat_mask_index`` (Wan22FunControlToVideo): the channel where the mask goes in (the latent
  channels);
- ``clip_vision_output``: CLIPVisionEncode's output (the first/last-frame node joins the start and end
  images' ``penultimate_hidden_states`` along the token axis; the joined value keeps the start image's
  ``image_embeds``, which ComfyUI's joined value lacks);
- ``reference_latents`` (appended): Wan22FunControlToVideo's ``ref_image``, encoded, [1, C, 1, h, w].

Wan22ImageToVideoLatent returns the latent itself with the start image written into its first
latent frames and a ``noise_mask`` (0 there, 1 elsewhere); its other frames are Wan 2.2's latent zero.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from engine.context import NodeContext
from engine.node import Node
from engine.schema import IMAGE, INT, LATENT, VAE, Input, NodeSchema, Output
from nodes.core.cond import Conditioning
from nodes.encode.clip_vision import CLIP_VISION_OUTPUT, ClipVisionOutput
from nodes.families.latent_format import WAN21_LATENT, WAN22_LATENT
from nodes.family_nodes.wan_frames import (
    CATEGORY,
    COND_OUTPUTS,
    VideoLatentNode,
    WanInputError,
    both,
    encode_clips,
    fit,
    frame_mask,
    frames,
    latent_frames,
    size_inputs,
    vae_layout,
    zero_latent,
)
from nodes.latent.vae import MAX_RESOLUTION

CondLatent = tuple[Conditioning, Conditioning, dict]
_CLIP_VISION = Input(
    "clip_vision_output", CLIP_VISION_OUTPUT, "CLIPVisionEncode's output for the start image.", optional=True
)


def _image(name: str, description: str) -> Input:
    return Input(name, IMAGE, description, optional=True)


def _with_clip_vision(
    positive: Conditioning, negative: Conditioning, output: Any
) -> tuple[Conditioning, ...]:
    if output is None:
        return positive, negative
    return both(positive, negative, {"clip_vision_output": output})


def first_last_frames(
    ctx: NodeContext,
    vae: Any,
    width: int,
    height: int,
    length: int,
    start_image: torch.Tensor | None,
    end_image: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """WanFirstLastFrameToVideo's frames: (encoded clip, concat_mask, latent channels, scale)."""
    channels, scale = vae_layout(ctx, vae)
    t = latent_frames(length)
    image = torch.full((length, height, width, 3), 0.5)
    start = end = None
    if start_image is not None:
        first = fit(frames(start_image, "start_image")[:length], width, height)
        image[: first.shape[0]] = first
        start = first.shape[0]
    if end_image is not None:
        last = fit(frames(end_image, "end_image")[-length:], width, height)
        image[-last.shape[0] :] = last
        end = last.shape[0]
    (concat,) = encode_clips(ctx, vae, [image])
    return concat, frame_mask(t, height // scale, width // scale, start, end), channels, scale


class WanImageToVideo(VideoLatentNode):
    SCHEMA = NodeSchema(
        node_id="WanImageToVideo",
        display_name="WanImageToVideo",
        category=CATEGORY,
        description="Give a Wan image-to-video model its start frames (and CLIP vision features); returns the "
        "empty video latent.",
        inputs=(
            *size_inputs(),
            _CLIP_VISION,
            _image("start_image", "The first frames of the video (the first `length` are used)."),
            _image(
                "ref_pad_image",
                "Its first image fills the frames after start_image instead of grey (only with a start_image).",
            ),
        ),
        outputs=COND_OUTPUTS,
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        positive: Conditioning,
        negative: Conditioning,
        vae: Any,
        width: int,
        height: int,
        length: int,
        batch_size: int,
        clip_vision_output: ClipVisionOutput | None = None,
        start_image: torch.Tensor | None = None,
        ref_pad_image: torch.Tensor | None = None,
    ) -> CondLatent:
        latent = zero_latent(batch_size, 16, length, height, width, 8)
        if start_image is not None:
            start = fit(frames(start_image, "start_image")[:length], width, height)
            image = torch.full((length, height, width, 3), 0.5)
            if ref_pad_image is not None:
                image[:] = fit(frames(ref_pad_image, "ref_pad_image")[:1], width, height)[0]
            image[: start.shape[0]] = start
            (concat,) = encode_clips(ctx, vae, [image])
            mask = torch.ones(1, 1, latent.shape[2], concat.shape[-2], concat.shape[-1])
            mask[:, :, : latent_frames(start.shape[0])] = 0.0
            positive, negative = both(
                positive, negative, {"concat_latent_image": concat, "concat_mask": mask}
            )
        positive, negative = _with_clip_vision(positive, negative, clip_vision_output)
        return positive, negative, {"samples": latent}


def joined_clip_vision(
    start: ClipVisionOutput | None, end: ClipVisionOutput | None
) -> ClipVisionOutput | None:
    """The start and end images' CLIP vision outputs as one (tokens side by side), or the one given."""
    if start is None or end is None:
        return start if end is None else end
    return replace(
        start,
        last_hidden_state=torch.cat([start.last_hidden_state, end.last_hidden_state], dim=-2),
        penultimate_hidden_states=torch.cat(
            [start.penultimate_hidden_states, end.penultimate_hidden_states], dim=-2
        ),
    )


class WanFirstLastFrameToVideo(Node):
    SCHEMA = NodeSchema(
        node_id="WanFirstLastFrameToVideo",
        display_name="WanFirstLastFrameToVideo",
        category=CATEGORY,
        description="Give a Wan first/last-frame model the video's first and last frames (and CLIP vision "
        "features of both); returns the empty video latent.",
        inputs=(
            *size_inputs(),
            Input(
                "clip_vision_start_image",
                CLIP_VISION_OUTPUT,
                "CLIPVisionEncode's output for the start image.",
                optional=True,
            ),
            Input(
                "clip_vision_end_image",
                CLIP_VISION_OUTPUT,
                "CLIPVisionEncode's output for the end image (joined after the start image's tokens).",
                optional=True,
            ),
            _image("start_image", "The first frames of the video (the first `length` are used)."),
            _image("end_image", "The last frames of the video (the last `length` are used)."),
        ),
        outputs=COND_OUTPUTS,
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        positive: Conditioning,
        negative: Conditioning,
        vae: Any,
        width: int,
        height: int,
        length: int,
        batch_size: int,
        clip_vision_start_image: ClipVisionOutput | None = None,
        clip_vision_end_image: ClipVisionOutput | None = None,
        start_image: torch.Tensor | None = None,
        end_image: torch.Tensor | None = None,
    ) -> CondLatent:
        concat, mask, channels, scale = first_last_frames(
            ctx, vae, width, height, length, start_image, end_image
        )
        positive, negative = both(positive, negative, {"concat_latent_image": concat, "concat_mask": mask})
        vision = joined_clip_vision(clip_vision_start_image, clip_vision_end_image)
        positive, negative = _with_clip_vision(positive, negative, vision)
        return (
            positive,
            negative,
            {"samples": zero_latent(batch_size, channels, length, height, width, scale)},
        )


class WanFunInpaintToVideo(Node):
    SCHEMA = NodeSchema(
        node_id="WanFunInpaintToVideo",
        display_name="WanFunInpaintToVideo",
        category=CATEGORY,
        description="Give a Wan Fun inpainting model the video's start and end frames (as "
        "WanFirstLastFrameToVideo with one CLIP vision input); returns the empty video latent.",
        inputs=(
            *size_inputs(),
            _CLIP_VISION,
            _image("start_image", "The first frames of the video."),
            _image("end_image", "The last frames of the video."),
        ),
        outputs=COND_OUTPUTS,
    )

    def run(
        self, ctx: NodeContext, *, clip_vision_output: ClipVisionOutput | None = None, **inputs: Any
    ) -> CondLatent:
        return WanFirstLastFrameToVideo().run(ctx, clip_vision_start_image=clip_vision_output, **inputs)


def fun_concat(
    ctx: NodeContext,
    vae: Any,
    empty: torch.Tensor,
    fmt: Any,
    width: int,
    height: int,
    length: int,
    start_image: torch.Tensor | None,
    control_video: torch.Tensor | None,
) -> torch.Tensor:
    """The Fun control nodes' ``concat_latent_image`` [B, 2C, t, h, w]: the latent zero, the control
    video's latents in channels ``:C`` and the start image's in ``C:`` (frames beyond t dropped)."""
    channels, t = empty.shape[1], empty.shape[2]
    concat = fmt.process_out(torch.zeros_like(empty)).repeat(1, 2, 1, 1, 1)
    if start_image is not None:
        (enc,) = encode_clips(ctx, vae, [fit(frames(start_image, "start_image")[:length], width, height)])
        concat[:, channels:, : enc.shape[2]] = enc[:, :, :t]
    if control_video is not None:
        (enc,) = encode_clips(ctx, vae, [fit(frames(control_video, "control_video")[:length], width, height)])
        concat[:, :channels, : enc.shape[2]] = enc[:, :, :t]
    return concat


class WanFunControlToVideo(VideoLatentNode):
    SCHEMA = NodeSchema(
        node_id="WanFunControlToVideo",
        display_name="WanFunControlToVideo",
        category=CATEGORY,
        description="Give a Wan 2.1 Fun control model its control video and start image; returns the empty "
        "video latent.",
        inputs=(
            *size_inputs(),
            _CLIP_VISION,
            _image("start_image", "The first frames of the video."),
            _image("control_video", "The control frames (pose, depth, edges, ...), the first `length` used."),
        ),
        outputs=COND_OUTPUTS,
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        positive: Conditioning,
        negative: Conditioning,
        vae: Any,
        width: int,
        height: int,
        length: int,
        batch_size: int,
        clip_vision_output: ClipVisionOutput | None = None,
        start_image: torch.Tensor | None = None,
        control_video: torch.Tensor | None = None,
    ) -> CondLatent:
        latent = zero_latent(batch_size, 16, length, height, width, 8)
        concat = fun_concat(ctx, vae, latent, WAN21_LATENT, width, height, length, start_image, control_video)
        positive, negative = both(positive, negative, {"concat_latent_image": concat})
        positive, negative = _with_clip_vision(positive, negative, clip_vision_output)
        return positive, negative, {"samples": latent}


class Wan22FunControlToVideo(Node):
    SCHEMA = NodeSchema(
        node_id="Wan22FunControlToVideo",
        display_name="Wan22FunControlToVideo",
        category=CATEGORY,
        description="Give a Wan 2.2 Fun control model its control video, the mask and a reference image; returns "
        "the empty video latent (the VAE's channels and scale).",
        inputs=(
            *size_inputs(),
            _image("ref_image", "A reference image (its first image), given as reference_latents."),
            _image("control_video", "The control frames (pose, depth, edges, ...), the first `length` used."),
        ),
        outputs=COND_OUTPUTS,
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        positive: Conditioning,
        negative: Conditioning,
        vae: Any,
        width: int,
        height: int,
        length: int,
        batch_size: int,
        ref_image: torch.Tensor | None = None,
        control_video: torch.Tensor | None = None,
    ) -> CondLatent:
        channels, scale = vae_layout(ctx, vae)
        latent = zero_latent(batch_size, channels, length, height, width, scale)
        fmt = WAN22_LATENT if channels == WAN22_LATENT.channels else WAN21_LATENT
        concat = fun_concat(ctx, vae, latent, fmt, width, height, length, None, control_video)
        mask = frame_mask(latent.shape[2], latent.shape[-2], latent.shape[-1], None, None)
        values = {"concat_latent_image": concat, "concat_mask": mask, "concat_mask_index": channels}
        positive, negative = both(positive, negative, values)
        if ref_image is not None:
            (ref,) = encode_clips(ctx, vae, [fit(frames(ref_image, "ref_image")[:1], width, height)])
            positive, negative = both(positive, negative, {"reference_latents": [ref]}, append=True)
        return positive, negative, {"samples": latent}


class Wan22ImageToVideoLatent(VideoLatentNode):
    LATENT_CHANNELS, LATENT_SCALE, LATENT_OUTPUT = WAN22_LATENT.channels, WAN22_LATENT.downscale, 0

    SCHEMA = NodeSchema(
        node_id="Wan22ImageToVideoLatent",
        display_name="Wan22ImageToVideoLatent",
        category="conditioning/inpaint",
        description="Wan 2.2 5B's video latent with the start image encoded into its first frames and a noise "
        "mask that keeps them.",
        inputs=(
            Input("vae", VAE, "Wan 2.2's VAE (48-channel latents, 16 pixels per cell)."),
            Input("width", INT, "Video width in pixels.", default=1280, min=32, max=MAX_RESOLUTION, step=32),
            Input("height", INT, "Video height in pixels.", default=704, min=32, max=MAX_RESOLUTION, step=32),
            Input("length", INT, "Frames of the video.", default=49, min=1, max=MAX_RESOLUTION, step=4),
            Input("batch_size", INT, "Videos to make at once.", default=1, min=1, max=4096),
            _image("start_image", "The first frames of the video (the first `length` are used)."),
        ),
        outputs=(
            Output("LATENT", LATENT, "The video latent (with noise_mask when a start image is given)."),
        ),
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        vae: Any,
        width: int,
        height: int,
        length: int,
        batch_size: int,
        start_image: torch.Tensor | None = None,
    ) -> tuple[dict]:
        channels, scale = WAN22_LATENT.channels, WAN22_LATENT.downscale
        latent = zero_latent(1, channels, length, height, width, scale)
        if start_image is None:
            return ({"samples": latent},)
        mask = torch.ones(1, 1, latent.shape[2], latent.shape[-2], latent.shape[-1])
        (enc,) = encode_clips(ctx, vae, [fit(frames(start_image, "start_image")[:length], width, height)])
        if enc.shape[1] != channels or enc.shape[-2:] != latent.shape[-2:]:
            raise WanInputError(
                f"Wan22ImageToVideoLatent: input 'vae' made latents of {enc.shape[1]} channels at "
                f"{tuple(enc.shape[-2:])}; this node needs Wan 2.2's VAE ({channels} channels, {scale} pixels per "
                f"cell: {tuple(latent.shape[-2:])} here). Load wan2.2_vae.safetensors with VAELoader, or use "
                "WanImageToVideo for Wan 2.1 models"
            )
        latent[:, :, : enc.shape[2]] = enc
        mask[:, :, : enc.shape[2]] = 0.0
        latent = WAN22_LATENT.process_out(latent) * mask + latent * (1.0 - mask)
        repeat = (batch_size, 1, 1, 1, 1)
        return ({"samples": latent.repeat(repeat), "noise_mask": mask.repeat(repeat)},)


NODES: list[type[Node]] = [
    WanImageToVideo,
    WanFirstLastFrameToVideo,
    WanFunInpaintToVideo,
    WanFunControlToVideo,
    Wan22FunControlToVideo,
    Wan22ImageToVideoLatent,
]
