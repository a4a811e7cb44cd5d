"""ImageColorSpace and ImageHistogram (nodes/image/color_space.py): BT.2100's reference points,
round trips, tone mapping into sRGB, and the histogram's bins computed by hand."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from nodes.image.color_space import (
    COLOR_SPACES,
    ColorSpaceError,
    ImageColorSpace,
    ImageHistogram,
    convert_color_space,
)
from tests.nodes.image.image_ctx import image_ctx


@pytest.fixture()
def ctx(tmp_path: Path) -> Any:
    return image_ctx(tmp_path)


def test_schema_follows_comfyui() -> None:
    schema = ImageColorSpace.SCHEMA
    assert [(i.name, i.options, i.default) for i in schema.inputs] == [
        ("image", None, None),
        ("source", ("sRGB", "HDR", "HDR PQ"), "sRGB"),
        ("destination", ("sRGB", "HDR", "HDR PQ"), "sRGB"),
    ]
    assert schema.category == "image/color"
    hist = ImageHistogram.SCHEMA
    assert [o.name for o in hist.outputs] == ["rgb", "luminance", "red", "green", "blue"]
    assert {o.type for o in hist.outputs} == {"HISTOGRAM"} and hist.category == "utils"


def test_sdr_white_lands_on_bt2408_reference_levels(ctx: Any) -> None:
    white = torch.ones(1, 1, 1, 3)
    hlg = ImageColorSpace().run(ctx, image=white, source="sRGB", destination="HDR")[0]
    pq = ImageColorSpace().run(ctx, image=white, source="sRGB", destination="HDR PQ")[0]
    assert torch.allclose(hlg, torch.full_like(hlg, 0.75), atol=2e-4)  # 203 nits is 75 % HLG
    assert torch.allclose(pq, torch.full_like(pq, 0.5807), atol=2e-4)  # and 58 % PQ
    black = convert_color_space(torch.zeros(1, 1, 1, 3), "sRGB", "HDR PQ")
    assert black.abs().max() < 1e-4


@pytest.mark.parametrize(("a", "b"), [("sRGB", "HDR"), ("sRGB", "HDR PQ"), ("HDR", "HDR PQ")])
def test_widening_and_back_is_the_identity(a: str, b: str) -> None:
    torch.manual_seed(0)
    image = torch.rand(2, 4, 4, 3)
    back = convert_color_space(convert_color_space(image, a, b), b, a)
    assert torch.allclose(back, image, atol=1e-5)


def test_narrowing_tone_maps_into_range_and_keeps_alpha(ctx: Any) -> None:
    bright = torch.tensor([[[[1.0, 1.0, 1.0, 0.25], [0.9, 0.1, 0.1, 1.0]]]])
    out = ImageColorSpace().run(ctx, image=bright, source="HDR PQ", destination="sRGB")[0]
    assert out.shape == bright.shape and out[..., 3].tolist() == [[[0.25, 1.0]]]
    assert out[..., :3].min() >= 0 and out[..., :3].max() <= 1  # 10000 nits tone-mapped below sRGB white
    same = ImageColorSpace().run(ctx, image=bright, source="HDR", destination="HDR")[0]
    assert same is bright


def test_unknown_space_teaches() -> None:
    with pytest.raises(
        ColorSpaceError, match="destination: unknown colour space 'Rec709'; expected one of sRGB"
    ):
        convert_color_space(torch.zeros(1, 1, 1, 3), "sRGB", "Rec709")
    assert COLOR_SPACES == ("sRGB", "HDR", "HDR PQ")


def test_histogram_bins_of_the_first_image(ctx: Any) -> None:
    image = torch.zeros(2, 1, 2, 3)
    image[0, 0, 0] = torch.tensor([1.0, 0.5, 0.0])  # 255, 127, 0
    image[1] = 1.0  # the second image is not measured
    rgb, lum, red, green, blue = ImageHistogram().run(ctx, image=image)
    assert len(rgb) == len(lum) == 256
    assert red[255] == 1 and red[0] == 1 and green[127] == 1 and green[0] == 1 and blue[0] == 2
    assert rgb[0] == (1 + 1 + 2) // 3 and rgb[255] == 0 and rgb[127] == 0
    assert lum[int((0.2126 + 0.7152 * 0.5) * 255)] == 1 and lum[0] == 1
    with pytest.raises(ColorSpaceError, match=r"image: expected an RGB IMAGE"):
        ImageHistogram().run(ctx, image=torch.zeros(1, 2, 2, 1))
