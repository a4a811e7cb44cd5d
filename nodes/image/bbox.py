"""ComfyUI's bounding-box value and the crop that reads it: PrimitiveBoundingBox and ImageCropV2
(``comfy_extras/nodes_images.py``).

A BOUNDING_BOX is ComfyUI's V3 widget type: a dict ``{"x", "y", "width", "height"}`` in pixels. It is
a widget in ComfyUI (a constant in API-format prompts) and a socket (PrimitiveBoundingBox's output),
so the nodes reading it check a constant box themselves (:func:`read_box`) instead of the engine's
widget rules, as the colour widget does (``nodes/text/values.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from engine.context import NodeContext
from engine.node import NativeNodeDef, Node
from engine.schema import IMAGE, INT, Input, NodeSchema, Output
from nodes.image.load_save import MAX_RESOLUTION

BOUNDING_BOX = "BOUNDING_BOX"
DEFAULT_BOX = {"x": 0, "y": 0, "width": 512, "height": 512}
BOX_KEYS = ("x", "y", "width", "height")


class BoundingBoxError(ValueError):
    """A bounding box that is not ``{"x", "y", "width", "height"}`` integers; names the input."""


def read_box(box: Any, name: str) -> dict[str, int]:
    """``box`` as x, y, width, height integers (missing keys take ComfyUI's defaults 0, 0, 512, 512)."""
    if not isinstance(box, Mapping):
        raise BoundingBoxError(
            f"{name}: expected a bounding box {{'x', 'y', 'width', 'height'}} (pixels), "
            f"found {type(box).__name__} {box!r}; connect a Bounding Box node or give such a dict"
        )
    out: dict[str, int] = {}
    for key in BOX_KEYS:
        value = box.get(key, DEFAULT_BOX[key])
        if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
            raise BoundingBoxError(f"{name}.{key}: expected a whole number of pixels, found {value!r}")
        out[key] = int(value)
    if out["x"] < 0 or out["y"] < 0:
        raise BoundingBoxError(f"{name}: x and y must be 0 or more, found x={out['x']}, y={out['y']}")
    if out["width"] < 1 or out["height"] < 1:
        raise BoundingBoxError(
            f"{name}: width and height must be at least 1, found {out['width']}x{out['height']}"
        )
    return out


def crop_to_box(image: torch.Tensor, box: Mapping[str, int]) -> torch.Tensor:
    """ComfyUI's crop of [B, H, W, C]: x and y moved inside the image, the region cut at its edges."""
    x = min(box["x"], image.shape[2] - 1)
    y = min(box["y"], image.shape[1] - 1)
    return image[:, y : y + box["height"], x : x + box["width"], :]


class PrimitiveBoundingBox(Node):
    SCHEMA = NodeSchema(
        node_id="PrimitiveBoundingBox",
        display_name="Bounding Box",
        category="utilities/primitive",
        description="A bounding box from its top-left corner and size, in pixels.",
        inputs=(
            Input("x", INT, "Left edge.", default=0, min=0, max=MAX_RESOLUTION),
            Input("y", INT, "Top edge.", default=0, min=0, max=MAX_RESOLUTION),
            Input("width", INT, "Width.", default=512, min=1, max=MAX_RESOLUTION),
            Input("height", INT, "Height.", default=512, min=1, max=MAX_RESOLUTION),
        ),
        outputs=(Output("BOUNDING_BOX", BOUNDING_BOX, "The box {x, y, width, height}."),),
    )

    def run(self, ctx: NodeContext, *, x: int, y: int, width: int, height: int) -> tuple[dict[str, int]]:
        return ({"x": x, "y": y, "width": width, "height": height},)


class ImageCropV2(Node):
    SCHEMA = NodeSchema(
        node_id="ImageCropV2",
        display_name="Crop Image",
        category="image/transform",
        description="Crop an image to the specified dimensions.",
        inputs=(
            Input("image", IMAGE, "The images to crop."),
            Input(
                "crop_region",
                BOUNDING_BOX,
                "The region to keep {x, y, width, height}; moved and cut to stay inside the image.",
                default=dict(DEFAULT_BOX),
                extra={"component": "ImageCrop"},
            ),
        ),
        outputs=(Output("IMAGE", IMAGE, "The cropped images."),),
    )

    def run(self, ctx: NodeContext, *, image: torch.Tensor, crop_region: Any) -> tuple[torch.Tensor]:
        return (crop_to_box(image, read_box(crop_region, "crop_region")),)


class BoxWidgetDef(NativeNodeDef):
    """A node whose BOUNDING_BOX inputs may be constants: :func:`read_box` checks them when it runs."""

    self_validated = frozenset({"crop_region"})


NODES = [PrimitiveBoundingBox, BoxWidgetDef(ImageCropV2)]
