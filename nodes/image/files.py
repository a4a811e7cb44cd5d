"""Image files beyond LoadImage/SaveImage: LoadImageMask, LoadImageOutput, SaveAnimatedWEBP,
SaveAnimatedPNG (ComfyUI's names, inputs and semantics).

The animated savers follow SaveImage (nodes/image/load_save.py): ComfyUI's ``{prefix}_{counter:05}_`` names
and sub-folders, the safety guard before anything is written, bytes kept for clients that asked
for them, and the workflow embedded as ComfyUI embeds it — for WebP in EXIF tags (0x0110 Model =
``"prompt:{json}"``, then 0x010F Make and downwards = ``"{key}:{json}"`` per extra_pnginfo item),
for APNG in ``comf`` chunks after the image data (``key\\0json``), which ComfyUI's loader reads.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from engine.context import Folders, NodeContext
from engine.image_guard import SAFETY_CHUNK
from engine.node import Node, NodeOutput
from engine.registry import NodeRegistry
from engine.schema import (
    BOOLEAN,
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
from nodes.image.load_save import IMAGE_EXTENSIONS, LoadImage, guarded, load_image_file, save_path

WEBP_METHODS = {"default": 4, "fastest": 0, "slowest": 6}


def list_output_images(output_dir: Path) -> list[str]:
    """Images in the output folder, newest first, named as ComfyUI annotates them (``"a.png [output]"``)."""
    if not output_dir.is_dir():
        return []
    found = [p for p in output_dir.rglob("*") if p.suffix.lower() in IMAGE_EXTENSIONS and p.is_file()]
    found.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    return [f"{p.relative_to(output_dir).as_posix()} [output]" for p in found]


def register_output_options(registry: NodeRegistry, output_dir: Path) -> None:
    """Provide LoadImageOutput's ``output_images`` combo choices."""
    registry.add_options_source("output_images", lambda: list_output_images(Path(output_dir)))


class LoadImageMask(Node):
    SCHEMA = NodeSchema(
        node_id="LoadImageMask",
        display_name="Load Image (as Mask)",
        category="mask",
        description="Load one channel of an image from the input folder as a mask (alpha: 1 = transparent).",
        inputs=(
            Input(
                "image",
                COMBO,
                "An image file in the input folder (or upload one).",
                options=DynamicOptions("input_images"),
                image_upload=True,
            ),
            Input(
                "channel",
                COMBO,
                "Which channel becomes the mask.",
                options=("alpha", "red", "green", "blue"),
                default="alpha",
            ),
        ),
        outputs=(Output("MASK", MASK, "The channel [1, H, W] (for alpha: 1 - alpha; zeros without alpha)."),),
    )

    @classmethod
    def fingerprint(cls, folders: Folders, **inputs: Any) -> Any:
        return LoadImage.fingerprint(folders, **inputs)

    def run(self, ctx: NodeContext, *, image: str, channel: str) -> tuple:
        rgb, mask = load_image_file(ctx.folders, image)
        if channel == "alpha":
            return (mask,)
        return (rgb[..., ("red", "green", "blue").index(channel)].clone(),)


class LoadImageOutput(Node):
    SCHEMA = NodeSchema(
        node_id="LoadImageOutput",
        display_name="Load Image (from Outputs)",
        category="image",
        description="Load an image from the output folder. When the refresh button is clicked, the node will "
        "update the image list and automatically select the first image, allowing for easy iteration.",
        inputs=(
            Input(
                "image",
                COMBO,
                "An image in the output folder (newest first).",
                options=DynamicOptions("output_images"),
                image_upload=True,
                extra={
                    "image_folder": "output",
                    "remote": {
                        "route": "/internal/files/output",
                        "refresh_button": True,
                        "control_after_refresh": "first",
                    },
                },
            ),
        ),
        outputs=(
            Output("IMAGE", IMAGE, "The image [1, H, W, 3] in 0..1."),
            Output("MASK", MASK, "1 where the image is transparent, [1, H, W]."),
        ),
        experimental=True,
    )

    @classmethod
    def fingerprint(cls, folders: Folders, **inputs: Any) -> Any:
        return LoadImage.fingerprint(folders, **inputs)

    def run(self, ctx: NodeContext, *, image: str) -> tuple:
        return load_image_file(ctx.folders, image)  # ComfyUI: annotated names pick the folder


def _frames(images: torch.Tensor) -> list[Any]:
    pixels = (images.clamp(0, 1) * 255).cpu().numpy().astype(np.uint8)  # truncating, as ComfyUI
    return [Image.fromarray(p[..., 0] if p.shape[-1] == 1 else p) for p in pixels]


def _metadata(ctx: NodeContext, prompt: Any, extra_pnginfo: Any) -> dict[str, Any]:
    metadata: dict[str, Any] = {}
    if ctx.settings.png_metadata:
        if prompt is not None:
            metadata["prompt"] = prompt
        metadata.update(extra_pnginfo or {})
    return metadata


def _write(ctx: NodeContext, prefix: str, extension: str, encoded: bytes, frames: int) -> NodeOutput:
    """Write one animation file like SaveImage names files; the UI entry as ComfyUI gives it."""
    folder, stem, sub, counter = save_path(ctx.folders.output_dir, prefix)
    name = f"{stem}_{counter:05}_.{extension}"
    (folder / name).write_bytes(encoded)
    entry = {"filename": name, "subfolder": sub, "type": "output"}
    if ctx.kept_images is not None:
        ctx.kept_images.add(ctx.node_id, entry, encoded, on_disk=True)
    ui: dict[str, Any] = {"images": [entry]}
    if frames > 1:
        ui["animated"] = (True,)
    return NodeOutput(ui=ui)


_SAVE_INPUTS = (
    Input("images", IMAGE, "The frames, in order."),
    Input("filename_prefix", STRING, "File name prefix; may contain sub-folders.", default="ComfyUI"),
    Input("fps", FLOAT, "Frames per second.", default=6.0, min=0.01, max=1000.0, step=0.01),
)


class SaveAnimatedWEBP(Node):
    SCHEMA = NodeSchema(
        node_id="SaveAnimatedWEBP",
        display_name="SaveAnimatedWEBP",
        category="image/animation",
        description="Save the batch as one animated WebP in the output folder, the workflow in its EXIF.",
        inputs=(
            *_SAVE_INPUTS,
            Input("lossless", BOOLEAN, "Lossless compression.", default=True),
            Input("quality", INT, "Quality (lossy) or effort (lossless), 0-100.", default=80, min=0, max=100),
            Input(
                "method",
                COMBO,
                "Encoder speed/size trade-off.",
                options=tuple(WEBP_METHODS),
                default="default",
            ),
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
        fps: float,
        lossless: bool,
        quality: int,
        method: str,
        prompt: Any = None,
        extra_pnginfo: Any = None,
    ) -> NodeOutput:
        metadata = _metadata(ctx, prompt, extra_pnginfo)
        images = guarded(ctx, images, metadata)
        frames = _frames(images)
        exif = frames[0].getexif()
        if "prompt" in metadata:
            exif[0x0110] = "prompt:" + json.dumps(metadata["prompt"])
        tag = 0x010F
        for key, value in metadata.items():
            if key != "prompt":
                exif[tag] = f"{key}:{json.dumps(value)}"
                tag -= 1
        buffer = io.BytesIO()
        frames[0].save(
            buffer,
            format="WEBP",
            save_all=True,
            append_images=frames[1:],
            duration=int(1000.0 / fps),
            exif=exif,
            lossless=lossless,
            quality=quality,
            method=WEBP_METHODS[method],
        )
        return _write(ctx, filename_prefix, "webp", buffer.getvalue(), len(frames))


class SaveAnimatedPNG(Node):
    SCHEMA = NodeSchema(
        node_id="SaveAnimatedPNG",
        display_name="SaveAnimatedPNG",
        category="image/animation",
        description="Save the batch as one animated PNG (APNG) in the output folder, with the workflow.",
        inputs=(*_SAVE_INPUTS, Input("compress_level", INT, "zlib level 0-9.", default=4, min=0, max=9)),
        hidden=(HIDDEN_PROMPT, HIDDEN_EXTRA_PNGINFO),
        output_node=True,
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        images: torch.Tensor,
        filename_prefix: str,
        fps: float,
        compress_level: int,
        prompt: Any = None,
        extra_pnginfo: Any = None,
    ) -> NodeOutput:
        from PIL.PngImagePlugin import PngInfo  # lazy: PIL's PNG plugin (~30 ms); only a save needs it

        metadata = _metadata(ctx, prompt, extra_pnginfo)
        images = guarded(ctx, images, metadata)
        info = PngInfo()
        for key, value in metadata.items():
            if key == SAFETY_CHUNK:  # the guard's mark: a text chunk, as SaveImage writes it
                info.add_text(key, json.dumps(value))
            else:
                info.add(
                    b"comf",
                    key.encode("latin-1") + b"\0" + json.dumps(value).encode("latin-1"),
                    after_idat=True,
                )
        frames = _frames(images)
        buffer = io.BytesIO()
        frames[0].save(
            buffer,
            format="PNG",
            save_all=True,
            append_images=frames[1:],
            duration=int(1000.0 / fps),
            pnginfo=info,
            compress_level=compress_level,
        )
        return _write(ctx, filename_prefix, "png", buffer.getvalue(), len(frames))


NODES: list[type[Node]] = [LoadImageMask, LoadImageOutput, SaveAnimatedWEBP, SaveAnimatedPNG]


def register_options(registry: NodeRegistry, sources: OptionSources) -> None:
    """LoadImageOutput's choices, when the output folder is known."""
    if sources.output_dir is not None:
        register_output_options(registry, sources.output_dir)
