"""Everyday IMAGE nodes: crop, pad, flip, rotate, batches, size, noise, stitch (ComfyUI's names,
inputs and semantics; ComfyUI's ``nodes.py`` and ``comfy_extras/nodes_images.py`` behaviour).

IMAGE is float [B, H, W, C] in 0..1. Batch rules follow ComfyUI: joining two images resizes the
second to the first's size (bilinear, centre crop) and gives a 3-channel image an alpha of 1 when
the other has 4 channels.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from engine.context import NodeContext
from engine.node import Node, OutputSizes
from engine.schema import BOOLEAN, COMBO, FLOAT, HIDDEN_UNIQUE_ID, IMAGE, INT, MASK, Input, NodeSchema, Output
from nodes.core.resize import resize_image
from nodes.core.tensor_sizes import image_resized, joined, mask_size, repeated
from nodes.image.load_save import MAX_RESOLUTION, ImageError

AUTOGROW_MAX = 50  # ComfyUI's Autogrow template for BatchImagesNode / BatchMasksNode: image0..image49


def _image_out(description: str = "The images.") -> Output:
    return Output("IMAGE", IMAGE, description)


def match_channels(image: torch.Tensor, channels: int) -> torch.Tensor:
    """Add opaque alpha channels (value 1) until ``image`` has ``channels`` channels."""
    missing = channels - image.shape[-1]
    return F.pad(image, (0, missing), value=1.0) if missing > 0 else image


def batch_images(images: list[torch.Tensor]) -> torch.Tensor:
    """Concatenate IMAGE batches: channels padded to the widest, sizes resized to the first's."""
    channels = max(image.shape[-1] for image in images)
    first = match_channels(images[0], channels)
    parts = [first]
    for image in images[1:]:
        image = match_channels(image, channels)
        if image.shape[1:] != first.shape[1:]:
            image = resize_image(image, first.shape[2], first.shape[1], "bilinear", "center")
        parts.append(image)
    return torch.cat(parts, dim=0)


class ImageCrop(Node):
    SCHEMA = NodeSchema(
        node_id="ImageCrop",
        display_name="Crop Image",
        category="image/transform",
        description="Cut a width x height region starting at (x, y); a region past the edge is cut short.",
        inputs=(
            Input("image", IMAGE, "The images."),
            Input("width", INT, "Width of the region.", default=512, min=1, max=MAX_RESOLUTION, step=1),
            Input("height", INT, "Height of the region.", default=512, min=1, max=MAX_RESOLUTION, step=1),
            Input(
                "x", INT, "Left edge (clamped into the image).", default=0, min=0, max=MAX_RESOLUTION, step=1
            ),
            Input(
                "y", INT, "Top edge (clamped into the image).", default=0, min=0, max=MAX_RESOLUTION, step=1
            ),
        ),
        outputs=(_image_out("The cropped images."),),
    )

    def run(self, ctx: NodeContext, *, image: torch.Tensor, width: int, height: int, x: int, y: int) -> tuple:
        x = min(x, image.shape[2] - 1)
        y = min(y, image.shape[1] - 1)
        return (image[:, y : y + height, x : x + width, :],)


class ImagePadForOutpaint(Node):
    SCHEMA = NodeSchema(
        node_id="ImagePadForOutpaint",
        display_name="Pad Image for Outpainting",
        category="image/transform",
        description="Grow the canvas (new area grey 0.5) and return a mask of what to paint, feathered inwards.",
        inputs=(
            Input("image", IMAGE, "The images."),
            Input("left", INT, "Pixels added on the left.", default=0, min=0, max=MAX_RESOLUTION, step=8),
            Input("top", INT, "Pixels added on top.", default=0, min=0, max=MAX_RESOLUTION, step=8),
            Input("right", INT, "Pixels added on the right.", default=0, min=0, max=MAX_RESOLUTION, step=8),
            Input("bottom", INT, "Pixels added at the bottom.", default=0, min=0, max=MAX_RESOLUTION, step=8),
            Input(
                "feathering",
                INT,
                "Width of the soft edge inside the old image.",
                default=40,
                min=0,
                max=MAX_RESOLUTION,
                step=1,
            ),
        ),
        outputs=(_image_out("The padded images."), Output("MASK", MASK, "1 on the new area, [1, H, W].")),
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        image: torch.Tensor,
        left: int,
        top: int,
        right: int,
        bottom: int,
        feathering: int,
    ) -> tuple:
        b, h, w, c = image.shape
        padded = torch.full((b, h + top + bottom, w + left + right, c), 0.5, dtype=torch.float32)
        padded[:, top : top + h, left : left + w, :] = image
        mask = torch.ones(h + top + bottom, w + left + right)
        inner = torch.zeros(h, w)
        if 0 < feathering and feathering * 2 < h and feathering * 2 < w:
            rows = torch.arange(h, dtype=torch.float32)[:, None]
            cols = torch.arange(w, dtype=torch.float32)[None, :]
            # distance to each padded side (a side without padding never feathers)
            sides = [
                rows if top else torch.full_like(rows, h),
                h - rows if bottom else torch.full_like(rows, h),
                cols if left else torch.full_like(cols, w),
                w - cols if right else torch.full_like(cols, w),
            ]
            d = torch.minimum(torch.minimum(sides[0], sides[1]), torch.minimum(sides[2], sides[3]))
            inner = torch.where(d < feathering, ((feathering - d) / feathering) ** 2, torch.zeros_like(d))
        mask[top : top + h, left : left + w] = inner
        return padded, mask[None]

    @classmethod
    def estimate_outputs(cls, *, image: Any = None, **sides: Any) -> OutputSizes:
        pad = [v for k in ("left", "top", "right", "bottom") if isinstance(v := sides.get(k), int)]
        if len(pad) != 4:
            return (None, None)
        padded = image_resized(image, lambda w, h: (w + pad[0] + pad[2], h + pad[1] + pad[3]))
        return padded, None if padded is None else mask_size(1, padded.shape[1], padded.shape[2])


class ImageBatch(Node):
    SCHEMA = NodeSchema(
        node_id="ImageBatch",
        display_name="Batch Images",
        category="image/batch",
        description="Put image2 after image1 in one batch (image2 resized to image1's size, centre crop).",
        inputs=(Input("image1", IMAGE, "The first images."), Input("image2", IMAGE, "The images to append.")),
        outputs=(_image_out("image1 followed by image2."),),
        deprecated=True,
    )

    def run(self, ctx: NodeContext, *, image1: torch.Tensor, image2: torch.Tensor) -> tuple:
        return (batch_images([image1, image2]),)

    @classmethod
    def estimate_outputs(cls, *, image1: Any = None, image2: Any = None, **_: Any) -> OutputSizes:
        return (joined([image1, image2]),)


class BatchImagesNode(Node):
    SCHEMA = NodeSchema(
        node_id="BatchImagesNode",
        display_name="Batch Images",
        category="image",
        description="Join 2 to 50 image batches into one (later ones resized to the first's size).",
        inputs=tuple(
            Input(f"images.image{i}", IMAGE, f"Images #{i + 1}.", optional=i >= 2)
            for i in range(AUTOGROW_MAX)
        ),
        outputs=(_image_out("All images in one batch."),),
    )

    def run(self, ctx: NodeContext, **images: torch.Tensor) -> tuple:
        # connected slots in slot order; unconnected optional slots do not arrive at all
        return (
            batch_images(
                [images[f"images.image{i}"] for i in range(AUTOGROW_MAX) if f"images.image{i}" in images]
            ),
        )


class ImageFromBatch(Node):
    SCHEMA = NodeSchema(
        node_id="ImageFromBatch",
        display_name="ImageFromBatch",
        category="image/batch",
        description="Take `length` images starting at batch_index (both clamped to the batch, as ComfyUI).",
        inputs=(
            Input("image", IMAGE, "The images."),
            Input("batch_index", INT, "First image to take (0-based).", default=0, min=0, max=4095),
            Input("length", INT, "How many images.", default=1, min=1, max=4096),
        ),
        outputs=(_image_out("The chosen images."),),
    )

    def run(self, ctx: NodeContext, *, image: torch.Tensor, batch_index: int, length: int) -> tuple:
        start = min(image.shape[0] - 1, batch_index)
        length = min(image.shape[0] - start, length)
        return (image[start : start + length].clone(),)


class RepeatImageBatch(Node):
    SCHEMA = NodeSchema(
        node_id="RepeatImageBatch",
        display_name="RepeatImageBatch",
        category="image/batch",
        description="Repeat the whole batch `amount` times.",
        inputs=(
            Input("image", IMAGE, "The images."),
            Input("amount", INT, "Number of copies.", default=1, min=1, max=4096),
        ),
        outputs=(_image_out("The repeated batch."),),
    )

    def run(self, ctx: NodeContext, *, image: torch.Tensor, amount: int) -> tuple:
        return (image.repeat((amount, 1, 1, 1)),)

    @classmethod
    def estimate_outputs(cls, *, image: Any = None, amount: Any = None, **_: Any) -> OutputSizes:
        return (repeated(image, amount),)


class RebatchImages(Node):
    SCHEMA = NodeSchema(
        node_id="RebatchImages",
        display_name="Rebatch Images",
        category="image/batch",
        description="Regroup a list of image batches into batches of batch_size (a size change starts a new one).",
        inputs=(
            Input("images", IMAGE, "The image batches (a list)."),
            Input("batch_size", INT, "Images per output batch.", default=1, min=1, max=4096),
        ),
        outputs=(Output("IMAGE", IMAGE, "The new batches (a list).", is_list=True),),
        input_is_list=True,
    )

    def run(self, ctx: NodeContext, *, images: list[torch.Tensor], batch_size: list[int]) -> tuple:
        size = batch_size[0]
        batches: list[torch.Tensor] = []
        current: list[torch.Tensor] = []
        for single in (image[i : i + 1] for image in images for i in range(image.shape[0])):
            if current and (len(current) == size or single.shape[1:] != current[0].shape[1:]):
                batches.append(torch.cat(current))
                current = []
            current.append(single)
        if current:
            batches.append(torch.cat(current))
        return (batches,)


class ImageFlip(Node):
    SCHEMA = NodeSchema(
        node_id="ImageFlip",
        display_name="ImageFlip",
        category="image/transform",
        description="Mirror images upside down (x-axis) or left-right (y-axis).",
        inputs=(
            Input("image", IMAGE, "The images."),
            Input(
                "flip_method",
                COMBO,
                "The mirror axis.",
                options=("x-axis: vertically", "y-axis: horizontally"),
                default="x-axis: vertically",
            ),
        ),
        outputs=(_image_out("The flipped images."),),
    )

    def run(self, ctx: NodeContext, *, image: torch.Tensor, flip_method: str) -> tuple:
        return (torch.flip(image, dims=[1] if flip_method.startswith("x") else [2]),)


class ImageRotate(Node):
    SCHEMA = NodeSchema(
        node_id="ImageRotate",
        display_name="Rotate",
        category="image/transform",
        description="Rotate images clockwise by quarter turns.",
        inputs=(
            Input("image", IMAGE, "The images."),
            Input(
                "rotation",
                COMBO,
                "Clockwise angle.",
                options=("none", "90 degrees", "180 degrees", "270 degrees"),
                default="none",
            ),
        ),
        outputs=(_image_out("The rotated images."),),
    )

    def run(self, ctx: NodeContext, *, image: torch.Tensor, rotation: str) -> tuple:
        turns = {"none": 0, "90 degrees": 1, "180 degrees": 2, "270 degrees": 3}[rotation]
        return (torch.rot90(image, k=turns, dims=[2, 1]),)


class GetImageSize(Node):
    SCHEMA = NodeSchema(
        node_id="GetImageSize",
        display_name="Get Image Size",
        category="image",
        description="Returns width and height of the image, and passes it through unchanged.",
        inputs=(Input("image", IMAGE, "The images."),),
        hidden=(HIDDEN_UNIQUE_ID,),  # ComfyUI shows the size on the node through it; Loom does not
        outputs=(
            Output("width", INT, "Width in pixels."),
            Output("height", INT, "Height in pixels."),
            Output("batch_size", INT, "Number of images."),
        ),
    )

    def run(self, ctx: NodeContext, *, image: torch.Tensor, unique_id: Any = None) -> tuple:
        return image.shape[2], image.shape[1], image.shape[0]


class ImageAddNoise(Node):
    SCHEMA = NodeSchema(
        node_id="ImageAddNoise",
        display_name="ImageAddNoise",
        category="image",
        description="Add seeded Gaussian noise (CPU generator, as ComfyUI) and clamp to 0..1.",
        inputs=(
            Input("image", IMAGE, "The images."),
            Input(
                "seed",
                INT,
                "The random seed used for creating the noise.",
                default=0,
                min=0,
                max=0xFFFFFFFFFFFFFFFF,
                control_after_generate=True,
            ),
            Input("strength", FLOAT, "Noise standard deviation.", default=0.5, min=0.0, max=1.0, step=0.01),
        ),
        outputs=(_image_out("The noisy images."),),
    )

    def run(self, ctx: NodeContext, *, image: torch.Tensor, seed: int, strength: float) -> tuple:
        generator = torch.Generator(device="cpu").manual_seed(seed)
        noise = torch.randn(image.size(), generator=generator, device="cpu").to(image)
        return (torch.clamp(image + strength * noise, min=0.0, max=1.0),)


_SPACING_COLORS: dict[str, tuple[float, ...]] = {
    "white": (1.0, 1.0, 1.0),
    "black": (0.0, 0.0, 0.0),
    "red": (1.0, 0.0, 0.0),
    "green": (0.0, 1.0, 0.0),
    "blue": (0.0, 0.0, 1.0),
}


def _repeat_last_to(image: torch.Tensor, batch: int) -> torch.Tensor:
    """Extend a batch to ``batch`` images by repeating its last image."""
    extra = batch - image.shape[0]
    return torch.cat([image, image[-1:].repeat(extra, 1, 1, 1)]) if extra > 0 else image


def _pad_centered(image: torch.Tensor, dim: int, size: int, value: float) -> torch.Tensor:
    """Pad ``image`` along ``dim`` (1 = height, 2 = width) to ``size``, split evenly (extra after)."""
    missing = size - image.shape[dim]
    if missing <= 0:
        return image
    before, after = missing // 2, missing - missing // 2
    pads = (0, 0, before, after) if dim == 2 else (0, 0, 0, 0, before, after)
    return F.pad(image, pads, mode="constant", value=value)


class ImageStitch(Node):
    SCHEMA = NodeSchema(
        node_id="ImageStitch",
        display_name="Image Stitch",
        category="image/transform",
        description="Stitches image2 to image1 in the specified direction.\nIf image2 is not provided, "
        "returns image1 unchanged.\nOptional spacing can be added between images.",
        inputs=(
            Input("image1", IMAGE, "The base images."),
            Input(
                "direction",
                COMBO,
                "Where image2 goes.",
                options=("right", "down", "left", "up"),
                default="right",
            ),
            Input(
                "match_image_size",
                BOOLEAN,
                "Resize image2 (lanczos, keeping its aspect) to image1's side.",
                default=True,
            ),
            Input(
                "spacing_width",
                INT,
                "Gap between the images (made even).",
                default=0,
                min=0,
                max=1024,
                step=2,
            ),
            Input(
                "spacing_color", COMBO, "Colour of the gap.", options=tuple(_SPACING_COLORS), default="white"
            ),
            Input("image2", IMAGE, "The images to attach.", optional=True),
        ),
        outputs=(_image_out("The stitched images."),),
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        image1: torch.Tensor,
        direction: str,
        match_image_size: bool,
        spacing_width: int,
        spacing_color: str,
        image2: torch.Tensor | None = None,
    ) -> tuple:
        if image2 is None:
            return (image1,)
        batch = max(image1.shape[0], image2.shape[0])
        image1, image2 = _repeat_last_to(image1, batch), _repeat_last_to(image2, batch)
        sideways = direction in ("left", "right")
        if match_image_size:
            h1, w1 = image1.shape[1:3]
            aspect = image2.shape[2] / image2.shape[1]
            width, height = (int(h1 * aspect), h1) if sideways else (w1, int(w1 / aspect))
            image2 = resize_image(image2, width, height, "lanczos")
        else:  # centre the smaller one across the joint, padded with the spacing grey level
            pad_value = 1.0 if spacing_color == "white" else 0.0
            dim = 1 if sideways else 2
            side = max(image1.shape[dim], image2.shape[dim])
            image1, image2 = (
                _pad_centered(image1, dim, side, pad_value),
                _pad_centered(image2, dim, side, pad_value),
            )
        channels = max(image1.shape[-1], image2.shape[-1])
        image1, image2 = match_channels(image1, channels), match_channels(image2, channels)
        parts = [image2, image1] if direction in ("left", "up") else [image1, image2]
        if spacing_width > 0:
            gap = spacing_width + spacing_width % 2
            shape = (
                (batch, image1.shape[1], gap, channels)
                if sideways
                else (batch, gap, image1.shape[2], channels)
            )
            spacing = torch.zeros(shape, dtype=image1.dtype, device=image1.device)
            color = _SPACING_COLORS[spacing_color]
            spacing[..., : min(3, channels)] = torch.tensor(color[: min(3, channels)]).to(image1)
            if channels == 4:
                spacing[..., 3] = 1.0
            parts.insert(1, spacing)
        try:
            return (torch.cat(parts, dim=2 if sideways else 1),)
        except RuntimeError as exc:
            raise ImageError(
                f"image1 is {tuple(image1.shape)} and image2 {tuple(image2.shape)} after matching; they cannot be "
                f"stitched {direction} ({exc}); turn match_image_size on"
            ) from exc


NODES: list[type[Node]] = [
    ImageCrop,
    ImagePadForOutpaint,
    ImageBatch,
    BatchImagesNode,
    ImageFromBatch,
    RepeatImageBatch,
    RebatchImages,
    ImageFlip,
    ImageRotate,
    GetImageSize,
    ImageAddNoise,
    ImageStitch,
]
