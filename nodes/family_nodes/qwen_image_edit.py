"""What ComfyUI's Qwen-Image-Edit nodes do with their pictures (``comfy_extras/nodes_qwen.py``), for
:mod:`nodes.family_nodes.qwen_image_nodes`:

- the picture is scaled to a pixel budget by area averaging (ComfyUI's ``common_upscale`` "area",
  no crop): TextEncodeQwenImageEdit scales it to ~1024² pixels and gives that one image to both the
  vision tower and the VAE; TextEncodeQwenImageEditPlus gives the vision tower a ~384² version and
  the VAE a ~1024² one with sides rounded to multiples of 8;
- the vision tower (:mod:`nodes.families.components.qwen25_vision`) is its own model handle read
  from the text encoder's file (``visual.``), loaded only when a picture comes; a file without it
  gets an error that names the node and the fix;
- the VAE's latents go to the model as the conditioning's ``reference_latents``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

import torch

from engine.context import NodeContext
from nodes.core.cond import CondEntry, Conditioning
from nodes.core.parts import Part
from nodes.core.resize import resize
from nodes.core.weights import read_index
from nodes.encode.conditioning import text_encoders
from nodes.families.components.qwen25_text import QwenImagePrompt
from nodes.families.components.qwen25_vision import VISION_PREFIX, ImageEmbeds, Qwen25Vision, embed_image
from nodes.latent.vae import crop_to_8, downscale, encode
from nodes.load.handles import ComponentHandle

EDIT_TEMPLATE = (
    "<|im_start|>system\nDescribe the key features of the input image (color, shape, size, texture, "
    "objects, background), then explain how the user's text instruction should alter or modify the "
    "image. Generate a new image that meets the user's requirements while maintaining consistency "
    "with the original input where appropriate.<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n"
    "<|im_start|>assistant\n"
)
PICTURE = "<|vision_start|><|image_pad|><|vision_end|>"
IMAGE_TEMPLATE = EDIT_TEMPLATE.replace("user\n{}", "user\n" + PICTURE + "{}")  # TextEncodeQwenImageEdit's
REFERENCE_PIXELS = 1024 * 1024
PLUS_VISION_PIXELS = 384 * 384


class QwenEditError(ValueError):
    """An edit-encoding request Loom cannot serve; the message says why and what to do."""


@dataclass(frozen=True, kw_only=True)
class QwenVisionHandle(ComponentHandle):
    """Qwen2.5-VL's vision tower, read from the text encoder's file. Its precision follows the
    text encoders' (ComfyUI loads it as part of the text encoder)."""

    kind: ClassVar[str] = "clip"


def vision_part(index: Any) -> Part | None:
    """The Qwen2.5-VL vision tower stored beside the text encoder (``visual.``), or None when the
    file holds none (or only part of one)."""
    vision = Qwen25Vision()
    if not vision.present(index, VISION_PREFIX):
        return None
    config = vision.config_from_tensors(index, VISION_PREFIX)
    return Part.make("visual", vision, VISION_PREFIX, "visual", config)


def vision_handle(clip: Any, node: str) -> QwenVisionHandle:
    """The vision tower beside ``clip``'s Qwen2.5-VL text encoder; a teaching error without one."""
    part = clip.parts[0]
    path = Path(part.file or clip.source.path)
    index = read_index(path, allow_pickle=clip.source.allow_pickle)
    vision = vision_part(index)
    if vision is None:
        raise QwenEditError(
            f"{node}: the text encoder file {path.name} has no Qwen2.5-VL vision tower (no complete 'visual.*' "
            "tensors: patch_embed, blocks.N, merger), "
            "which reads the input image into the prompt. Load a Qwen2.5-VL-7B file that includes it (ComfyUI's "
            "qwen_2.5_vl_7b_fp8_scaled.safetensors does) with CLIPLoader (type qwen_image), or disconnect the "
            "image input and give the model the image with VAEEncode + ReferenceLatent"
        )
    return QwenVisionHandle(
        source=clip.source,
        family=clip.family,
        parts=(replace(vision, file=part.file, file_id=part.file_id),),
        nbytes=index.nbytes(vision.prefix),
        dtype=clip.dtype,
    )


def scale_to_pixels(image: torch.Tensor, pixels: int, multiple: int = 1) -> torch.Tensor:
    """``image`` [B, H, W, C] scaled by area averaging to about ``pixels`` pixels, keeping its aspect;
    with ``multiple`` > 1 the sides are rounded to multiples of it (ComfyUI's rounding)."""
    height, width = image.shape[1], image.shape[2]
    scale = math.sqrt(pixels / (width * height))
    new_w = round(width * scale / multiple) * multiple
    new_h = round(height * scale / multiple) * multiple
    return resize(image.movedim(-1, 1), new_w, new_h, "area").movedim(1, -1)


def check_clip(clip: Any, node: str) -> QwenImagePrompt:
    if not isinstance(clip.family.prompt, QwenImagePrompt):
        raise QwenEditError(
            f"{node} needs the Qwen-Image text encoder, got the {clip.family.title} CLIP; load "
            "qwen_2.5_vl_7b.safetensors with CLIPLoader (type qwen_image)"
        )
    return clip.family.prompt


def encode_edit(
    ctx: NodeContext,
    clip: Any,
    prompt: str,
    template: str | None,
    pictures: Sequence[torch.Tensor],
    node: str,
) -> Conditioning:
    """``prompt`` in ``template`` with ``pictures`` (already scaled) read by the vision tower."""
    recipe = check_clip(clip, node)
    embeds: list[ImageEmbeds] = []
    if pictures:
        with ctx.models.use(vision_handle(clip, node)) as tower:
            embeds = [embed_image(tower, picture) for picture in pictures]
    with text_encoders(ctx, clip) as encoders:
        hidden, _ = recipe.encode(prompt, encoders, template, embeds)
    return [CondEntry(embeds=hidden.float().cpu())]


def reference_latent(ctx: NodeContext, vae: Any, image: torch.Tensor) -> torch.Tensor:
    """``image`` [B, H, W, C] encoded by ``vae`` as VAEEncode does (raw latents)."""
    with ctx.models.use(vae) as module:
        return encode(module, crop_to_8(image[..., :3], downscale(module)))


def with_references(conditioning: Conditioning, latents: Sequence[torch.Tensor]) -> Conditioning:
    """``conditioning`` with ``latents`` appended to each entry's ``reference_latents``."""
    if not latents:
        return conditioning
    return [
        replace(
            e,
            extras={**e.extras, "reference_latents": [*(e.extras.get("reference_latents") or ()), *latents]},
        )
        for e in conditioning
    ]
