"""CropByBBoxes and DrawBBoxes (nodes/image/bbox_ops.py): the union crop with padding, the fallback
crop, the box shapes accepted, and boxes drawn in their class colours."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from nodes.core.resize import resize_image
from nodes.image.bbox_ops import (
    COCO_CLASSES,
    BBoxListError,
    CropByBBoxes,
    DrawBBoxes,
    boxes_per_image,
    fallback_region,
)
from tests.nodes.image.image_ctx import image_ctx


@pytest.fixture()
def ctx(tmp_path: Path) -> Any:
    return image_ctx(tmp_path)


def _box(x: float, y: float, w: float, h: float, **extra: Any) -> dict[str, Any]:
    return {"x": x, "y": y, "width": w, "height": h, **extra}


def test_schemas_follow_comfyui() -> None:
    crop = CropByBBoxes.SCHEMA
    assert [(i.name, i.type, i.default, i.min, i.max) for i in crop.inputs] == [
        ("image", "IMAGE", None, None, None),
        ("bboxes", "BOUNDING_BOX", None, None, None),
        ("output_width", "INT", 512, 64, 4096),
        ("output_height", "INT", 512, 64, 4096),
        ("padding", "INT", 0, 0, 1024),
    ]
    draw = DrawBBoxes.SCHEMA
    assert [(i.name, i.optional) for i in draw.inputs] == [("image", True), ("bboxes", False)]
    assert draw.outputs[0].name == "out_image" and draw.category == "detection/"
    assert len(COCO_CLASSES) == 80 and COCO_CLASSES[9] == "traffic light"


def test_box_shapes_become_one_list_per_image() -> None:
    one = _box(0, 0, 1, 1)
    assert boxes_per_image(one, 2) == [[one], [one]]
    assert boxes_per_image([one, one], 2) == [[one, one], [one, one]]
    assert boxes_per_image([[one], []], 2) == [[one], []]
    assert boxes_per_image([], 2) == [[], []]
    with pytest.raises(BBoxListError, match=r"bboxes\[0\]\[1\]: expected a box"):
        boxes_per_image([[one, {"x": 1}]], 1)


def test_crop_takes_the_union_with_padding_and_resizes(ctx: Any) -> None:
    torch.manual_seed(0)
    image = torch.rand(2, 40, 50, 3)
    boxes = [[_box(10, 5, 10, 10), _box(25.7, 12, 5, 6)], [_box(45, 30, 20, 20)]]
    out = CropByBBoxes().run(ctx, image=image, bboxes=boxes, output_width=64, output_height=64, padding=2)[0]
    assert out.shape == (2, 64, 64, 3)
    # image 0: x 10..int(30.7) = 30, y 5..18, grown by 2; image 1: 43..50 (cut), 28..40
    assert torch.allclose(out[0:1], resize_image(image[0:1, 3:20, 8:32], 64, 64, "bilinear"))
    assert torch.allclose(out[1:2], resize_image(image[1:2, 28:40, 43:50], 64, 64, "bilinear"))
    # the last list serves later images; an empty list skips the image
    reuse = CropByBBoxes().run(
        ctx, image=image, bboxes=[[_box(0, 0, 8, 8)]], output_width=64, output_height=64, padding=0
    )
    assert reuse[0].shape == (2, 64, 64, 3)
    skip = CropByBBoxes().run(
        ctx, image=image, bboxes=[[], [_box(0, 0, 8, 8)]], output_width=64, output_height=64, padding=0
    )
    assert skip[0].shape == (1, 64, 64, 3)
    assert (
        CropByBBoxes().run(ctx, image=image, bboxes=[], output_width=64, output_height=64, padding=0)[0]
        is image
    )


def test_an_empty_region_falls_back_to_comfyuis_square(ctx: Any) -> None:
    assert fallback_region(50, 40) == (19, 4, 31, 16)  # side int(40 * 0.3) = 12
    image = torch.rand(1, 40, 50, 3)
    out = CropByBBoxes().run(
        ctx, image=image, bboxes=_box(100, 100, 5, 5), output_width=64, output_height=64, padding=0
    )
    assert torch.allclose(out[0], resize_image(image[:, 4:16, 19:31], 64, 64, "bilinear"))


def test_draw_outlines_boxes_in_their_class_colour(ctx: Any) -> None:
    image = torch.zeros(1, 32, 32, 3)
    out = DrawBBoxes().run(ctx, image=image, bboxes=[_box(4, 4, 20, 20, label="bicycle", score=0.9)])[0]
    assert out.shape == (1, 32, 32, 3)
    green = torch.tensor([0.0, 200 / 255, 0.0])
    assert torch.allclose(out[0, 4, 14], green)  # class 1: the second colour, top edge
    assert torch.allclose(out[0, 14, 24], green)  # right edge at x + width
    assert out[0, 14, 14].tolist() == [0.0, 0.0, 0.0]  # inside untouched
    plain = DrawBBoxes().run(ctx, bboxes=_box(2, 3, 10, 5))[0]
    assert plain.shape == (1, 8, 12, 3) and plain[0, 3, 5].tolist() == [1.0, 0.0, 0.0]  # no label: red
    untouched = DrawBBoxes().run(ctx, image=image, bboxes=[])[0]
    assert torch.equal(untouched, image)
