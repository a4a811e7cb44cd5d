"""ImageCropToMask (ComfyUI's "Crop Image to Mask", ``comfy_extras/nodes_images.py``): crop each
image to its mask's bounding box grown to the output's aspect, composite the subject over a
background colour, and resize to the output size, as 3D-from-image pipelines expect their input.

Per image: a mask whose border is mostly set and centre mostly unset is taken as inverted; it is
grown or shrunk by ``grow_mask`` pixels (max pooling), values under 0.05 dropped; an image larger
than the output is first scaled down (Lanczos) so its longer side is max(width, height); the box of
mask values above 0.8 (204/255) is grown to width/height aspect times ``pad_factor``, centred on
the box, and cut out with zeros outside the image; then ``image * mask + background * (1 - mask)``
is resized with Lanczos to width x height.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from engine.context import NodeContext
from engine.node import NativeNodeDef, Node, OutputSizes
from engine.schema import FLOAT, IMAGE, INT, MASK, Input, NodeSchema, Output
from nodes.core.resize import lanczos, resize_mask
from nodes.core.tensor_sizes import image_resized
from nodes.text.values import COLOR, ColorError, parse_color

FOREGROUND_LEVEL = 204  # of 255: mask values counted in the subject's bounding box
Box = tuple[int, int, int, int]  # x1, y1, x2, y2


class CropToMaskError(ValueError):
    """Masks that do not fit the images, or a bad background; the message names the input."""


def grown(mask: torch.Tensor, pixels: int) -> torch.Tensor:
    """[1, 1, H, W] mask grown (pixels > 0) or shrunk (< 0) by max pooling over a 2r+1 square."""
    if pixels == 0:
        return mask
    r = abs(pixels)
    if pixels > 0:
        return F.max_pool2d(mask, kernel_size=2 * r + 1, stride=1, padding=r)
    return 1.0 - F.max_pool2d(1.0 - mask, kernel_size=2 * r + 1, stride=1, padding=r)


def subject_box(mask: torch.Tensor, aspect: float, pad_factor: float) -> Box | None:
    """The crop around mask values above 204/255 at ``aspect`` (width / height), or None if none."""
    levels = (mask.clamp(0, 1) * 255.0).to(torch.uint8)
    found = (levels > FOREGROUND_LEVEL).nonzero()
    if found.numel() == 0:
        return None
    y_min, x_min = found.min(dim=0).values.tolist()
    y_max, x_max = found.max(dim=0).values.tolist()
    cy, cx = (y_min + y_max) / 2.0, (x_min + x_max) / 2.0
    bw, bh = x_max - x_min + 1, y_max - y_min + 1
    if bw / max(bh, 1) >= aspect:
        crop_w, crop_h = int(bw * pad_factor), int(bw / aspect * pad_factor)
    else:
        crop_w, crop_h = int(bh * aspect * pad_factor), int(bh * pad_factor)
    half_w, half_h = math.ceil(crop_w / 2), math.ceil(crop_h / 2)
    x1, y1 = int(cx - half_w), int(cy - half_h)
    return x1, y1, x1 + 2 * half_w, y1 + 2 * half_h


def crop_one(
    image: torch.Tensor,
    mask: torch.Tensor,
    size: int,
    pad_factor: float,
    grow: int,
    bg: torch.Tensor,
    aspect: float,
) -> torch.Tensor:
    """One [H, W, 3] image and [H, W] mask -> the composited crop [1, 3, h, w]."""
    img = image.permute(2, 0, 1)[None].float().clamp(0, 1)
    m = mask[None, None].float().clamp(0, 1)
    h, w = m.shape[-2:]
    border = torch.cat([m[0, 0, 0], m[0, 0, -1], m[0, 0, :, 0], m[0, 0, :, -1]])
    centre = m[0, 0, h // 4 : h - h // 4, w // 4 : w - w // 4]
    if float(border.mean()) > 0.5 and float(centre.mean()) < 0.5:
        m = 1.0 - m
    m = grown(m, grow)
    m = torch.where(m < 0.05, torch.zeros_like(m), m)
    if max(h, w) > size:
        scale = size / max(h, w)
        new_w, new_h = int(w * scale), int(h * scale)
        img, m = lanczos(img, new_w, new_h), lanczos(m, new_w, new_h)
        h, w = new_h, new_w
    box = subject_box(m[0, 0], aspect, pad_factor)
    if box is None:
        inverse = subject_box(1.0 - m[0, 0], aspect, pad_factor)
        if inverse is not None:  # the auto-inversion above was too careful
            m, box = 1.0 - m, inverse
    x1, y1, x2, y2 = box if box is not None else (0, 0, w, h)
    pads = (max(0, -x1), max(0, x2 - w), max(0, -y1), max(0, y2 - h))
    if any(pads):
        img, m = F.pad(img, pads, value=0.0), F.pad(m, pads, value=0.0)
        x1, x2, y1, y2 = x1 + pads[0], x2 + pads[0], y1 + pads[2], y2 + pads[2]
    img, m = img[..., y1:y2, x1:x2], m[..., y1:y2, x1:x2]
    return (img * m + bg.view(1, 3, 1, 1) * (1.0 - m)).clamp(0, 1)


class ImageCropToMask(Node):
    SCHEMA = NodeSchema(
        node_id="ImageCropToMask",
        display_name="Crop Image to Mask",
        category="image/transform",
        description="Crop images to their masks' bounding boxes, composite over a background and resize.",
        inputs=(
            Input("images", IMAGE, "The images (RGB; alpha is dropped)."),
            Input("masks", MASK, "The subject masks (one, or one per image)."),
            Input("width", INT, "Output width in pixels.", default=1024, min=64, max=4096, step=8),
            Input("height", INT, "Output height in pixels.", default=1024, min=64, max=4096, step=8),
            Input(
                "pad_factor",
                FLOAT,
                "Extra margin around the mask bounding box as a multiplier.",
                default=1.0,
                min=1.0,
                max=2.0,
                step=0.01,
            ),
            Input(
                "grow_mask",
                INT,
                "Grow or shrink the mask by this many pixels before cropping.",
                default=0,
                min=-32,
                max=32,
                step=1,
            ),
            Input("background", COLOR, "Background color behind the masked subject.", default="#000000"),
        ),
        outputs=(Output("images", IMAGE, "The cropped, composited and resized images."),),
    )

    @classmethod
    def estimate_outputs(
        cls, *, images: Any = None, width: Any = None, height: Any = None, **_: Any
    ) -> OutputSizes:
        return (
            image_resized(images, lambda w, h: (width, height))
            if isinstance(width, int) and isinstance(height, int)
            else None,
        )

    def run(
        self,
        ctx: NodeContext,
        *,
        images: torch.Tensor,
        masks: torch.Tensor,
        width: int,
        height: int,
        pad_factor: float,
        grow_mask: int,
        background: str,
    ) -> tuple[torch.Tensor]:
        try:
            packed, _, _ = parse_color(background)
        except ColorError as exc:
            raise CropToMaskError(f"background: {exc}".replace("color: ", "")) from None
        bg = torch.tensor([(packed >> 16) / 255.0, ((packed >> 8) & 255) / 255.0, (packed & 255) / 255.0])
        images = images[..., :3]
        batch = images.shape[0]
        masks = masks.reshape(-1, masks.shape[-2], masks.shape[-1])
        if masks.shape[0] == 1 and batch > 1:
            masks = masks.expand(batch, -1, -1)
        elif masks.shape[0] != batch:
            raise CropToMaskError(
                f"masks: {masks.shape[0]} masks for {batch} images; give one mask, or one per image"
            )
        if masks.shape[-2:] != images.shape[1:3]:
            masks = resize_mask(masks.float(), images.shape[2], images.shape[1], "bilinear")
        out = [
            lanczos(
                crop_one(images[i], masks[i], max(width, height), pad_factor, grow_mask, bg, width / height),
                width,
                height,
            ).movedim(1, -1)
            for i in range(batch)
        ]
        return (torch.cat(out).to(images.dtype),)


class CropToMaskDef(NativeNodeDef):
    """The COLOR widget's text is checked by the node itself (COLOR is not one of Loom's widget types)."""

    self_validated = frozenset({"background"})


NODES = [CropToMaskDef(ImageCropToMask)]
