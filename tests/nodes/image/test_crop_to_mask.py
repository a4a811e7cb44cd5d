"""ImageCropToMask (nodes/image/crop_to_mask.py): the box around the mask at the output's aspect,
zero padding past the image, the composite over the background, inversion, and its errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from nodes.image.crop_to_mask import CropToMaskError, ImageCropToMask, crop_one, subject_box
from tests.nodes.image.image_ctx import image_ctx


@pytest.fixture()
def ctx(tmp_path: Path) -> Any:
    return image_ctx(tmp_path)


def _run(ctx: Any, images: torch.Tensor, masks: torch.Tensor, **kw: Any) -> torch.Tensor:
    args = {"width": 64, "height": 64, "pad_factor": 1.0, "grow_mask": 0, "background": "#000000"} | kw
    return ImageCropToMask().run(ctx, images=images, masks=masks, **args)[0]


def test_schema_follows_comfyui() -> None:
    assert [(i.name, i.default, i.min, i.max) for i in ImageCropToMask.SCHEMA.inputs] == [
        ("images", None, None, None),
        ("masks", None, None, None),
        ("width", 1024, 64, 4096),
        ("height", 1024, 64, 4096),
        ("pad_factor", 1.0, 1.0, 2.0),
        ("grow_mask", 0, -32, 32),
        ("background", "#000000", None, None),
    ]
    assert ImageCropToMask.SCHEMA.outputs[0].name == "images"


def test_box_grows_to_the_aspect_around_the_subject() -> None:
    mask = torch.zeros(64, 64)
    mask[8:24, 16:48] = 1.0  # 32 wide, 16 tall
    # wider than 1:1 -> 32 x 32 centred on (31.5, 15.5): x from int(15.5), y from int(-0.5)
    assert subject_box(mask, 1.0, 1.0) == (15, 0, 47, 32)
    assert subject_box(mask, 2.0, 1.5) == (7, 3, 55, 27)  # 48 x int(32 / 2 * 1.5) = 24
    assert subject_box(torch.zeros(4, 4), 1.0, 1.0) is None


def test_crop_past_the_image_is_zero_padded_then_composited() -> None:
    image = torch.zeros(64, 64, 3)
    image[..., 0] = 1.0
    mask = torch.zeros(64, 64)
    mask[:8, :8] = 1.0
    bg = torch.tensor([0.0, 0.0, 1.0])
    crop = crop_one(image, mask, 64, 2.0, 0, bg, 1.0)
    # box 16 x 16 from (int(3.5 - 8), ...) = (-4, -4): 4 padded rows and columns
    assert crop.shape == (1, 3, 16, 16)
    assert torch.equal(crop[0, :, 4:12, 4:12], torch.tensor([1.0, 0, 0]).view(3, 1, 1).expand(3, 8, 8))
    assert torch.equal(crop[0, :, 0, 0], bg) and torch.equal(crop[0, :, 15, 15], bg)


def test_whole_image_blend_when_no_subject_is_found(ctx: Any) -> None:
    torch.manual_seed(0)
    image = torch.rand(1, 64, 64, 4)  # alpha dropped
    out = _run(ctx, image, torch.full((1, 64, 64), 0.5), background="#ffffff")
    assert out.shape == (1, 64, 64, 3)
    assert torch.allclose(out, image[..., :3] * 0.5 + 0.5, atol=1e-5)


def test_inverted_mask_is_flipped_and_masks_are_repeated(ctx: Any) -> None:
    image = torch.rand(2, 64, 64, 3)
    inverted = torch.ones(1, 64, 64)
    inverted[:, 16:48, 16:48] = 0.0
    straight = 1.0 - inverted
    assert torch.allclose(_run(ctx, image, inverted), _run(ctx, image, straight.expand(2, -1, -1)))


def test_errors_teach(ctx: Any) -> None:
    with pytest.raises(CropToMaskError, match="masks: 2 masks for 3 images; give one mask, or one per image"):
        _run(ctx, torch.zeros(3, 64, 64, 3), torch.zeros(2, 64, 64))
    with pytest.raises(CropToMaskError, match="background: expected '#RRGGBB'"):
        _run(ctx, torch.zeros(1, 64, 64, 3), torch.zeros(1, 64, 64), background="black")


def test_output_size_is_declared_before_the_run() -> None:
    from engine.node import TensorSize

    size = ImageCropToMask.estimate_outputs(images=TensorSize((3, 100, 80, 3)), width=512, height=256)
    assert size == (TensorSize((3, 256, 512, 3)),)
    assert ImageCropToMask.estimate_outputs(images=TensorSize((3, 100, 80, 3)), width=None, height=256) == (
        None,
    )
