"""Everyday IMAGE nodes (nodes/image/transforms.py): crop, pad, batches, flip, rotate, size, noise, stitch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from nodes.image.load_save import ImageError
from nodes.image.transforms import (
    BatchImagesNode,
    GetImageSize,
    ImageAddNoise,
    ImageBatch,
    ImageCrop,
    ImageFlip,
    ImageFromBatch,
    ImagePadForOutpaint,
    ImageRotate,
    ImageStitch,
    RebatchImages,
    RepeatImageBatch,
)
from tests.nodes.image.image_ctx import image_ctx


@pytest.fixture()
def ctx(tmp_path: Path) -> Any:
    return image_ctx(tmp_path)


def ramp(b: int = 1, h: int = 4, w: int = 6, c: int = 3) -> torch.Tensor:
    """Distinct values everywhere, so slices can be checked exactly."""
    return torch.arange(b * h * w * c, dtype=torch.float32).view(b, h, w, c) / (b * h * w * c)


def test_image_crop_region_and_crops_past_the_edge(ctx: Any) -> None:
    image = ramp(2, 10, 12)
    out = ImageCrop().run(ctx, image=image, width=4, height=3, x=2, y=5)[0]
    assert torch.equal(out, image[:, 5:8, 2:6])
    past = ImageCrop().run(ctx, image=image, width=8, height=8, x=9, y=7)[0]
    assert past.shape == (2, 3, 3, 3)  # cut short at the edge
    outside = ImageCrop().run(ctx, image=image, width=5, height=5, x=100, y=100)[0]
    assert torch.equal(outside, image[:, 9:, 11:])  # x, y clamped to the last pixel, as ComfyUI


def test_pad_for_outpaint_grey_canvas_and_feathered_mask(ctx: Any) -> None:
    image = torch.ones(2, 20, 20, 3)
    padded, mask = ImagePadForOutpaint().run(ctx, image=image, left=8, top=0, right=0, bottom=4, feathering=5)
    assert padded.shape == (2, 24, 28, 3) and mask.shape == (1, 24, 28)
    assert torch.all(padded[:, :, :8] == 0.5) and torch.all(padded[:, :20, 8:] == 1)
    assert torch.all(mask[:, :, :8] == 1) and torch.all(mask[:, 20:, :] == 1)
    assert mask[0, 10, 8] == 1.0  # d = 0 at the padded left side: ((5 - 0) / 5)^2
    assert mask[0, 10, 10] == pytest.approx(((5 - 2) / 5) ** 2)
    assert mask[0, 0, 20] == 0  # top is not padded: no feathering there
    _, no_feather = ImagePadForOutpaint().run(
        ctx, image=image, left=8, top=0, right=0, bottom=0, feathering=0
    )
    assert torch.all(no_feather[0, :, 8:] == 0)


def test_image_batch_resizes_second_and_adds_alpha(ctx: Any) -> None:
    rgba = torch.rand(1, 8, 8, 4)
    small = torch.rand(2, 4, 6, 3)
    out = ImageBatch().run(ctx, image1=rgba, image2=small)[0]
    assert out.shape == (3, 8, 8, 4) and torch.all(out[1:, ..., 3] == 1)
    assert torch.equal(out[:1], rgba)


def test_batch_images_node_takes_the_connected_slots_in_order(ctx: Any) -> None:
    a, b, c = torch.zeros(1, 4, 4, 3), torch.ones(2, 4, 4, 3), torch.full((1, 8, 8, 3), 0.5)
    out = BatchImagesNode().run(ctx, **{"images.image0": a, "images.image1": b, "images.image3": c})[0]
    assert out.shape == (4, 4, 4, 3)
    assert out[0].max() == 0 and out[1].min() == 1 and torch.allclose(out[3], torch.full((4, 4, 3), 0.5))


def test_image_from_batch_and_clamping(ctx: Any) -> None:
    image = ramp(5)
    assert torch.equal(ImageFromBatch().run(ctx, image=image, batch_index=1, length=3)[0], image[1:4])
    assert torch.equal(ImageFromBatch().run(ctx, image=image, batch_index=9, length=3)[0], image[4:])


def test_repeat_image_batch(ctx: Any) -> None:
    image = ramp(2)
    out = RepeatImageBatch().run(ctx, image=image, amount=3)[0]
    assert out.shape[0] == 6 and torch.equal(out[2:4], image)


def test_rebatch_images_regroups_a_list(ctx: Any) -> None:
    images = [ramp(3), ramp(2), ramp(1, 8, 8)]
    out = RebatchImages().run(ctx, images=images, batch_size=[2])[0]
    assert [o.shape[0] for o in out] == [2, 2, 1, 1]  # 5 small images by 2, then the size change
    assert torch.equal(out[1][0], images[0][2]) and out[3].shape == (1, 8, 8, 3)
    assert RebatchImages.SCHEMA.input_is_list and RebatchImages.SCHEMA.outputs[0].is_list


def test_flip_and_rotate(ctx: Any) -> None:
    image = ramp(1, 3, 5)
    assert torch.equal(ImageFlip().run(ctx, image=image, flip_method="x-axis: vertically")[0], image.flip(1))
    assert torch.equal(
        ImageFlip().run(ctx, image=image, flip_method="y-axis: horizontally")[0], image.flip(2)
    )
    quarter = ImageRotate().run(ctx, image=image, rotation="90 degrees")[0]
    assert quarter.shape == (1, 5, 3, 3)
    assert torch.equal(quarter[0, 0, -1], image[0, 0, 0])  # clockwise: top-left goes to top-right
    assert torch.equal(ImageRotate().run(ctx, image=image, rotation="none")[0], image)
    half = ImageRotate().run(ctx, image=image, rotation="180 degrees")[0]
    assert torch.equal(half, image.flip(1).flip(2))


def test_get_image_size(ctx: Any) -> None:
    assert GetImageSize().run(ctx, image=torch.zeros(3, 7, 11, 3)) == (11, 7, 3)


def test_add_noise_is_seeded_and_clamped(ctx: Any) -> None:
    image = torch.full((2, 8, 8, 3), 0.5)
    one = ImageAddNoise().run(ctx, image=image, seed=3, strength=0.5)[0]
    assert torch.equal(one, ImageAddNoise().run(ctx, image=image, seed=3, strength=0.5)[0])
    assert not torch.equal(one, ImageAddNoise().run(ctx, image=image, seed=4, strength=0.5)[0])
    expected = (image + 0.5 * torch.randn(image.shape, generator=torch.Generator().manual_seed(3))).clamp(
        0, 1
    )
    assert torch.equal(one, expected) and one.min() >= 0 and one.max() <= 1
    assert torch.equal(ImageAddNoise().run(ctx, image=image, seed=0xFFFFFFFFFFFFFFFF, strength=0.0)[0], image)


def test_stitch_without_image2_is_a_pass_through(ctx: Any) -> None:
    image = ramp()
    out = ImageStitch().run(
        ctx, image1=image, direction="right", match_image_size=True, spacing_width=0, spacing_color="white"
    )[0]
    assert out is image


@pytest.mark.parametrize(("direction", "shape"), [("right", (1, 4, 14, 3)), ("down", (1, 7, 6, 3))])
def test_stitch_matches_size_keeping_image2_aspect(ctx: Any, direction: str, shape: tuple[int, ...]) -> None:
    out = ImageStitch().run(
        ctx,
        image1=ramp(1, 4, 6),
        image2=torch.rand(1, 2, 4, 3),
        direction=direction,
        match_image_size=True,
        spacing_width=0,
        spacing_color="white",
    )[0]
    assert out.shape == shape


def test_stitch_order_spacing_batch_and_padding(ctx: Any) -> None:
    a, b = torch.zeros(2, 4, 3, 3), torch.ones(1, 2, 2, 4)
    out = ImageStitch().run(
        ctx,
        image1=a,
        image2=b,
        direction="left",
        match_image_size=False,
        spacing_width=3,
        spacing_color="red",
    )[0]
    # image2 first (left), a 4-pixel red gap (3 made even), then image1; alpha added to image1
    assert out.shape == (2, 4, 2 + 4 + 3, 4)
    assert torch.equal(out[0, 1, 0], torch.ones(4))  # image2, padded to height 4 (1 row above)
    assert torch.equal(out[0, 0, 0], torch.zeros(4))  # padding row: 0 unless the spacing colour is white
    assert torch.equal(out[1, 0, 3], torch.tensor([1.0, 0, 0, 1]))  # red gap, opaque; batch repeated
    assert torch.equal(out[0, 0, 6], torch.tensor([0.0, 0, 0, 1]))


def test_stitch_reports_a_too_thin_match(ctx: Any) -> None:
    with pytest.raises(ValueError, match="at least 1 pixel"):
        ImageStitch().run(
            ctx,
            image1=ramp(1, 1, 6),
            image2=torch.rand(1, 10, 1, 3),
            direction="right",
            match_image_size=True,
            spacing_width=0,
            spacing_color="white",
        )


def test_errors_are_image_errors_with_the_fix() -> None:
    assert issubclass(ImageError, ValueError)
