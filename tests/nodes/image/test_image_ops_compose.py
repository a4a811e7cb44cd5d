"""Compositing (nodes/image/compose.py): ImageCompositeMasked and its shared composite(),
Porter-Duff, joining and splitting alpha."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from nodes.image.compose import (
    PORTER_DUFF_MODES,
    ImageCompositeMasked,
    JoinImageWithAlpha,
    PorterDuffImageComposite,
    SplitImageWithAlpha,
    composite,
    porter_duff,
)
from tests.nodes.image.image_ctx import image_ctx


@pytest.fixture()
def ctx(tmp_path: Path) -> Any:
    return image_ctx(tmp_path)


def test_composite_places_crops_and_keeps_the_destination(ctx: Any) -> None:
    dest = torch.zeros(2, 8, 8, 3)
    src = torch.ones(1, 4, 4, 3)
    out = ImageCompositeMasked().run(ctx, destination=dest, source=src, x=6, y=1, resize_source=False)[0]
    assert out.shape == (2, 8, 8, 3)  # source batch repeated to the destination's
    assert out[:, 1:5, 6:8].min() == 1 and out.sum() == 2 * 4 * 2 * 3  # only the visible 4x2 part
    assert dest.max() == 0  # the input is not modified
    far = ImageCompositeMasked().run(ctx, destination=dest, source=src, x=100, y=100, resize_source=False)[0]
    assert torch.equal(far, dest)


def test_composite_mask_is_resized_to_the_source_and_blends(ctx: Any) -> None:
    dest = torch.zeros(1, 4, 4, 3)
    src = torch.ones(1, 4, 4, 3)
    mask = torch.zeros(1, 2, 2)
    mask[0, 0, 0] = 1  # top-left quarter, at half resolution
    out = ImageCompositeMasked().run(
        ctx, destination=dest, source=src, x=0, y=0, resize_source=False, mask=mask
    )[0]
    assert out[0, 0, 0, 0] == 1 and out[0, 3, 3, 0] == 0
    half = ImageCompositeMasked().run(
        ctx, destination=dest, source=src, x=0, y=0, resize_source=False, mask=torch.full((4, 4), 0.5)
    )[0]
    assert torch.allclose(half, torch.full_like(half, 0.5))


def test_composite_resize_source_and_alpha_matching(ctx: Any) -> None:
    dest = torch.zeros(1, 6, 6, 4)
    src = torch.ones(1, 2, 3, 3)  # no alpha: gets alpha 1
    out = ImageCompositeMasked().run(ctx, destination=dest, source=src, x=0, y=0, resize_source=True)[0]
    assert out.shape == (1, 6, 6, 4) and torch.all(out == 1)
    rgb_dest = torch.zeros(1, 4, 4, 3)
    rgba_src = torch.ones(1, 4, 4, 4)
    assert ImageCompositeMasked().run(
        ctx, destination=rgb_dest, source=rgba_src, x=0, y=0, resize_source=False
    )[0].shape == (1, 4, 4, 3)


def test_composite_latent_multiplier() -> None:
    dest = torch.zeros(1, 4, 8, 8)
    out = composite(dest, torch.ones(1, 4, 2, 2), x=16, y=8, multiplier=8)
    assert out[0, 0, 1:3, 2:4].min() == 1 and out.sum() == 4 * 4


def test_porter_duff_src_over_and_dst_in() -> None:
    src, dst = torch.tensor([[[[1.0, 0, 0]]]]), torch.tensor([[[[0.0, 0, 1]]]])
    half = torch.full((1, 1, 1, 1), 0.5)  # masks: 1 = transparent, so alpha 0.5
    opaque = torch.zeros(1, 1, 1, 1)
    colour, mask = porter_duff(src, half, dst, opaque, "SRC_OVER")
    assert torch.allclose(colour, torch.tensor([0.5, 0, 0.5])) and mask.item() == pytest.approx(0.0)
    colour, mask = porter_duff(src, half, dst, opaque, "DST_IN")
    assert torch.allclose(colour, dst) and mask.item() == pytest.approx(0.5)
    colour, mask = porter_duff(src, half, dst, opaque, "CLEAR")
    assert colour.abs().sum() == 0 and mask.item() == 1
    assert len(PORTER_DUFF_MODES) == 18


def test_porter_duff_node_resizes_and_takes_the_shortest_batch(ctx: Any) -> None:
    image, mask = PorterDuffImageComposite().run(
        ctx,
        source=torch.rand(3, 4, 4, 3),
        source_alpha=torch.zeros(2, 2, 2),
        destination=torch.rand(2, 8, 8, 3),
        destination_alpha=torch.ones(2, 8, 8),
        mode="SRC",
    )
    assert image.shape == (2, 8, 8, 3) and mask.shape == (2, 8, 8) and torch.all(mask == 0)


def test_porter_duff_channel_mismatch_is_explained(ctx: Any) -> None:
    with pytest.raises(ValueError, match="source has 4 channels and destination 3"):
        PorterDuffImageComposite().run(
            ctx,
            source=torch.rand(1, 4, 4, 4),
            source_alpha=torch.zeros(1, 4, 4),
            destination=torch.rand(1, 4, 4, 3),
            destination_alpha=torch.zeros(1, 4, 4),
            mode="SRC_OVER",
        )


def test_split_and_join_alpha_round_trip(ctx: Any) -> None:
    rgba = torch.rand(2, 4, 4, 4)
    rgb, mask = SplitImageWithAlpha().run(ctx, image=rgba)
    assert torch.equal(rgb, rgba[..., :3]) and torch.allclose(mask, 1 - rgba[..., 3])
    joined = JoinImageWithAlpha().run(ctx, image=rgb, alpha=mask)[0]
    assert torch.allclose(joined, rgba, atol=1e-6)
    _, no_alpha = SplitImageWithAlpha().run(ctx, image=torch.rand(1, 2, 2, 3))
    assert torch.all(no_alpha == 0)


def test_join_resizes_the_mask_and_takes_the_shortest_batch(ctx: Any) -> None:
    out = JoinImageWithAlpha().run(ctx, image=torch.rand(3, 8, 8, 3), alpha=torch.zeros(2, 4, 4))[0]
    assert out.shape == (2, 8, 8, 4) and torch.all(out[..., 3] == 1)
    single = JoinImageWithAlpha().run(ctx, image=torch.rand(1, 8, 8, 3), alpha=torch.ones(4, 4))[0]
    assert torch.all(single[..., 3] == 0)
