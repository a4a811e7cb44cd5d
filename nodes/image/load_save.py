"""Images: load from the input folder, save (PNG with workflow metadata) and preview, resize, invert.

``IMAGE`` is a float tensor [B, H, W, C] in 0..1 and ``MASK`` [B, H, W], as in ComfyUI, so
third-party image nodes interoperate. ``SaveImage`` names files like ComfyUI
(``{prefix}_{counter:05}_.png``, sub-folders allowed in the prefix) and writes the ``prompt`` (API
JSON) and ``workflow`` (editor JSON) text chunks from the hidden PROMPT / EXTRA_PNGINFO inputs,
unless the run's settings say ``png_metadata=False`` (``--no-png-metadata``).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from engine.atomic import write_atomic
from engine.context import Folders, NodeContext
from engine.image_guard import SAFETY_CHUNK
from engine.node import Node, NodeOutput, OutputSizes
from engine.registry import NodeRegistry
from engine.schema import (
    COMBO,
    FLOAT,
    HIDDEN_EXTRA_PNGINFO,
    HIDDEN_PROMPT,
    IMAGE,
    INT,
    MASK,
    STRING,
    DynamicOptions,
    Input,
    NodeSchema,
    Output,
)
from nodes.core.options import OptionSources
from nodes.core.resize import resize_image as resize_bhwc
from nodes.core.resize import size_keeping_aspect
from nodes.core.save_prefix import split_prefix
from nodes.core.tensor_sizes import image_resized, image_size, scaled_by

MAX_RESOLUTION = 16384
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif", ".tif", ".tiff")
SCALE_METHODS = ("nearest-exact", "bilinear", "area", "bicubic", "lanczos")


class ImageError(ValueError):
    """An image file or value a node cannot use; the message says how to fix it."""


def list_input_images(input_dir: Path) -> list[str]:
    """Image files under the input folder, relative, '/'-separated, sorted (LoadImage's choices)."""
    if not input_dir.is_dir():
        return []
    found = [
        p.relative_to(input_dir).as_posix()
        for p in input_dir.rglob("*")
        if p.suffix.lower() in IMAGE_EXTENSIONS
    ]
    return sorted(found)


def register_image_options(registry: NodeRegistry, input_dir: Path) -> None:
    """Provide LoadImage's ``input_images`` combo choices."""
    registry.add_options_source("input_images", lambda: list_input_images(Path(input_dir)))


def input_path(folders: Folders, name: str, default: str = "input") -> Path:
    """The file a LoadImage-style name points at. ComfyUI's annotated names (``"a.png [output]"``,
    ``[input]``, ``[temp]``) pick the folder; otherwise ``default`` does."""
    match = re.match(r"^(.*?)\s*\[(input|output|temp)\]$", name)
    kind = default
    if match:
        name, kind = match.group(1), match.group(2)
    root = {"input": folders.input_dir, "output": folders.output_dir, "temp": folders.temp_dir}[
        kind
    ].resolve()
    path = (root / name).resolve()
    if root not in path.parents:
        raise ImageError(f"image {name!r} points outside the {kind} folder {root}")
    return path


def save_path(output_dir: Path, prefix: str) -> tuple[Path, str, str, int]:
    """(folder, file stem, subfolder, next counter) for ComfyUI-style ``{stem}_{counter:05}_.png``."""
    sub, stem = split_prefix(prefix)
    folder = (output_dir / sub).resolve()
    if folder != output_dir.resolve() and output_dir.resolve() not in folder.parents:
        raise ImageError(
            f"filename_prefix {prefix!r} points outside the output folder; use e.g. 'renders/cat'"
        )
    folder.mkdir(parents=True, exist_ok=True)
    pattern = re.compile(re.escape(stem) + r"_(\d{5,})_\.[A-Za-z0-9]+$")  # any extension, as ComfyUI counts
    counters = [int(m.group(1)) for f in os.listdir(folder) if (m := pattern.match(f))]
    return folder, stem, sub.replace(os.sep, "/"), max(counters, default=0) + 1


def _to_pil(image: torch.Tensor) -> Any:
    pixels = np.clip(255.0 * image.float().cpu().numpy(), 0, 255).astype(np.uint8)  # ComfyUI truncates
    return Image.fromarray(pixels[..., 0] if pixels.shape[-1] == 1 else pixels[..., :4])


def encode_png(image: torch.Tensor, metadata: dict[str, Any] | None, compress_level: int) -> bytes:
    """One [H, W, C] image as PNG file bytes, the metadata as JSON text chunks."""
    from PIL.PngImagePlugin import PngInfo  # lazy: PIL's PNG plugin (~30 ms); only a save needs it

    info = None
    if metadata:
        info = PngInfo()
        for key, value in metadata.items():
            info.add_text(key, json.dumps(value))
    buffer = io.BytesIO()
    _to_pil(image).save(buffer, format="PNG", pnginfo=info, compress_level=compress_level)
    return buffer.getvalue()


def save_images(
    ctx: NodeContext,
    images: torch.Tensor,
    folder_root: Path,
    prefix: str,
    kind: str,
    metadata: dict[str, Any] | None,
    compress_level: int,
    *,
    to_disk: bool = True,
) -> list[dict[str, str]]:
    """Encode and write ``{stem}_{counter:05}_.png`` files; the encoded bytes also go to
    ``ctx.kept_images`` when the run asked for bytes. ``to_disk=False`` (previews for a client that
    asked for bytes) skips the folder entirely: the images then exist only in memory."""
    if to_disk:
        folder, stem, sub, counter = save_path(folder_root, prefix)
    else:
        folder, stem, sub, counter = folder_root, os.path.basename(prefix), "", 1
    results = []
    for i, image in enumerate(images):
        name = f"{stem.replace('%batch_num%', str(i))}_{counter:05}_.png"
        encoded = encode_png(image, metadata, compress_level)
        if to_disk:
            write_atomic(folder / name, encoded)  # a full disk leaves no truncated PNG
        entry = {"filename": name, "subfolder": sub, "type": kind}
        if ctx.kept_images is not None:
            ctx.kept_images.add(ctx.node_id, entry, encoded, on_disk=to_disk)
        results.append(entry)
        counter += 1
    return results


def guarded(ctx: NodeContext, images: torch.Tensor, metadata: dict[str, Any]) -> torch.Tensor:
    """Under ``--safety enforce`` (``ctx.image_guard`` set) images pass the guard before they are written,
    and the PNG gets the ``loom_safety`` chunk so ``/view`` knows they were checked."""
    if ctx.image_guard is None:
        return images
    metadata[SAFETY_CHUNK] = {"checked": True, "policy": ctx.image_guard.policy}
    return ctx.image_guard.check_images(images).images


def preview_images(ctx: NodeContext, images: torch.Tensor) -> list[dict[str, str]]:
    """PreviewImage's saving: PNGs in the temp folder (no workflow metadata), or only in memory when
    the job asked for bytes; returns the UI entries."""
    prefix = "ComfyUI_temp_" + os.urandom(4).hex()[:5]
    metadata: dict[str, Any] = {}
    images = guarded(ctx, images, metadata)
    return save_images(
        ctx,
        images,
        ctx.folders.temp_dir,
        prefix,
        "temp",
        metadata or None,
        1,
        to_disk=ctx.kept_images is None,
    )  # bytes asked for: no disk round trip


def load_image_file(
    folders: Folders, image: str, default: str = "input"
) -> tuple[torch.Tensor, torch.Tensor]:
    """LoadImage's reading of ``image`` (a name in the ``default`` folder, or annotated): the RGB
    image [1, H, W, 3] and the mask [1, H, W] (1 where transparent; zeros without alpha)."""
    from PIL import ImageOps  # lazy: ImageOps and its palettes (~8 ms); only a load needs it

    path = input_path(folders, image, default)
    if not path.is_file():
        raise ImageError(
            f"image {image!r} not found in the {default} folder ({path.parent}); "
            "upload it (POST /upload/image) or copy it there"
        )
    try:
        with Image.open(path) as opened:
            img = ImageOps.exif_transpose(opened)
            img.load()
    except (UnidentifiedImageError, OSError) as exc:
        raise ImageError(f"{image!r} is not an image PIL can read ({exc}); use PNG, JPEG or WebP") from exc
    if img.mode == "I":
        img = img.point(lambda v: v * (1 / 255))
    rgb = torch.from_numpy(np.asarray(img.convert("RGB"), dtype=np.float32) / 255.0)[None]
    if "A" in img.getbands():
        alpha = torch.from_numpy(np.asarray(img.getchannel("A"), dtype=np.float32) / 255.0)
        mask = (1.0 - alpha)[None]
    else:
        mask = torch.zeros(1, rgb.shape[1], rgb.shape[2])
    return rgb, mask


class LoadImage(Node):
    SCHEMA = NodeSchema(
        node_id="LoadImage",
        display_name="Load Image",
        category="image",
        description="Load an image from the input folder; the mask comes from its alpha channel.",
        inputs=(
            Input(
                "image",
                COMBO,
                "An image file in the input folder (or upload one).",
                options=DynamicOptions("input_images"),
                image_upload=True,
            ),
        ),
        outputs=(
            Output("IMAGE", IMAGE, "The image [1, H, W, 3] in 0..1."),
            Output("MASK", MASK, "1 where the image is transparent, [1, H, W]; zeros without alpha."),
        ),
    )

    @classmethod
    def fingerprint(cls, folders: Folders, **inputs: Any) -> Any:
        try:
            return hashlib.sha256(input_path(folders, str(inputs.get("image", ""))).read_bytes()).hexdigest()
        except (OSError, ImageError):
            return "missing"  # the run reports the problem

    def run(self, ctx: NodeContext, *, image: str) -> tuple[torch.Tensor, torch.Tensor]:
        return load_image_file(ctx.folders, image)


class SaveImage(Node):
    SCHEMA = NodeSchema(
        node_id="SaveImage",
        display_name="Save Image",
        category="image",
        description="Save images as PNG in the output folder, with the workflow embedded.",
        inputs=(
            Input("images", IMAGE, "The images to save."),
            Input("filename_prefix", STRING, "File name prefix; may contain sub-folders.", default="ComfyUI"),
        ),
        hidden=(HIDDEN_PROMPT, HIDDEN_EXTRA_PNGINFO),
        output_node=True,
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        images: torch.Tensor,
        filename_prefix: str,
        prompt: Any = None,
        extra_pnginfo: Any = None,
    ) -> NodeOutput:
        metadata: dict[str, Any] = {}
        if ctx.settings.png_metadata:
            if prompt is not None:
                metadata["prompt"] = prompt
            metadata.update(extra_pnginfo or {})
        images = guarded(ctx, images, metadata)
        results = save_images(ctx, images, ctx.folders.output_dir, filename_prefix, "output", metadata, 4)
        return NodeOutput(ui={"images": results})


class PreviewImage(Node):
    SCHEMA = NodeSchema(
        node_id="PreviewImage",
        display_name="Preview Image",
        category="image",
        description="Show images without keeping them (written to the temp folder, or kept only in memory "
        "when the job asked for bytes).",
        inputs=(Input("images", IMAGE, "The images to preview."),),
        hidden=(HIDDEN_PROMPT, HIDDEN_EXTRA_PNGINFO),
        output_node=True,
    )

    def run(
        self, ctx: NodeContext, *, images: torch.Tensor, prompt: Any = None, extra_pnginfo: Any = None
    ) -> NodeOutput:
        return NodeOutput(ui={"images": preview_images(ctx, images)})


def resize_image(
    image: torch.Tensor, width: int, height: int, method: str, crop: str = "disabled"
) -> torch.Tensor:
    """ImageScale's resize of [B, H, W, C]: 0 for one side keeps the aspect ratio (both 0: unchanged);
    ``crop="center"`` crops to the target aspect first. Methods: :data:`nodes.core.resize.UPSCALE_METHODS`."""
    if width == 0 and height == 0:
        return image
    width, height = size_keeping_aspect(width, height, image.shape[2], image.shape[1])
    return resize_bhwc(image, width, height, method, crop)


class ImageScale(Node):
    SCHEMA = NodeSchema(
        node_id="ImageScale",
        display_name="Upscale Image",
        category="image/upscaling",
        description="Resize images to a size (0 for one side keeps the aspect ratio).",
        inputs=(
            Input("image", IMAGE, "The images."),
            Input("upscale_method", COMBO, "Interpolation.", options=SCALE_METHODS, default="nearest-exact"),
            Input(
                "width", INT, "Target width; 0 = from height.", default=512, min=0, max=MAX_RESOLUTION, step=1
            ),
            Input(
                "height",
                INT,
                "Target height; 0 = from width.",
                default=512,
                min=0,
                max=MAX_RESOLUTION,
                step=1,
            ),
            Input(
                "crop",
                COMBO,
                "Centre-crop to the target aspect first.",
                options=("disabled", "center"),
                default="disabled",
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
        width: int,
        height: int,
        crop: str,
    ) -> tuple[torch.Tensor]:
        return (resize_image(image, width, height, upscale_method, crop),)

    @classmethod
    def estimate_outputs(
        cls, *, image: Any = None, width: Any = None, height: Any = None, **_: Any
    ) -> OutputSizes:
        if not isinstance(width, int) or not isinstance(height, int):
            return (None,)
        if width == 0 and height == 0:
            return (image,)
        return (image_resized(image, lambda w, h: size_keeping_aspect(width, height, w, h)),)


class ImageScaleBy(Node):
    SCHEMA = NodeSchema(
        node_id="ImageScaleBy",
        display_name="Upscale Image By",
        category="image/upscaling",
        description="Resize images by a factor.",
        inputs=(
            Input("image", IMAGE, "The images."),
            Input("upscale_method", COMBO, "Interpolation.", options=SCALE_METHODS, default="nearest-exact"),
            Input("scale_by", FLOAT, "Factor.", default=1.0, min=0.01, max=8.0, step=0.01),
        ),
        outputs=(Output("IMAGE", IMAGE, "Resized images."),),
    )

    def run(
        self, ctx: NodeContext, *, image: torch.Tensor, upscale_method: str, scale_by: float
    ) -> tuple[torch.Tensor]:
        h, w = image.shape[1:3]
        return (resize_bhwc(image, max(1, round(w * scale_by)), max(1, round(h * scale_by)), upscale_method),)

    @classmethod
    def estimate_outputs(cls, *, image: Any = None, scale_by: Any = None, **_: Any) -> OutputSizes:
        to = scaled_by(scale_by)
        return (image_resized(image, to) if to is not None else None,)


class ImageInvert(Node):
    SCHEMA = NodeSchema(
        node_id="ImageInvert",
        display_name="Invert Image",
        category="image",
        description="Invert colours (1 - value).",
        inputs=(Input("image", IMAGE, "The images."),),
        outputs=(Output("IMAGE", IMAGE, "Inverted images."),),
    )

    def run(self, ctx: NodeContext, *, image: torch.Tensor) -> tuple[torch.Tensor]:
        return (1.0 - image,)


class EmptyImage(Node):
    SCHEMA = NodeSchema(
        node_id="EmptyImage",
        display_name="EmptyImage",
        category="image",
        description="A batch of images filled with one colour.",
        inputs=(
            Input("width", INT, "Width in pixels.", default=512, min=1, max=MAX_RESOLUTION, step=1),
            Input("height", INT, "Height in pixels.", default=512, min=1, max=MAX_RESOLUTION, step=1),
            Input("batch_size", INT, "Number of images.", default=1, min=1, max=4096),
            Input("color", INT, "Colour as 0xRRGGBB.", default=0, min=0, max=0xFFFFFF, step=1),
        ),
        outputs=(Output("IMAGE", IMAGE, "The images."),),
    )

    def run(
        self, ctx: NodeContext, *, width: int, height: int, batch_size: int, color: int
    ) -> tuple[torch.Tensor]:
        rgb = (
            torch.tensor([(color >> 16) & 0xFF, (color >> 8) & 0xFF, color & 0xFF], dtype=torch.float32)
            / 255.0
        )
        return (rgb.view(1, 1, 1, 3).repeat(batch_size, height, width, 1),)

    @classmethod
    def estimate_outputs(
        cls, *, width: Any = None, height: Any = None, batch_size: Any = None, **_: Any
    ) -> OutputSizes:
        return (image_size(batch_size, height, width),)


class ImageToMask(Node):
    SCHEMA = NodeSchema(
        node_id="ImageToMask",
        display_name="Convert Image to Mask",
        category="mask",
        description="Take one colour channel of an image as a mask.",
        inputs=(
            Input("image", IMAGE, "The images."),
            Input(
                "channel", COMBO, "Which channel.", options=("red", "green", "blue", "alpha"), default="red"
            ),
        ),
        outputs=(Output("MASK", MASK, "The channel as a mask [B, H, W]."),),
    )

    def run(self, ctx: NodeContext, *, image: torch.Tensor, channel: str) -> tuple[torch.Tensor]:
        index = ("red", "green", "blue", "alpha").index(channel)
        if index >= image.shape[-1]:
            raise ImageError(f"the image has {image.shape[-1]} channels, so it has no {channel} channel")
        return (image[..., index],)


NODES: list[type[Node]] = [
    LoadImage,
    SaveImage,
    PreviewImage,
    ImageScale,
    ImageScaleBy,
    ImageInvert,
    EmptyImage,
    ImageToMask,
]


def register_options(registry: NodeRegistry, sources: OptionSources) -> None:
    """LoadImage's choices, when the input folder is known."""
    if sources.input_dir is not None:
        register_image_options(registry, sources.input_dir)
