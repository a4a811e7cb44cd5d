"""MASK nodes (ComfyUI's names, inputs and semantics; ``comfy_extras/nodes_mask.py`` and the batch
node of ``nodes_post_processing.py``). A MASK is float [B, H, W]; most nodes also accept [H, W].

GrowMask's grey dilation/erosion and its edge handling (the border pixel repeats, as scipy's
default "reflect" mode gives for a 3x3 footprint) are written in torch; no scipy needed.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from engine.context import NodeContext
from engine.node import Node, NodeOutput, OutputSizes
from engine.schema import (
    BOOLEAN,
    COMBO,
    FLOAT,
    HIDDEN_EXTRA_PNGINFO,
    HIDDEN_PROMPT,
    IMAGE,
    INT,
    MASK,
    Input,
    NodeSchema,
    Output,
)
from nodes.core.resize import resize_mask
from nodes.core.tensor_sizes import mask_size
from nodes.image.load_save import MAX_RESOLUTION, ImageError, preview_images
from nodes.image.transforms import AUTOGROW_MAX

COMPOSITE_OPERATIONS = ("multiply", "add", "subtract", "and", "or", "xor")


def as_batch(mask: torch.Tensor) -> torch.Tensor:
    """A mask as [B, H, W] (a single [H, W] mask becomes a batch of one)."""
    return mask.reshape(-1, mask.shape[-2], mask.shape[-1])


def _mask_out(description: str) -> Output:
    return Output("MASK", MASK, description)


def mask_to_image(mask: torch.Tensor) -> torch.Tensor:
    """[B, H, W] -> grey IMAGE [B, H, W, 3]."""
    return as_batch(mask)[..., None].expand(-1, -1, -1, 3)


class MaskToImage(Node):
    SCHEMA = NodeSchema(
        node_id="MaskToImage",
        display_name="Convert Mask to Image",
        category="mask",
        description="Show a mask as a grey image.",
        inputs=(Input("mask", MASK, "The mask."),),
        outputs=(Output("IMAGE", IMAGE, "The mask in all three colour channels."),),
    )

    def run(self, ctx: NodeContext, *, mask: torch.Tensor) -> tuple:
        return (mask_to_image(mask),)


class ImageColorToMask(Node):
    SCHEMA = NodeSchema(
        node_id="ImageColorToMask",
        display_name="ImageColorToMask",
        category="mask",
        description="1 where the pixel's 8-bit colour is exactly `color` (0xRRGGBB), else 0.",
        inputs=(
            Input("image", IMAGE, "The images."),
            Input(
                "color",
                INT,
                "The colour as 0xRRGGBB.",
                default=0,
                min=0,
                max=0xFFFFFF,
                step=1,
                extra={"display": "number"},
            ),
        ),
        outputs=(_mask_out("The matching pixels."),),
    )

    def run(self, ctx: NodeContext, *, image: torch.Tensor, color: int) -> tuple:
        if image.shape[-1] < 3:
            raise ImageError(f"image has {image.shape[-1]} channel(s); ImageColorToMask needs RGB")
        levels = (torch.clamp(image, 0, 1) * 255.0).round().to(torch.int64)
        packed = (levels[..., 0] << 16) + (levels[..., 1] << 8) + levels[..., 2]
        return ((packed == color).float(),)


class SolidMask(Node):
    SCHEMA = NodeSchema(
        node_id="SolidMask",
        display_name="SolidMask",
        category="mask",
        description="A mask of one value.",
        inputs=(
            Input("value", FLOAT, "The value everywhere.", default=1.0, min=0.0, max=1.0, step=0.01),
            Input("width", INT, "Width.", default=512, min=1, max=MAX_RESOLUTION, step=1),
            Input("height", INT, "Height.", default=512, min=1, max=MAX_RESOLUTION, step=1),
        ),
        outputs=(_mask_out("The mask [1, height, width]."),),
    )

    def run(self, ctx: NodeContext, *, value: float, width: int, height: int) -> tuple:
        return (torch.full((1, height, width), value, dtype=torch.float32),)

    @classmethod
    def estimate_outputs(cls, *, width: Any = None, height: Any = None, **_: Any) -> OutputSizes:
        return (mask_size(1, height, width),)


class InvertMask(Node):
    SCHEMA = NodeSchema(
        node_id="InvertMask",
        display_name="InvertMask",
        category="mask",
        description="1 - mask.",
        inputs=(Input("mask", MASK, "The mask."),),
        outputs=(_mask_out("The inverted mask."),),
    )

    def run(self, ctx: NodeContext, *, mask: torch.Tensor) -> tuple:
        return (1.0 - mask,)


class CropMask(Node):
    SCHEMA = NodeSchema(
        node_id="CropMask",
        display_name="CropMask",
        category="mask",
        description="Cut a width x height region at (x, y); a region past the edge is cut short.",
        inputs=(
            Input("mask", MASK, "The mask."),
            Input("x", INT, "Left edge.", default=0, min=0, max=MAX_RESOLUTION, step=1),
            Input("y", INT, "Top edge.", default=0, min=0, max=MAX_RESOLUTION, step=1),
            Input("width", INT, "Region width.", default=512, min=1, max=MAX_RESOLUTION, step=1),
            Input("height", INT, "Region height.", default=512, min=1, max=MAX_RESOLUTION, step=1),
        ),
        outputs=(_mask_out("The cropped mask."),),
    )

    def run(self, ctx: NodeContext, *, mask: torch.Tensor, x: int, y: int, width: int, height: int) -> tuple:
        mask = as_batch(mask)
        h, w = mask.shape[1:]
        if x >= w or y >= h:
            raise ImageError(
                f"the crop starts at x={x}, y={y} but the mask is only {w}x{h}; use x < {w} and y < {h}"
            )
        return (mask[:, y : y + height, x : x + width],)


def _combine(destination: torch.Tensor, source: torch.Tensor, operation: str) -> torch.Tensor:
    if operation == "multiply":
        return destination * source
    if operation == "add":
        return destination + source
    if operation == "subtract":
        return destination - source
    logic = {"and": torch.logical_and, "or": torch.logical_or, "xor": torch.logical_xor}
    if operation not in logic:
        raise ImageError(
            f"unknown operation {operation!r}; expected one of {', '.join(COMPOSITE_OPERATIONS)}"
        )
    return logic[operation](destination.round().bool(), source.round().bool()).float()


class MaskComposite(Node):
    SCHEMA = NodeSchema(
        node_id="MaskComposite",
        display_name="MaskComposite",
        category="mask",
        description="Combine source into destination at (x, y) by an operation; the result is clamped to 0..1.",
        inputs=(
            Input("destination", MASK, "The base mask."),
            Input("source", MASK, "The mask combined into it (one, or one per destination mask)."),
            Input("x", INT, "Left edge of the source.", default=0, min=0, max=MAX_RESOLUTION, step=1),
            Input("y", INT, "Top edge of the source.", default=0, min=0, max=MAX_RESOLUTION, step=1),
            Input(
                "operation",
                COMBO,
                "How the values combine (and/or/xor on values rounded to 0/1).",
                options=COMPOSITE_OPERATIONS,
                default="multiply",
            ),
        ),
        outputs=(_mask_out("The combined mask."),),
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        destination: torch.Tensor,
        source: torch.Tensor,
        x: int,
        y: int,
        operation: str,
    ) -> tuple:
        out = as_batch(destination).clone()
        source = as_batch(source).to(out)
        if source.shape[0] not in (1, out.shape[0]):
            raise ImageError(
                f"source has {source.shape[0]} masks but destination {out.shape[0]}; give one source mask or "
                "as many as the destination"
            )
        right, bottom = min(x + source.shape[2], out.shape[2]), min(y + source.shape[1], out.shape[1])
        if right > x and bottom > y:
            part = source[:, : bottom - y, : right - x]
            out[:, y:bottom, x:right] = _combine(out[:, y:bottom, x:right], part, operation)
        return (torch.clamp(out, 0.0, 1.0),)


def _feather_weights(size: int, start: int, end: int) -> torch.Tensor:
    """Per-row (or column) factors of FeatherMask, exactly as ComfyUI multiplies them in: the start
    ramps (i + 1) / start; the end loop indexes from the back with -i, so its first factor lands on
    index 0 and the last index gets 2 / end."""
    weights = torch.ones(size)
    for i in range(start):
        weights[i] *= (i + 1.0) / start
    for i in range(end):
        weights[-i] *= (i + 1.0) / end
    return weights


class FeatherMask(Node):
    SCHEMA = NodeSchema(
        node_id="FeatherMask",
        display_name="FeatherMask",
        category="mask",
        description="Fade the mask linearly towards each edge over the given widths.",
        inputs=(
            Input("mask", MASK, "The mask."),
            Input("left", INT, "Fade width on the left.", default=0, min=0, max=MAX_RESOLUTION, step=1),
            Input("top", INT, "Fade height on top.", default=0, min=0, max=MAX_RESOLUTION, step=1),
            Input("right", INT, "Fade width on the right.", default=0, min=0, max=MAX_RESOLUTION, step=1),
            Input("bottom", INT, "Fade height at the bottom.", default=0, min=0, max=MAX_RESOLUTION, step=1),
        ),
        outputs=(_mask_out("The feathered mask."),),
    )

    def run(
        self, ctx: NodeContext, *, mask: torch.Tensor, left: int, top: int, right: int, bottom: int
    ) -> tuple:
        out = as_batch(mask)
        h, w = out.shape[1:]
        cols = _feather_weights(w, min(left, w), min(right, w))
        rows = _feather_weights(h, min(top, h), min(bottom, h))
        return (out * rows[:, None].to(out) * cols[None, :].to(out),)


def grow(mask: torch.Tensor, expand: int, tapered_corners: bool) -> torch.Tensor:
    """Grey dilation (expand > 0) or erosion (< 0) by |expand| steps of a 3x3 footprint: a plus
    shape with tapered corners, else the full square. Edge pixels count as their own neighbours."""
    x = as_batch(mask)[:, None].float()  # (B, 1, H, W)
    sign = 1.0 if expand > 0 else -1.0
    if not tapered_corners and expand:  # n square steps = one (2n+1)-square window, clipped at the edges
        n = abs(expand)
        padded = F.pad(x * sign, (n, n, n, n), mode="replicate")
        return (F.max_pool2d(padded, 2 * n + 1, stride=1) * sign)[:, 0].to(mask.dtype)
    pick = torch.maximum if expand > 0 else torch.minimum
    offsets = [(dy, dx) for dy in (-1, 0, 1) for dx in (-1, 0, 1) if not (tapered_corners and dy and dx)]
    for _ in range(abs(expand)):
        padded = F.pad(x, (1, 1, 1, 1), mode="replicate")
        h, w = x.shape[-2:]
        result = x
        for dy, dx in offsets:
            result = pick(result, padded[..., 1 + dy : 1 + dy + h, 1 + dx : 1 + dx + w])
        x = result
    return x[:, 0].to(mask.dtype)


class GrowMask(Node):
    SCHEMA = NodeSchema(
        node_id="GrowMask",
        display_name="Grow Mask",
        category="mask",
        description="Grow (positive) or shrink (negative) the mask by `expand` pixels.",
        inputs=(
            Input("mask", MASK, "The mask."),
            Input(
                "expand",
                INT,
                "Pixels to grow (negative: shrink).",
                default=0,
                min=-MAX_RESOLUTION,
                max=MAX_RESOLUTION,
                step=1,
            ),
            Input(
                "tapered_corners",
                BOOLEAN,
                "Grow by a plus shape (rounder corners) instead of a square.",
                default=True,
            ),
        ),
        outputs=(_mask_out("The grown or shrunk mask."),),
    )

    def run(self, ctx: NodeContext, *, mask: torch.Tensor, expand: int, tapered_corners: bool) -> tuple:
        return (grow(mask, expand, tapered_corners),)


class ThresholdMask(Node):
    SCHEMA = NodeSchema(
        node_id="ThresholdMask",
        display_name="ThresholdMask",
        category="mask",
        description="1 where the mask is above `value`, else 0.",
        inputs=(
            Input("mask", MASK, "The mask."),
            Input("value", FLOAT, "The threshold.", default=0.5, min=0.0, max=1.0, step=0.01),
        ),
        outputs=(_mask_out("The binary mask."),),
    )

    def run(self, ctx: NodeContext, *, mask: torch.Tensor, value: float) -> tuple:
        return ((mask > value).float(),)


class MaskPreview(Node):
    SCHEMA = NodeSchema(
        node_id="MaskPreview",
        display_name="Preview Mask",
        category="mask",
        description="Show masks as grey images, like PreviewImage (temp folder, nothing kept).",
        inputs=(Input("mask", MASK, "The masks to show."),),
        hidden=(HIDDEN_PROMPT, HIDDEN_EXTRA_PNGINFO),
        output_node=True,
    )

    def run(
        self, ctx: NodeContext, *, mask: torch.Tensor, prompt: Any = None, extra_pnginfo: Any = None
    ) -> NodeOutput:
        return NodeOutput(ui={"images": preview_images(ctx, mask_to_image(mask))})


class BatchMasksNode(Node):
    SCHEMA = NodeSchema(
        node_id="BatchMasksNode",
        display_name="Batch Masks",
        category="mask",
        description="Join 2 to 50 mask batches into one (later ones resized to the first's size, centre crop).",
        inputs=tuple(
            Input(f"masks.mask{i}", MASK, f"Masks #{i + 1}.", optional=i >= 2) for i in range(AUTOGROW_MAX)
        ),
        outputs=(_mask_out("All masks in one batch."),),
    )

    def run(self, ctx: NodeContext, **masks: torch.Tensor) -> tuple:
        given = [as_batch(masks[f"masks.mask{i}"]) for i in range(AUTOGROW_MAX) if f"masks.mask{i}" in masks]
        h, w = given[0].shape[1:]
        fitted = [m if m.shape[1:] == (h, w) else resize_mask(m, w, h, "bilinear", "center") for m in given]
        return (torch.cat(fitted, dim=0),)


NODES: list[type[Node]] = [
    MaskToImage,
    ImageColorToMask,
    SolidMask,
    InvertMask,
    CropMask,
    MaskComposite,
    FeatherMask,
    GrowMask,
    ThresholdMask,
    MaskPreview,
    BatchMasksNode,
]
