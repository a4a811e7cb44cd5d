"""Resizing nodes beyond ImageScale: to a pixel count, to a longest side, fit-and-pad, and the
all-in-one ResizeImageMaskNode (ComfyUI's names, inputs and semantics;
``comfy_extras/nodes_post_processing.py`` and ``nodes_images.py``). All use :mod:`nodes.core.resize`.

ResizeImageMaskNode is a ComfyUI V3 node whose ``resize_type`` is a DynamicCombo: the choice
reveals its own widgets, which ComfyUI's API format stores as ``"resize_type.width"``,
``"resize_type.multiplier"`` and so on. Loom declares each of those dotted names as an optional
input (with ComfyUI's default), so API-format prompts from ComfyUI run unchanged; only the
chosen option's inputs are read.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from engine.context import NodeContext
from engine.node import Node, OutputSizes
from engine.schema import COMBO, FLOAT, IMAGE, INT, MASK, Input, NodeSchema, Output
from nodes.core.resize import CROP_METHODS, resize, size_keeping_aspect, total_pixels_size
from nodes.core.tensor_sizes import image_resized
from nodes.image.load_save import MAX_RESOLUTION, SCALE_METHODS, ImageError

IMAGE_OR_MASK = f"{IMAGE},{MASK}"
RESIZE_TYPES = (
    "scale dimensions",
    "scale by multiplier",
    "scale longer dimension",
    "scale shorter dimension",
    "scale width",
    "scale height",
    "scale total pixels",
    "match size",
    "scale to multiple",
)


def _channels_first(t: torch.Tensor) -> torch.Tensor:
    """IMAGE [B, H, W, C] or MASK [B, H, W] -> [B, C, H, W]."""
    return t.movedim(-1, 1) if t.ndim == 4 else t.reshape(-1, 1, t.shape[-2], t.shape[-1])


def _back(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return t.movedim(1, -1) if like.ndim == 4 else t[:, 0]


def resize_any(t: torch.Tensor, width: int, height: int, method: str, crop: str = "disabled") -> torch.Tensor:
    """Resize an IMAGE or a MASK to width x height; a size below 1 pixel is a clear error."""
    if width < 1 or height < 1:
        raise ImageError(
            f"the target size came out as {width}x{height} from a {t.shape[-2 if t.ndim == 3 else 2]}-wide input; "
            "each side must be at least 1 pixel: use a larger size or factor"
        )
    return _back(resize(_channels_first(t), width, height, method, crop), t)


def longer_side_size(width: int, height: int, longer: int) -> tuple[int, int]:
    if height > width:
        return round(width / height * longer), longer
    if width > height:
        return longer, round(height / width * longer)
    return longer, longer


def shorter_side_size(width: int, height: int, shorter: int) -> tuple[int, int]:
    if height < width:
        return round(width / height * shorter), shorter
    if width < height:
        return shorter, round(height / width * shorter)
    return shorter, shorter


class ImageScaleToTotalPixels(Node):
    SCHEMA = NodeSchema(
        node_id="ImageScaleToTotalPixels",
        display_name="Scale Image to Total Pixels",
        category="image/upscaling",
        description="Resize so the image has about `megapixels` x 1024² pixels, keeping its aspect ratio.",
        inputs=(
            Input("image", IMAGE, "The images."),
            Input("upscale_method", COMBO, "Interpolation.", options=SCALE_METHODS, default="nearest-exact"),
            Input(
                "megapixels",
                FLOAT,
                "Target size in units of 1024x1024.",
                default=1.0,
                min=0.01,
                max=16.0,
                step=0.01,
            ),
            Input(
                "resolution_steps", INT, "Round each side to a multiple of this.", default=1, min=1, max=256
            ),
        ),
        outputs=(Output("IMAGE", IMAGE, "Resized images."),),
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        image: torch.Tensor,
        upscale_method: str,
        megapixels: float,
        resolution_steps: int = 1,
    ) -> tuple:
        width, height = total_pixels_size(image.shape[2], image.shape[1], megapixels, resolution_steps)
        return (resize_any(image, width, height, upscale_method),)

    @classmethod
    def estimate_outputs(
        cls, *, image: Any = None, megapixels: Any = None, resolution_steps: Any = 1, **_: Any
    ) -> OutputSizes:
        if not isinstance(megapixels, int | float) or not isinstance(resolution_steps, int):
            return (None,)
        return (image_resized(image, lambda w, h: total_pixels_size(w, h, megapixels, resolution_steps)),)


class ImageScaleToMaxDimension(Node):
    SCHEMA = NodeSchema(
        node_id="ImageScaleToMaxDimension",
        display_name="ImageScaleToMaxDimension",
        category="image/upscaling",
        description="Resize so the longer side is `largest_size`, keeping the aspect ratio.",
        inputs=(
            Input("image", IMAGE, "The images."),
            # ComfyUI lists "bilinear" twice here; kept so saved workflows and the editor agree
            Input(
                "upscale_method",
                COMBO,
                "Interpolation.",
                options=("area", "lanczos", "bilinear", "nearest-exact", "bilinear", "bicubic"),
                default="area",
            ),
            Input(
                "largest_size",
                INT,
                "Length of the longer side.",
                default=512,
                min=0,
                max=MAX_RESOLUTION,
                step=1,
            ),
        ),
        outputs=(Output("IMAGE", IMAGE, "Resized images."),),
    )

    def run(self, ctx: NodeContext, *, image: torch.Tensor, upscale_method: str, largest_size: int) -> tuple:
        width, height = longer_side_size(image.shape[2], image.shape[1], largest_size)
        return (resize_any(image, width, height, upscale_method),)

    @classmethod
    def estimate_outputs(cls, *, image: Any = None, largest_size: Any = None, **_: Any) -> OutputSizes:
        if not isinstance(largest_size, int):
            return (None,)
        return (image_resized(image, lambda w, h: longer_side_size(w, h, largest_size)),)


class ResizeAndPadImage(Node):
    SCHEMA = NodeSchema(
        node_id="ResizeAndPadImage",
        display_name="ResizeAndPadImage",
        category="image/transform",
        description="Fit the image inside target_width x target_height (aspect kept) and pad the rest, centred.",
        inputs=(
            Input("image", IMAGE, "The images."),
            Input("target_width", INT, "Output width.", default=512, min=1, max=MAX_RESOLUTION, step=1),
            Input("target_height", INT, "Output height.", default=512, min=1, max=MAX_RESOLUTION, step=1),
            Input(
                "padding_color", COMBO, "Colour of the padding.", options=("white", "black"), default="white"
            ),
            Input(
                "interpolation",
                COMBO,
                "Interpolation.",
                options=("area", "bicubic", "nearest-exact", "bilinear", "lanczos"),
                default="area",
            ),
        ),
        outputs=(Output("IMAGE", IMAGE, "The fitted, padded images."),),
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        image: torch.Tensor,
        target_width: int,
        target_height: int,
        padding_color: str,
        interpolation: str,
    ) -> tuple:
        b, h, w, c = image.shape
        scale = min(target_width / w, target_height / h)
        new_w, new_h = int(w * scale), int(h * scale)
        resized = resize_any(image, new_w, new_h, interpolation)
        out = torch.full(
            (b, target_height, target_width, c),
            0.0 if padding_color == "black" else 1.0,
            dtype=image.dtype,
            device=image.device,
        )
        y0, x0 = (target_height - new_h) // 2, (target_width - new_w) // 2
        out[:, y0 : y0 + new_h, x0 : x0 + new_w, :] = resized
        return (out,)

    @classmethod
    def estimate_outputs(
        cls, *, image: Any = None, target_width: Any = None, target_height: Any = None, **_: Any
    ) -> OutputSizes:
        if not isinstance(target_width, int) or not isinstance(target_height, int):
            return (None,)
        return (image_resized(image, lambda w, h: (target_width, target_height)),)


def scale_to_multiple(t: torch.Tensor, multiple: int, method: str) -> torch.Tensor:
    """Scale up just enough to cover the largest multiple-of-`multiple` size inside the input,
    then centre-crop to it (ResizeImageMaskNode's "scale to multiple")."""
    height, width = t.shape[1], t.shape[2]
    target_w, target_h = width // multiple * multiple, height // multiple * multiple
    if multiple <= 1 or target_w == 0 or target_h == 0 or (target_w, target_h) == (width, height):
        return t
    if target_w / width >= target_h / height:
        scaled_w, scaled_h = target_w, max(math.ceil(height * target_w / width), target_h)
    else:
        scaled_w, scaled_h = max(math.ceil(width * target_h / height), target_w), target_h
    scaled = resize_any(t, scaled_w, scaled_h, method)
    x0, y0 = (scaled_w - target_w) // 2, (scaled_h - target_h) // 2
    return scaled[:, y0 : y0 + target_h, x0 : x0 + target_w]


# the resize types showing each of resize_type's own inputs (ComfyUI's DynamicCombo options)
SHOWN_FOR = {
    "width": ("scale dimensions", "scale width"),
    "height": ("scale dimensions", "scale height"),
    "crop": ("scale dimensions", "match size"),
    "multiplier": ("scale by multiplier",),
    "longer_size": ("scale longer dimension",),
    "shorter_size": ("scale shorter dimension",),
    "megapixels": ("scale total pixels",),
    "match": ("match size",),
    "multiple": ("scale to multiple",),
}


def _sub(name: str, type_: str, description: str, **kw: Any) -> Input:
    """One of resize_type's own inputs; the editors show it only for its resize types."""
    revealed = {"revealed_by": {"input": "resize_type", "choices": list(SHOWN_FOR[name])}}
    return Input(f"resize_type.{name}", type_, description, optional=True, extra=revealed, **kw)


class ResizeImageMaskNode(Node):
    SCHEMA = NodeSchema(
        node_id="ResizeImageMaskNode",
        display_name="Resize Image/Mask",
        category="transform",
        description="Resize an image or mask using various scaling methods.",
        inputs=(
            Input("input", IMAGE_OR_MASK, "The image or mask to resize."),
            Input(
                "resize_type",
                COMBO,
                "Select how to resize: by exact dimensions, scale factor, matching another image, etc.",
                options=RESIZE_TYPES,
                default="scale dimensions",
            ),
            _sub(
                "width",
                INT,
                "Target width (0: from the height, keeping the aspect).",
                default=512,
                min=0,
                max=MAX_RESOLUTION,
                step=1,
            ),
            _sub(
                "height",
                INT,
                "Target height (0: from the width, keeping the aspect).",
                default=512,
                min=0,
                max=MAX_RESOLUTION,
                step=1,
            ),
            _sub(
                "crop",
                COMBO,
                "How to handle aspect ratio mismatch: 'disabled' stretches to fit, 'center' crops "
                "to maintain aspect ratio.",
                options=CROP_METHODS,
                default="center",
            ),
            _sub("multiplier", FLOAT, "Scale factor.", default=1.0, min=0.01, max=8.0, step=0.01),
            _sub(
                "longer_size",
                INT,
                "The longer edge becomes this.",
                default=512,
                min=0,
                max=MAX_RESOLUTION,
                step=1,
            ),
            _sub(
                "shorter_size",
                INT,
                "The shorter edge becomes this.",
                default=512,
                min=0,
                max=MAX_RESOLUTION,
                step=1,
            ),
            _sub(
                "megapixels",
                FLOAT,
                "Target megapixels (1.0 = 1024x1024).",
                default=1.0,
                min=0.01,
                max=16.0,
                step=0.01,
            ),
            _sub("match", IMAGE_OR_MASK, "Resize to the size of this image or mask."),
            _sub(
                "multiple",
                INT,
                "Make both sides divisible by this (scale up to cover, centre crop).",
                default=8,
                min=1,
                max=MAX_RESOLUTION,
                step=1,
            ),
            Input(
                "scale_method",
                COMBO,
                "Interpolation algorithm. 'area' is best for downscaling, 'lanczos' for "
                "upscaling, 'nearest-exact' for pixel art.",
                options=SCALE_METHODS,
                default="area",
            ),
        ),
        outputs=(Output("resized", IMAGE_OR_MASK, "The resized image or mask (same type as the input)."),),
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        input: torch.Tensor,
        resize_type: str,
        scale_method: str,  # noqa: A002
        **option: Any,
    ) -> tuple:
        def get(name: str) -> Any:
            return option.get(f"resize_type.{name}")

        h, w = input.shape[1], input.shape[2]
        if resize_type in ("scale dimensions", "scale width", "scale height"):
            width = int(get("width") or 0) if resize_type != "scale height" else 0
            height = int(get("height") or 0) if resize_type != "scale width" else 0
            if width == 0 and height == 0:
                return (input,)
            crop = str(get("crop")) if resize_type == "scale dimensions" else "disabled"
            return (resize_any(input, *size_keeping_aspect(width, height, w, h), scale_method, crop),)
        if resize_type == "scale by multiplier":
            factor = float(get("multiplier"))
            return (resize_any(input, round(w * factor), round(h * factor), scale_method),)
        if resize_type == "scale longer dimension":
            return (resize_any(input, *longer_side_size(w, h, int(get("longer_size"))), scale_method),)
        if resize_type == "scale shorter dimension":
            return (resize_any(input, *shorter_side_size(w, h, int(get("shorter_size"))), scale_method),)
        if resize_type == "scale total pixels":
            total = int(float(get("megapixels")) * 1024 * 1024)
            scale = math.sqrt(total / (w * h))
            return (resize_any(input, round(w * scale), round(h * scale), scale_method),)
        if resize_type == "match size":
            match = get("match")
            if not isinstance(match, torch.Tensor):
                raise ImageError(
                    "resize_type 'match size' needs an image or mask connected to resize_type.match"
                )
            return (resize_any(input, match.shape[2], match.shape[1], scale_method, str(get("crop"))),)
        if resize_type == "scale to multiple":
            return (scale_to_multiple(input, int(get("multiple")), scale_method),)
        raise ImageError(f"unknown resize_type {resize_type!r}; expected one of {', '.join(RESIZE_TYPES)}")


NODES: list[type[Node]] = [
    ImageScaleToTotalPixels,
    ImageScaleToMaxDimension,
    ResizeAndPadImage,
    ResizeImageMaskNode,
]
