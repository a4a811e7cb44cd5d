"""ComfyUI's dataset image nodes (``comfy_extras/nodes_dataset.py``, category ``dataset/image``):
resize by the longer or shorter edge, centre and random crops, normalise, brightness, contrast, and
the whole-list nodes ImageGrid and ImageDeduplication.

ComfyUI runs the per-image nodes on one IMAGE at a time (a list input runs them once per item) and
goes through Pillow for the resizes and crops: the image is quantised to 8 bits, resized with
Pillow's Lanczos filter and read back, so Loom does the same to give the same pixels. Where
ComfyUI's own helper fails (a batch of more than one image), Loom treats each image of the batch
alike. The colour nodes leave an alpha channel as it is (it is transparency, not colour).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from PIL import Image

from engine.context import NodeContext
from engine.node import Node
from engine.schema import FLOAT, IMAGE, INT, Input, NodeSchema, Output

CATEGORY = "dataset/image"
SEED_MAX = 0xFFFF_FFFF_FFFF_FFFF
EDGE_MAX = 8192


class DatasetImageError(ValueError):
    """An image list or widget value a dataset node cannot use; the message names the input."""


def to_pil(image: torch.Tensor) -> Image.Image:
    """One [H, W, C] image (C 1, 3 or 4) as an 8-bit Pillow image, as ComfyUI quantises it."""
    pixels = (image.detach().cpu().float().numpy() * 255).clip(0, 255).astype(np.uint8)
    if pixels.shape[-1] == 1:
        pixels = pixels[..., 0]
    return Image.fromarray(pixels)


def from_pil(picture: Image.Image) -> torch.Tensor:
    """A Pillow image as a [1, H, W, C] float tensor in 0..1."""
    pixels = torch.from_numpy(np.array(picture).astype(np.float32) / 255.0)
    if pixels.ndim == 2:
        pixels = pixels[..., None]
    return pixels[None]


def _per_image(images: torch.Tensor, step: Callable[[Image.Image], Image.Image]) -> torch.Tensor:
    """``step`` applied through Pillow to each image of a [B, H, W, C] batch."""
    if not isinstance(images, torch.Tensor) or images.ndim != 4:
        found = tuple(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__
        raise DatasetImageError(f"images: expected an IMAGE batch [B, H, W, C], found {found}")
    return torch.cat([from_pil(step(to_pil(item))) for item in images]).to(images.dtype)


def _colour_only(images: torch.Tensor, change: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``change`` applied to the colour channels; a fourth (alpha) channel is kept as it is."""
    if images.shape[-1] == 4:
        return torch.cat([change(images[..., :3]), images[..., 3:]], dim=-1)
    return change(images)


def _images_input() -> Input:
    return Input("images", IMAGE, "Image to process.")


def _output() -> tuple[Output, ...]:
    return (Output("images", IMAGE, "Processed images"),)


def _resized(images: torch.Tensor, edge: int, longer: bool) -> torch.Tensor:
    def step(picture: Image.Image) -> Image.Image:
        w, h = picture.size
        width_is_edge = w > h if longer else w < h
        size = (edge, int(h * (edge / w))) if width_is_edge else (int(w * (edge / h)), edge)
        if min(size) < 1:
            raise DatasetImageError(
                f"{'longer' if longer else 'shorter'}_edge: {edge} would make a {w}x{h} image "
                f"{size[0]}x{size[1]}; choose a larger edge"
            )
        return picture.resize(size, Image.Resampling.LANCZOS)

    return _per_image(images, step)


class ResizeImagesByLongerEdge(Node):
    SCHEMA = NodeSchema(
        node_id="ResizeImagesByLongerEdge",
        display_name="Resize Images by Longer Edge",
        category=CATEGORY,
        description="Resize images so that the longer edge matches the specified length while preserving aspect ratio.",
        inputs=(
            _images_input(),
            Input(
                "longer_edge",
                INT,
                "Target length for the longer edge.",
                default=1024,
                min=1,
                max=EDGE_MAX,
            ),
        ),
        outputs=_output(),
        experimental=True,
        deprecated=True,
    )

    def run(self, ctx: NodeContext, *, images: torch.Tensor, longer_edge: int) -> tuple[torch.Tensor]:
        return (_resized(images, longer_edge, longer=True),)


class ResizeImagesByShorterEdge(Node):
    SCHEMA = NodeSchema(
        node_id="ResizeImagesByShorterEdge",
        display_name="Resize Images by Shorter Edge",
        category=CATEGORY,
        description="Resize images so that the shorter edge matches the specified length while preserving aspect ratio.",
        inputs=(
            _images_input(),
            Input(
                "shorter_edge",
                INT,
                "Target length for the shorter edge.",
                default=512,
                min=1,
                max=EDGE_MAX,
            ),
        ),
        outputs=_output(),
        experimental=True,
        deprecated=True,
    )

    def run(self, ctx: NodeContext, *, images: torch.Tensor, shorter_edge: int) -> tuple[torch.Tensor]:
        return (_resized(images, shorter_edge, longer=False),)


def _crop_size_inputs() -> tuple[Input, Input]:
    return (
        Input("width", INT, "Crop width.", default=512, min=1, max=EDGE_MAX),
        Input("height", INT, "Crop height.", default=512, min=1, max=EDGE_MAX),
    )


def crop_box(picture: Image.Image, left: int, top: int, width: int, height: int) -> Image.Image:
    """Pillow's crop of the region from (left, top), cut at the image's right and bottom edges."""
    return picture.crop((left, top, min(picture.width, left + width), min(picture.height, top + height)))


class CenterCropImages(Node):
    SCHEMA = NodeSchema(
        node_id="CenterCropImages",
        display_name="Crop Image (Center)",
        category=CATEGORY,
        description="Center crop all images to the specified dimensions.",
        inputs=(_images_input(), *_crop_size_inputs()),
        outputs=_output(),
        experimental=True,
    )

    def run(self, ctx: NodeContext, *, images: torch.Tensor, width: int, height: int) -> tuple[torch.Tensor]:
        def step(picture: Image.Image) -> Image.Image:
            left = max(0, (picture.width - width) // 2)
            top = max(0, (picture.height - height) // 2)
            return crop_box(picture, left, top, width, height)

        return (_per_image(images, step),)


class RandomCropImages(Node):
    SCHEMA = NodeSchema(
        node_id="RandomCropImages",
        display_name="Crop Image (Random)",
        category=CATEGORY,
        description="Randomly crop all images to the specified dimensions (for data augmentation).",
        inputs=(
            _images_input(),
            *_crop_size_inputs(),
            Input("seed", INT, "Random seed.", default=0, min=0, max=SEED_MAX),
        ),
        outputs=_output(),
        experimental=True,
    )

    def run(
        self, ctx: NodeContext, *, images: torch.Tensor, width: int, height: int, seed: int
    ) -> tuple[torch.Tensor]:
        # ComfyUI reseeds numpy's global generator per call; a private one gives the same draws.
        draws = np.random.RandomState(seed % (2**32 - 1))

        def step(picture: Image.Image) -> Image.Image:
            max_left, max_top = max(0, picture.width - width), max(0, picture.height - height)
            left = int(draws.randint(0, max_left + 1)) if max_left > 0 else 0
            top = int(draws.randint(0, max_top + 1)) if max_top > 0 else 0
            return crop_box(picture, left, top, width, height)

        return (_per_image(images, step),)


class NormalizeImages(Node):
    SCHEMA = NodeSchema(
        node_id="NormalizeImages",
        display_name="Normalize Image Colors",
        category=CATEGORY,
        description="Normalize images using mean and standard deviation.",
        inputs=(
            _images_input(),
            Input("mean", FLOAT, "Mean value for normalization.", default=0.5, min=0.0, max=1.0),
            Input("std", FLOAT, "Standard deviation for normalization.", default=0.5, min=0.001, max=1.0),
        ),
        outputs=_output(),
        experimental=True,
    )

    def run(self, ctx: NodeContext, *, images: torch.Tensor, mean: float, std: float) -> tuple[torch.Tensor]:
        if std <= 0:
            raise DatasetImageError(f"std: expected a value above 0 (at least 0.001), found {std}")
        return (_colour_only(images, lambda rgb: (rgb - mean) / std),)


def _factor_input(what: str, less: str) -> Input:
    return Input(
        "factor",
        FLOAT,
        f"{what} factor. 1.0 = no change, <1.0 = {less}, >1.0 = {'brighter' if what == 'Brightness' else 'more contrast'}.",
        default=1.0,
        min=0.0,
        max=2.0,
    )


class AdjustBrightness(Node):
    SCHEMA = NodeSchema(
        node_id="AdjustBrightness",
        display_name="Adjust Brightness",
        category=CATEGORY,
        description="Adjust brightness of all images.",
        inputs=(_images_input(), _factor_input("Brightness", "darker")),
        outputs=_output(),
        experimental=True,
    )

    def run(self, ctx: NodeContext, *, images: torch.Tensor, factor: float) -> tuple[torch.Tensor]:
        return (_colour_only(images, lambda rgb: (rgb * factor).clamp(0.0, 1.0)),)


class AdjustContrast(Node):
    SCHEMA = NodeSchema(
        node_id="AdjustContrast",
        display_name="Adjust Contrast",
        category=CATEGORY,
        description="Adjust contrast of all images.",
        inputs=(_images_input(), _factor_input("Contrast", "less contrast")),
        outputs=_output(),
        experimental=True,
    )

    def run(self, ctx: NodeContext, *, images: torch.Tensor, factor: float) -> tuple[torch.Tensor]:
        return (_colour_only(images, lambda rgb: ((rgb - 0.5) * factor + 0.5).clamp(0.0, 1.0)),)


def _first(value: Any) -> Any:
    """A widget of an ``input_is_list`` node arrives as a list of one value."""
    return value[0] if isinstance(value, list | tuple) and value else value


def _image_items(images: Any) -> list[torch.Tensor]:
    """Every image of a list input, each batch split into its images ([1, H, W, C] each)."""
    items = images if isinstance(images, list | tuple) else [images]
    out: list[torch.Tensor] = []
    for i, item in enumerate(items):
        if not isinstance(item, torch.Tensor) or item.ndim != 4:
            found = tuple(item.shape) if isinstance(item, torch.Tensor) else type(item).__name__
            raise DatasetImageError(f"images: item {i} is not an IMAGE batch [B, H, W, C] (found {found})")
        out.extend(item[j : j + 1] for j in range(item.shape[0]))
    return out


class ImageGrid(Node):
    SCHEMA = NodeSchema(
        node_id="ImageGrid",
        display_name="Make Image Grid",
        category=CATEGORY,
        description="Arrange multiple images into a grid layout.",
        inputs=(
            Input("images", IMAGE, "List of images to process."),
            Input("columns", INT, "Number of columns in the grid.", default=4, min=1, max=20),
            Input("cell_width", INT, "Width of each cell in the grid.", default=256, min=32, max=2048),
            Input("cell_height", INT, "Height of each cell in the grid.", default=256, min=32, max=2048),
            Input("padding", INT, "Padding between images.", default=4, min=0, max=50),
        ),
        outputs=_output(),
        experimental=True,
        input_is_list=True,
    )

    def run(
        self, ctx: NodeContext, *, images: Any, columns: Any, cell_width: Any, cell_height: Any, padding: Any
    ) -> tuple[torch.Tensor]:
        cols, cw, ch, pad = (int(_first(v)) for v in (columns, cell_width, cell_height, padding))
        items = _image_items(images)
        if not items:
            raise DatasetImageError("images: cannot make a grid of an empty list; connect at least one image")
        rows = (len(items) + cols - 1) // cols
        grid = Image.new("RGB", (cols * cw + (cols - 1) * pad, rows * ch + (rows - 1) * pad), (0, 0, 0))
        for index, item in enumerate(items):
            cell = to_pil(item[0]).resize((cw, ch), Image.Resampling.LANCZOS)
            grid.paste(cell, ((index % cols) * (cw + pad), (index // cols) * (ch + pad)))
        return (from_pil(grid),)


def average_hash(image: torch.Tensor) -> list[bool]:
    """ComfyUI's 64-bit perceptual hash: the image at 8x8 (Lanczos), grey, each pixel above the mean."""
    small = list(to_pil(image[0]).resize((8, 8), Image.Resampling.LANCZOS).convert("L").getdata())
    mean = sum(small) / len(small)
    return [p > mean for p in small]


class ImageDeduplication(Node):
    SCHEMA = NodeSchema(
        node_id="ImageDeduplication",
        display_name="Deduplicate Images",
        category=CATEGORY,
        description="Remove duplicate or very similar images from the dataset.",
        inputs=(
            Input("images", IMAGE, "List of images to process."),
            Input(
                "similarity_threshold",
                FLOAT,
                "Similarity threshold (0-1). Higher means more similar. Images above this threshold are considered duplicates.",
                default=0.95,
                min=0.0,
                max=1.0,
            ),
        ),
        outputs=(Output("images", IMAGE, "Processed images", is_list=True),),
        experimental=True,
        input_is_list=True,
    )

    def run(self, ctx: NodeContext, *, images: Any, similarity_threshold: Any) -> tuple[list[torch.Tensor]]:
        threshold = float(_first(similarity_threshold))
        items = images if isinstance(images, list | tuple) else [images]
        _image_items(items)  # every item checked
        hashes = [average_hash(item) for item in items]
        kept: list[int] = []
        for i, bits in enumerate(hashes):
            if not any(
                1.0 - sum(a != b for a, b in zip(bits, hashes[j], strict=True)) / 64.0 >= threshold
                for j in kept
            ):
                kept.append(i)
        return ([items[i] for i in kept],)


NODES: list[type[Node]] = [
    ResizeImagesByLongerEdge,
    ResizeImagesByShorterEdge,
    CenterCropImages,
    RandomCropImages,
    NormalizeImages,
    AdjustBrightness,
    AdjustContrast,
    ImageGrid,
    ImageDeduplication,
]
