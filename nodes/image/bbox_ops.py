"""Nodes that use lists of bounding boxes: CropByBBoxes and DrawBBoxes (ComfyUI's names, inputs and
semantics; ``comfy_extras/nodes_sdpose.py`` and ``nodes_rfdetr.py``).

Boxes arrive from a link (``force_input``) as one box dict, a list of box dicts (the same boxes for
every image) or a list of such lists (one per image). A detection box may carry ``label`` and
``score``; coordinates may be fractional.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont

from engine.context import NodeContext
from engine.node import Node
from engine.schema import IMAGE, INT, Input, NodeSchema, Output
from nodes.core.resize import resize_image
from nodes.image.bbox import BOUNDING_BOX

# COCO's 80 detection classes in the detectors' order; a label's index picks its box colour.
COCO_CLASSES = tuple(
    name.replace("_", " ")
    for name in (
        "person bicycle car motorcycle airplane bus train truck boat traffic_light fire_hydrant stop_sign "
        "parking_meter bench bird cat dog horse sheep cow elephant bear zebra giraffe backpack umbrella "
        "handbag tie suitcase frisbee skis snowboard sports_ball kite baseball_bat baseball_glove skateboard "
        "surfboard tennis_racket bottle wine_glass cup fork knife spoon bowl banana apple sandwich orange "
        "broccoli carrot hot_dog pizza donut cake chair couch potted_plant bed dining_table toilet tv laptop "
        "mouse remote keyboard cell_phone microwave oven toaster sink refrigerator book clock vase scissors "
        "teddy_bear hair_drier toothbrush"
    ).split()
)
BOX_COLOURS = (
    (255, 0, 0),
    (0, 200, 0),
    (0, 0, 255),
    (255, 165, 0),
    (128, 0, 128),
    (0, 255, 255),
    (255, 20, 147),
    (100, 149, 237),
)


class BBoxListError(ValueError):
    """Boxes the node cannot read; the message names the input and the shape expected."""


def _check_box(box: Any, where: str) -> dict[str, Any]:
    if not isinstance(box, dict) or any(
        not isinstance(box.get(k), int | float) or isinstance(box.get(k), bool)
        for k in ("x", "y", "width", "height")
    ):
        raise BBoxListError(
            f"{where}: expected a box {{'x', 'y', 'width', 'height'}} (numbers), found {box!r}"
        )
    return box


def boxes_per_image(bboxes: Any, count: int) -> list[list[dict[str, Any]]]:
    """``bboxes`` as one list of boxes per image (a box or a flat list: the same for every image)."""
    if isinstance(bboxes, dict):
        return [[_check_box(bboxes, "bboxes")]] * count
    if not isinstance(bboxes, list | tuple) or not bboxes:
        return [[] for _ in range(count)]
    if not isinstance(bboxes[0], list | tuple):
        flat = [_check_box(b, f"bboxes[{i}]") for i, b in enumerate(bboxes)]
        return [flat] * count
    return [
        [_check_box(b, f"bboxes[{i}][{j}]") for j, b in enumerate(frame)] for i, frame in enumerate(bboxes)
    ]


def union_region(
    boxes: list[dict[str, Any]], width: int, height: int, padding: int
) -> tuple[int, int, int, int]:
    """The box around every box (integer pixels), grown by ``padding`` and cut to the image."""
    x1 = min(int(b["x"]) for b in boxes) - padding
    y1 = min(int(b["y"]) for b in boxes) - padding
    x2 = max(int(b["x"] + b["width"]) for b in boxes) + padding
    y2 = max(int(b["y"] + b["height"]) for b in boxes) + padding
    return max(0, x1), max(0, y1), min(width, x2), min(height, y2)


def fallback_region(width: int, height: int) -> tuple[int, int, int, int]:
    """ComfyUI's crop for an empty region: a centred square of 0.3 x the shorter side, 10 % down."""
    side = int(min(width, height) * 0.3)
    x1, y1 = max(0, (width - side) // 2), max(0, int(height * 0.1))
    return x1, y1, min(width, x1 + side), min(height, y1 + side)


class CropByBBoxes(Node):
    SCHEMA = NodeSchema(
        node_id="CropByBBoxes",
        display_name="Crop By Bounding Boxes",
        category="image/preprocessors",
        description="Crop and resize regions from the input image batch based on provided bounding boxes.",
        inputs=(
            Input("image", IMAGE, "The images to crop."),
            Input(
                "bboxes", BOUNDING_BOX, "The boxes: one list per image (the last list serves later images)."
            ),
            Input(
                "output_width", INT, "Width each crop is resized to.", default=512, min=64, max=4096, step=8
            ),
            Input(
                "output_height", INT, "Height each crop is resized to.", default=512, min=64, max=4096, step=8
            ),
            Input(
                "padding",
                INT,
                "Extra padding in pixels added on each side of the bbox before cropping.",
                default=0,
                min=0,
                max=1024,
                step=1,
            ),
        ),
        outputs=(Output("IMAGE", IMAGE, "All crops stacked into a single image batch."),),
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        image: torch.Tensor,
        bboxes: Any,
        output_width: int,
        output_height: int,
        padding: int,
    ) -> tuple[torch.Tensor]:
        if isinstance(bboxes, list | tuple) and not bboxes:
            return (image,)
        batch, height, width = image.shape[0], image.shape[1], image.shape[2]
        frames = boxes_per_image(bboxes, 1) if isinstance(bboxes, dict) else boxes_per_image(bboxes, batch)
        crops = []
        for i in range(batch):
            boxes = frames[min(i, len(frames) - 1)]
            if not boxes:
                continue
            x1, y1, x2, y2 = union_region(boxes, width, height, padding)
            if x2 <= x1 or y2 <= y1:
                x1, y1, x2, y2 = fallback_region(width, height)
                if x2 <= x1 or y2 <= y1:
                    crops.append(image.new_zeros((1, output_height, output_width, image.shape[3])))
                    continue
            region = image[i : i + 1, y1:y2, x1:x2]
            crops.append(resize_image(region, output_width, output_height, "bilinear"))
        return (torch.cat(crops) if crops else image,)


def draw_detections(picture: Image.Image, boxes: list[dict[str, Any]]) -> Image.Image:
    """Each box outlined 3 px wide in its class's colour, lowest score first; a COCO label is written
    with its score inside the box's top-left corner."""
    draw = ImageDraw.Draw(picture)
    font = ImageFont.load_default()
    for box in sorted(boxes, key=lambda b: float(b.get("score", 1.0))):
        label = box.get("label") if box.get("label") in COCO_CLASSES else None
        colour = BOX_COLOURS[(COCO_CLASSES.index(label) if label else 0) % len(BOX_COLOURS)]
        x1, y1 = float(box["x"]), float(box["y"])
        draw.rectangle([x1, y1, x1 + float(box["width"]), y1 + float(box["height"])], outline=colour, width=3)
        if label is not None:
            draw.text((x1 + 2, y1 + 2), f"{label} {float(box.get('score', 1.0)):.2f}", fill=colour, font=font)
    return picture


class DrawBBoxes(Node):
    SCHEMA = NodeSchema(
        node_id="DrawBBoxes",
        display_name="Draw BBoxes",
        category="detection/",
        description="Draw bounding boxes (with their labels and scores) on images, or on black without one.",
        inputs=(
            Input("image", IMAGE, "The images to draw on (none: black, just large enough).", optional=True),
            Input("bboxes", BOUNDING_BOX, "The boxes: one list per image, or one list for all."),
        ),
        outputs=(Output("out_image", IMAGE, "The images with the boxes drawn."),),
    )

    def run(self, ctx: NodeContext, *, bboxes: Any, image: torch.Tensor | None = None) -> tuple[torch.Tensor]:
        frames = boxes_per_image(bboxes, image.shape[0] if image is not None else 1)
        if image is None:
            boxes = [b for frame in frames for b in frame]
            width = max((int(b["x"] + b["width"]) for b in boxes), default=640)
            height = max((int(b["y"] + b["height"]) for b in boxes), default=640)
            image = torch.zeros((len(frames), height, width, 3))
        out = []
        for i in range(image.shape[0]):
            frame = frames[min(i, len(frames) - 1)]
            pixels = image[i].detach().cpu().float().clamp(0, 1).numpy()
            if not frame:
                out.append(torch.from_numpy(np.ascontiguousarray(pixels))[None])
                continue
            picture = Image.fromarray((pixels * 255).astype(np.uint8))  # ToPILImage truncates the same way
            drawn = draw_detections(picture, frame)
            out.append(torch.from_numpy(np.array(drawn).astype(np.float32) / 255.0)[None])
        return (torch.cat(out),)


NODES: list[type[Node]] = [CropByBBoxes, DrawBBoxes]
