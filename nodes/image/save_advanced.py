"""ComfyUI's Save Image (Advanced) — PNG 8/16-bit, OpenEXR half/float, AVIF still or animated —
and the Image Compare output node.

``format`` is a dynamic combo: each format reveals its own options, declared flat as ComfyUI sends
them (``format.bit_depth``, ``format.input_color_space``, ``format.crf``, ``format.save_mode`` and,
for animated AVIF, ``format.save_mode.fps`` / ``format.save_mode.loop_count``), each naming the
choices that reveal it. AVIF is written 8-bit (Pillow's encoder); the 10-bit and HDR AVIF options
are refused with the formats that hold them.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import torch

from engine.atomic import write_atomic
from engine.context import NodeContext
from engine.node import NativeNodeDef, Node, NodeOutput
from engine.schema import (
    COMBO,
    FLOAT,
    HIDDEN_EXTRA_PNGINFO,
    HIDDEN_PROMPT,
    IMAGE,
    INT,
    STRING,
    Input,
    NodeSchema,
    Output,
)
from nodes.image import image_encodings as enc
from nodes.image.load_save import encode_png, guarded, preview_images, save_path

BIT_DEPTHS = {
    "png": ("8-bit", "16-bit"),
    "exr": ("16-bit float", "32-bit float"),
    "avif": ("auto", "8-bit YUV420", "10-bit YUV420"),
}
COLOR_SPACES = {
    "png": ("sRGB",),
    "exr": ("sRGB", "HDR", "linear", "linear ACEScg"),
    "avif": ("sRGB", "HDR", "HDR PQ"),
}
SAVE_MODES = ("still images", "animated")


def _union(table: dict[str, tuple[str, ...]]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(v for values in table.values() for v in values))


def _revealed(combo: str, *choices: str) -> dict[str, Any]:
    return {"revealed_by": {"input": combo, "choices": list(choices)}}


class SaveImageAdvanced(Node):
    SCHEMA = NodeSchema(
        node_id="SaveImageAdvanced",
        display_name="Save Image (Advanced)",
        category="image",
        description="Save images as 8/16-bit PNG, half/float OpenEXR (scene-linear) or AVIF, with the workflow embedded.",
        inputs=(
            Input("images", IMAGE, "The images to save."),
            Input("filename_prefix", STRING, "File name prefix; may contain sub-folders.", default="ComfyUI"),
            Input(
                "format",
                COMBO,
                "The file format; each reveals its own options.",
                options=tuple(BIT_DEPTHS),
                default="png",
            ),
            Input(
                "format.bit_depth",
                COMBO,
                "Bit depth (PNG: 8/16-bit; EXR: 16/32-bit float; AVIF: auto/8-bit/10-bit YUV420).",
                options=_union(BIT_DEPTHS),
                default="8-bit",
                optional=True,
                extra=_revealed("format", *BIT_DEPTHS),
            ),
            Input(
                "format.input_color_space",
                COMBO,
                "What the pixels hold: sRGB, HLG Rec.2020 (HDR), scene-linear Rec.709 or ACEScg (EXR).",
                options=_union(COLOR_SPACES),
                default="sRGB",
                optional=True,
                extra=_revealed("format", *BIT_DEPTHS),
            ),
            Input(
                "format.crf",
                INT,
                "AVIF quality: lower is better and larger.",
                default=18,
                min=1,
                max=63,
                optional=True,
                extra=_revealed("format", "avif"),
            ),
            Input(
                "format.save_mode",
                COMBO,
                "AVIF: each image its own file, or the batch as one animation.",
                options=SAVE_MODES,
                default="still images",
                optional=True,
                extra=_revealed("format", "avif"),
            ),
            Input(
                "format.save_mode.fps",
                FLOAT,
                "Animation frame rate.",
                default=6.0,
                min=0.01,
                max=1000.0,
                step=0.01,
                optional=True,
                extra=_revealed("format.save_mode", "animated"),
            ),
            Input(
                "format.save_mode.loop_count",
                INT,
                "Animation loops (0: forever).",
                default=0,
                min=0,
                max=1000,
                optional=True,
                extra=_revealed("format.save_mode", "animated"),
            ),
        ),
        outputs=(Output("images", IMAGE, "The images, unchanged."),),
        hidden=(HIDDEN_PROMPT, HIDDEN_EXTRA_PNGINFO),
        output_node=True,
    )

    def run(
        self, ctx: NodeContext, *, images: torch.Tensor, filename_prefix: str, format: str, **options: Any
    ) -> NodeOutput:
        bit_depth = options.get("format.bit_depth", BIT_DEPTHS[format][0])
        space = options.get("format.input_color_space", "sRGB")
        for name, value, allowed in (
            ("bit_depth", bit_depth, BIT_DEPTHS),
            ("input_color_space", space, COLOR_SPACES),
        ):
            if value not in allowed[format]:
                raise ValueError(
                    f"node {ctx.node_id}: format.{name} {value!r} is not one of {format}'s: "
                    f"{', '.join(allowed[format])}; choose one of those or another format."
                )
        metadata: dict[str, Any] = {}
        if ctx.settings.png_metadata:
            if options.get("prompt") is not None:
                metadata["prompt"] = options["prompt"]
            metadata.update(options.get("extra_pnginfo") or {})
        images = guarded(ctx, images, metadata)
        pixels = [image.float().cpu().numpy() for image in images]
        if format == "avif":
            return self._avif(ctx, images, pixels, filename_prefix, bit_depth, space, metadata, options)
        folder, stem, sub, counter = save_path(ctx.folders.output_dir, filename_prefix)
        results = []
        for i, (image, frame) in enumerate(zip(images, pixels, strict=True)):
            if format == "png":
                text = {key: json.dumps(value) for key, value in metadata.items()}
                data = enc.png16(frame, text) if bit_depth == "16-bit" else encode_png(image, metadata, 4)
            else:
                data = _exr(frame, bit_depth, space, metadata)
            name = f"{stem.replace('%batch_num%', str(i))}_{counter + i:05}_.{format}"
            write_atomic(folder / name, data)
            results.append({"filename": name, "subfolder": sub, "type": "output"})
        return NodeOutput(values=(images,), ui={"images": results})

    def _avif(
        self,
        ctx: NodeContext,
        images: torch.Tensor,
        pixels: list[np.ndarray],
        prefix: str,
        bit_depth: str,
        space: str,
        metadata: dict[str, Any],
        options: dict[str, Any],
    ) -> NodeOutput:
        if bit_depth == "10-bit YUV420" or space != "sRGB":
            raise ValueError(
                f"node {ctx.node_id}: Loom writes AVIF as 8-bit YUV 4:2:0 sRGB only (asked: {bit_depth}, "
                f"{space}); choose bit_depth auto or 8-bit YUV420 with sRGB, or save HDR as EXR or 16-bit PNG."
            )
        quality = max(0, min(100, round(100 - options.get("format.crf", 18) * 100 / 63)))
        folder, stem, sub, counter = save_path(ctx.folders.output_dir, prefix)
        animated = options.get("format.save_mode", "still images") == "animated" and len(pixels) > 1
        if animated:
            fps = float(options.get("format.save_mode.fps", 6.0))
            loop = int(options.get("format.save_mode.loop_count", 0))
            groups = [pixels]
        else:
            fps, loop, groups = None, 0, [[frame] for frame in pixels]
        results = []
        for i, frames in enumerate(groups):
            name = f"{stem.replace('%batch_num%', str(i))}_{counter + i:05}_.avif"
            write_atomic(folder / name, enc.avif(frames, quality, metadata, fps, loop))
            results.append({"filename": name, "subfolder": sub, "type": "output"})
        ui: dict[str, Any] = {"images": results}
        if animated:
            ui["animated"] = [True]
        return NodeOutput(values=(images,), ui=ui)


def _exr(frame: np.ndarray, bit_depth: str, space: str, metadata: dict[str, Any]) -> bytes:
    linear, gamut = {
        "sRGB": (enc.srgb_to_linear, enc.REC709),
        "HDR": (enc.hlg_to_linear, enc.REC2020),
        "linear": (None, enc.REC709),
        "linear ACEScg": (None, enc.ACES_AP1),
    }[space]
    values = frame.astype(np.float32)
    if linear is not None:
        colour = values[..., :3] if values.shape[-1] == 4 else values
        converted = linear(np.clip(colour, 0.0, 1.0)).astype(np.float32)
        values = np.concatenate([converted, values[..., 3:]], axis=-1) if values.shape[-1] == 4 else converted
    strings = {key: json.dumps(value) for key, value in metadata.items()}
    return enc.exr(values, bit_depth == "16-bit float", gamut, strings)


class ImageCompare(Node):
    SCHEMA = NodeSchema(
        node_id="ImageCompare",
        display_name="Image Compare",
        category="image",
        description="Show two images side by side with a slider in the editor (saved as temporary previews).",
        inputs=(
            Input("image_a", IMAGE, "The first image (before).", optional=True),
            Input("image_b", IMAGE, "The second image (after).", optional=True),
            Input(
                "compare_view", "IMAGECOMPARE", "The editor's slider view (holds no setting).", optional=True
            ),
        ),
        output_node=True,
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        image_a: torch.Tensor | None = None,
        image_b: torch.Tensor | None = None,
        **_: Any,
    ) -> NodeOutput:
        return NodeOutput(
            ui={
                "a_images": preview_images(ctx, image_a) if image_a is not None else [],
                "b_images": preview_images(ctx, image_b) if image_b is not None else [],
            }
        )


class _CompareViewDef(NativeNodeDef):
    """ImageCompare's ``compare_view`` is the editor's slider widget: the value the editor sends for
    it (the last shown pair) is taken as it is, never checked as a link."""

    self_validated = frozenset({"compare_view"})


NODES = (SaveImageAdvanced, _CompareViewDef(ImageCompare))
