"""MASK nodes (nodes/image/mask.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image

from nodes.image.mask import (
    BatchMasksNode,
    CropMask,
    FeatherMask,
    GrowMask,
    ImageColorToMask,
    InvertMask,
    MaskComposite,
    MaskPreview,
    MaskToImage,
    SolidMask,
    ThresholdMask,
)
from tests.nodes.image.image_ctx import image_ctx


@pytest.fixture()
def ctx(tmp_path: Path) -> Any:
    return image_ctx(tmp_path)


def test_mask_to_image_and_back_shapes(ctx: Any) -> None:
    mask = torch.rand(2, 3, 4)
    image = MaskToImage().run(ctx, mask=mask)[0]
    assert image.shape == (2, 3, 4, 3) and torch.equal(image[..., 1], mask)
    assert MaskToImage().run(ctx, mask=torch.rand(3, 4))[0].shape == (1, 3, 4, 3)


def test_image_color_to_mask_matches_8bit_colour(ctx: Any) -> None:
    image = torch.zeros(1, 2, 2, 3)
    image[0, 0, 0] = torch.tensor([1.0, 128 / 255, 0.0])
    image[0, 1, 1] = torch.tensor([1.0, 127 / 255, 0.0])
    out = ImageColorToMask().run(ctx, image=image, color=0xFF8000)[0]
    assert out.tolist() == [[[1.0, 0.0], [0.0, 0.0]]]


def test_solid_invert_threshold(ctx: Any) -> None:
    solid = SolidMask().run(ctx, value=0.25, width=5, height=3)[0]
    assert solid.shape == (1, 3, 5) and torch.all(solid == 0.25)
    assert torch.all(InvertMask().run(ctx, mask=solid)[0] == 0.75)
    ramp = torch.linspace(0, 1, 5).view(1, 1, 5)
    assert ThresholdMask().run(ctx, mask=ramp, value=0.5)[0].tolist() == [[[0.0, 0.0, 0.0, 1.0, 1.0]]]


def test_crop_mask_and_crop_outside(ctx: Any) -> None:
    mask = torch.arange(2 * 4 * 5, dtype=torch.float32).view(2, 4, 5)
    assert torch.equal(CropMask().run(ctx, mask=mask, x=1, y=2, width=3, height=9)[0], mask[:, 2:, 1:4])
    with pytest.raises(ValueError, match=r"the crop starts at x=5, y=0 but the mask is only 5x4; use x < 5"):
        CropMask().run(ctx, mask=mask, x=5, y=0, width=2, height=2)


@pytest.mark.parametrize(
    ("operation", "expected"),
    [("multiply", 0.3), ("add", 1.0), ("subtract", 0.35), ("and", 0.0), ("or", 1.0), ("xor", 1.0)],
)
def test_mask_composite_operations(ctx: Any, operation: str, expected: float) -> None:
    dest = torch.full((1, 4, 4), 0.75)
    out = MaskComposite().run(
        ctx, destination=dest, source=torch.full((1, 2, 2), 0.4), x=3, y=1, operation=operation
    )[0]
    # at (3, 1) both overlap (the source is cut at the right edge); logic ops round: 0.75 -> 1, 0.4 -> 0
    assert out[0, 1, 3].item() == pytest.approx(expected)
    assert out[0, 0, 0] == 0.75 and out[0, 3, 3] == 0.75 and out.shape == (1, 4, 4)


def test_mask_composite_batches(ctx: Any) -> None:
    out = MaskComposite().run(
        ctx, destination=torch.ones(3, 4, 4), source=torch.zeros(1, 4, 4), x=0, y=0, operation="multiply"
    )[0]
    assert out.shape == (3, 4, 4) and out.max() == 0
    with pytest.raises(ValueError, match="source has 2 masks but destination 3"):
        MaskComposite().run(
            ctx, destination=torch.ones(3, 4, 4), source=torch.zeros(2, 4, 4), x=0, y=0, operation="add"
        )
    untouched = MaskComposite().run(
        ctx, destination=torch.ones(1, 4, 4), source=torch.zeros(1, 4, 4), x=9, y=0, operation="multiply"
    )[0]
    assert torch.all(untouched == 1)


def test_feather_mask_follows_comfyui_factors(ctx: Any) -> None:
    out = FeatherMask().run(ctx, mask=torch.ones(1, 1, 6), left=2, top=0, right=3, bottom=0)[0][0, 0]
    # left ramp 1/2, 2/2; the right loop multiplies index 0 by 1/3, index -1 by 2/3, index -2 by 3/3
    assert out.tolist() == pytest.approx([1 / 2 * 1 / 3, 1.0, 1.0, 1.0, 1.0, 2 / 3])
    tall = FeatherMask().run(ctx, mask=torch.ones(4, 4), left=0, top=4, right=0, bottom=0)[0]
    assert tall[0, :, 0].tolist() == pytest.approx([0.25, 0.5, 0.75, 1.0])


def test_grow_mask_tapered_and_square_and_shrink(ctx: Any) -> None:
    dot = torch.zeros(1, 7, 7)
    dot[0, 3, 3] = 1
    plus = GrowMask().run(ctx, mask=dot, expand=1, tapered_corners=True)[0]
    assert plus.sum() == 5 and plus[0, 2, 2] == 0
    square = GrowMask().run(ctx, mask=dot, expand=2, tapered_corners=False)[0]
    assert square.sum() == 25
    diamond = GrowMask().run(ctx, mask=dot, expand=2, tapered_corners=True)[0]
    assert diamond.sum() == 13
    assert torch.equal(GrowMask().run(ctx, mask=square, expand=-2, tapered_corners=False)[0], dot)
    full = torch.ones(1, 3, 3)
    assert torch.all(GrowMask().run(ctx, mask=full, expand=-1, tapered_corners=True)[0] == 1)  # edges repeat


def test_mask_preview_writes_grey_pngs(ctx: Any) -> None:
    out = MaskPreview().run(ctx, mask=torch.linspace(0, 1, 8).view(1, 2, 4))
    entry = out.ui["images"][0]  # type: ignore[index]
    assert entry["type"] == "temp"
    with Image.open(ctx.folders.temp_dir / entry["filename"]) as png:
        assert png.size == (4, 2) and png.mode == "RGB" and png.getpixel((3, 1)) == (255, 255, 255)


def test_batch_masks_node(ctx: Any) -> None:
    out = BatchMasksNode().run(ctx, **{"masks.mask0": torch.zeros(4, 4), "masks.mask1": torch.ones(2, 8, 8)})[
        0
    ]
    assert out.shape == (3, 4, 4) and out[0].max() == 0 and out[1:].min() == 1


@pytest.mark.parametrize("tapered", [True, False])
@pytest.mark.parametrize("expand", [3, -3])
def test_grow_by_n_equals_n_single_steps(tapered: bool, expand: int) -> None:
    from nodes.image.mask import grow

    torch.manual_seed(0)
    mask = (torch.rand(2, 9, 11) > 0.7).float() * torch.rand(2, 9, 11)
    step = mask
    for _ in range(abs(expand)):
        step = grow(step, 1 if expand > 0 else -1, tapered)
    assert torch.equal(grow(mask, expand, tapered), step)
