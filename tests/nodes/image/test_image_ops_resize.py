"""Resize nodes (nodes/image/scale.py and ImageScale/ImageScaleBy): sizes, aspect rules, padding,
and every choice of ResizeImageMaskNode on images and masks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from nodes.image.load_save import ImageScale, ImageScaleBy
from nodes.image.scale import (
    ImageScaleToMaxDimension,
    ImageScaleToTotalPixels,
    ResizeAndPadImage,
    ResizeImageMaskNode,
)
from tests.nodes.image.image_ctx import image_ctx


@pytest.fixture()
def ctx(tmp_path: Path) -> Any:
    return image_ctx(tmp_path)


@pytest.mark.parametrize("method", ["nearest-exact", "bilinear", "area", "bicubic", "lanczos"])
def test_image_scale_every_method(ctx: Any, method: str) -> None:
    image = torch.rand(2, 10, 20, 3)
    assert ImageScale().run(ctx, image=image, upscale_method=method, width=30, height=0, crop="disabled")[
        0
    ].shape == (2, 15, 30, 3)
    assert ImageScale().run(ctx, image=image, upscale_method=method, width=8, height=8, crop="center")[
        0
    ].shape == (2, 8, 8, 3)
    assert ImageScaleBy().run(ctx, image=image, upscale_method=method, scale_by=1.5)[0].shape == (
        2,
        15,
        30,
        3,
    )
    assert (
        ImageScale().run(ctx, image=image, upscale_method=method, width=0, height=0, crop="disabled")[0]
        is image
    )


def test_scale_to_total_pixels_with_steps(ctx: Any) -> None:
    image = torch.rand(1, 200, 300, 3)
    out = ImageScaleToTotalPixels().run(
        ctx, image=image, upscale_method="bilinear", megapixels=0.25, resolution_steps=1
    )[0]
    assert out.shape == (1, 418, 627, 3)  # sqrt(0.25 * 1024² / 60000) * (300, 200), rounded
    stepped = ImageScaleToTotalPixels().run(
        ctx, image=image, upscale_method="area", megapixels=0.25, resolution_steps=64
    )[0]
    assert stepped.shape == (1, 448, 640, 3)  # 418 / 64 = 6.5 -> 7 steps


def test_scale_to_max_dimension(ctx: Any) -> None:
    image = torch.rand(1, 30, 60, 3)
    assert ImageScaleToMaxDimension().run(ctx, image=image, upscale_method="area", largest_size=20)[
        0
    ].shape == (1, 10, 20, 3)
    with pytest.raises(ValueError, match="at least 1 pixel"):
        ImageScaleToMaxDimension().run(ctx, image=image, upscale_method="area", largest_size=0)


def test_resize_and_pad_centres_the_fitted_image(ctx: Any) -> None:
    image = torch.zeros(1, 10, 20, 3)
    out = ResizeAndPadImage().run(
        ctx, image=image, target_width=10, target_height=10, padding_color="white", interpolation="area"
    )[0]
    assert out.shape == (1, 10, 10, 3)
    assert torch.all(out[:, :2] == 1) and torch.all(out[:, 2:7] == 0) and torch.all(out[:, 7:] == 1)
    black = ResizeAndPadImage().run(
        ctx,
        image=torch.ones(2, 4, 4, 3),
        target_width=8,
        target_height=6,
        padding_color="black",
        interpolation="lanczos",
    )[0]
    assert (
        black.shape == (2, 6, 8, 3) and torch.all(black[:, :, :1] == 0) and torch.all(black[:, :, 1:7] == 1)
    )


def _resize(ctx: Any, t: torch.Tensor, kind: str, **option: Any) -> torch.Tensor:
    defaults = {
        "width": 512,
        "height": 512,
        "crop": "center",
        "multiplier": 1.0,
        "longer_size": 512,
        "shorter_size": 512,
        "megapixels": 1.0,
        "multiple": 8,
    }
    values = {f"resize_type.{k}": option.get(k, v) for k, v in defaults.items()}
    if "match" in option:
        values["resize_type.match"] = option["match"]
    return ResizeImageMaskNode().run(ctx, input=t, resize_type=kind, scale_method="bilinear", **values)[0]


@pytest.mark.parametrize("layout", ["image", "mask"])
def test_resize_image_mask_node_every_type(ctx: Any, layout: str) -> None:
    t = torch.rand(2, 30, 40, 3) if layout == "image" else torch.rand(2, 30, 40)
    tail = (3,) if layout == "image" else ()

    def shape(h: int, w: int) -> tuple[int, ...]:
        return (2, h, w, *tail)

    assert _resize(ctx, t, "scale dimensions", width=20, height=20, crop="center").shape == shape(20, 20)
    assert _resize(ctx, t, "scale dimensions", width=0, height=15).shape == shape(15, 20)
    assert _resize(ctx, t, "scale dimensions", width=0, height=0) is t
    assert _resize(ctx, t, "scale by multiplier", multiplier=0.5).shape == shape(15, 20)
    assert _resize(ctx, t, "scale longer dimension", longer_size=80).shape == shape(60, 80)
    assert _resize(ctx, t, "scale shorter dimension", shorter_size=15).shape == shape(15, 20)
    assert _resize(ctx, t, "scale width", width=80, height=7).shape == shape(60, 80)  # height ignored
    assert _resize(ctx, t, "scale height", width=7, height=60).shape == shape(60, 80)
    assert _resize(ctx, t, "scale total pixels", megapixels=1200 / 1024 / 1024 * 4).shape == shape(60, 80)
    assert _resize(ctx, t, "match size", match=torch.rand(1, 5, 9), crop="disabled").shape == shape(5, 9)
    assert _resize(ctx, t, "scale to multiple", multiple=16).shape == shape(16, 32)


def test_resize_image_mask_node_errors(ctx: Any) -> None:
    with pytest.raises(ValueError, match="needs an image or mask connected to resize_type.match"):
        _resize(ctx, torch.rand(1, 4, 4), "match size")
    with pytest.raises(ValueError, match="at least 1 pixel"):
        _resize(ctx, torch.rand(1, 4, 4, 3), "scale by multiplier", multiplier=0.1)


def test_resize_image_mask_node_declares_comfyui_dynamic_names() -> None:
    names = [i.name for i in ResizeImageMaskNode.SCHEMA.inputs]
    assert names[:2] == ["input", "resize_type"] and names[-1] == "scale_method"
    assert all(n.startswith("resize_type.") for n in names[2:-1])
    assert all(i.optional for i in ResizeImageMaskNode.SCHEMA.inputs[2:-1])
