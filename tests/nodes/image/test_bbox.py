"""The bounding-box value and ImageCropV2 (nodes/image/bbox.py): ComfyUI's clamping of the crop, the
box as a constant or from PrimitiveBoundingBox, and the errors for a malformed box."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from engine.registry import NodeRegistry
from engine.validate import validate_node
from nodes.image.bbox import BOUNDING_BOX, BoundingBoxError, BoxWidgetDef, ImageCropV2, PrimitiveBoundingBox
from nodes.image.load_save import LoadImage
from tests.nodes.image.image_ctx import image_ctx


@pytest.fixture()
def ctx(tmp_path: Path) -> Any:
    return image_ctx(tmp_path)


def test_schemas_follow_comfyui() -> None:
    box = PrimitiveBoundingBox.SCHEMA
    assert [(i.name, i.default, i.min, i.max) for i in box.inputs] == [
        ("x", 0, 0, 16384),
        ("y", 0, 0, 16384),
        ("width", 512, 1, 16384),
        ("height", 512, 1, 16384),
    ]
    assert box.outputs[0].type == BOUNDING_BOX == "BOUNDING_BOX" and box.category == "utilities/primitive"
    crop = ImageCropV2.SCHEMA.export()
    assert crop["input_order"] == {"required": ["image", "crop_region"]}
    assert crop["input"]["required"]["crop_region"][0] == "BOUNDING_BOX"
    assert crop["input"]["required"]["crop_region"][1]["default"] == {
        "x": 0,
        "y": 0,
        "width": 512,
        "height": 512,
    }
    assert crop["input"]["required"]["crop_region"][1]["component"] == "ImageCrop"
    assert crop["category"] == "image/transform" and crop["display_name"] == "Crop Image"


def test_crop_clamps_the_corner_and_cuts_at_the_edges(ctx: Any) -> None:
    image = torch.arange(2 * 6 * 8 * 3, dtype=torch.float32).reshape(2, 6, 8, 3)
    box = PrimitiveBoundingBox().run(ctx, x=2, y=1, width=3, height=4)[0]
    assert box == {"x": 2, "y": 1, "width": 3, "height": 4}
    out = ImageCropV2().run(ctx, image=image, crop_region=box)[0]
    assert torch.equal(out, image[:, 1:5, 2:5])
    past = ImageCropV2().run(ctx, image=image, crop_region={"x": 50, "y": 50, "width": 4, "height": 4})[0]
    assert torch.equal(past, image[:, 5:, 7:])  # x -> W-1, y -> H-1: one pixel left
    wide = ImageCropV2().run(ctx, image=image, crop_region={"x": 6, "y": 0, "width": 10, "height": 2})[0]
    assert wide.shape == (2, 2, 2, 3)
    defaults = ImageCropV2().run(ctx, image=image, crop_region={"x": 1})[0]  # missing keys: 0, 0, 512, 512
    assert torch.equal(defaults, image[:, :, 1:])


@pytest.mark.parametrize(
    ("box", "message"),
    [
        ([0, 0, 4, 4], "crop_region: expected a bounding box"),
        ({"x": 1.5}, "crop_region.x: expected a whole number of pixels, found 1.5"),
        ({"x": -1}, "crop_region: x and y must be 0 or more"),
        ({"width": 0}, "crop_region: width and height must be at least 1, found 0x512"),
    ],
)
def test_a_malformed_box_teaches(ctx: Any, box: Any, message: str) -> None:
    with pytest.raises(BoundingBoxError, match=message.replace("[", r"\[")):
        ImageCropV2().run(ctx, image=torch.zeros(1, 4, 4, 3), crop_region=box)


def test_a_constant_box_and_a_linked_box_both_validate() -> None:
    registry = NodeRegistry()
    registry.register_all([BoxWidgetDef(ImageCropV2), PrimitiveBoundingBox, LoadImage])
    prompt = {
        "1": {"class_type": "LoadImage", "inputs": {"image": "a.png"}},
        "2": {"class_type": "ImageCropV2", "inputs": {"image": ["1", 0], "crop_region": {"x": 1, "y": 2}}},
        "3": {"class_type": "PrimitiveBoundingBox", "inputs": {"x": 0, "y": 0, "width": 8, "height": 8}},
        "4": {"class_type": "ImageCropV2", "inputs": {"image": ["1", 0], "crop_region": ["3", 0]}},
    }
    issues, constants = validate_node("2", prompt, registry)
    assert issues == [] and constants["crop_region"] == {"x": 1, "y": 2}
    assert validate_node("4", prompt, registry)[0] == []
