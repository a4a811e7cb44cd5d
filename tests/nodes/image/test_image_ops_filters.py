"""IMAGE post-processing nodes (nodes/image/filters.py): blend, blur, sharpen, quantize,
morphology, RGB <-> YUV."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from nodes.image.filters import (
    BLEND_MODES,
    ImageBlend,
    ImageBlur,
    ImageQuantize,
    ImageRGBToYUV,
    ImageSharpen,
    ImageYUVToRGB,
    Morphology,
    blend,
)
from tests.nodes.image.image_ctx import image_ctx


@pytest.fixture()
def ctx(tmp_path: Path) -> Any:
    return image_ctx(tmp_path)


def test_blend_modes_on_known_values() -> None:
    a, b = torch.tensor([0.2, 0.8]), torch.tensor([0.5, 0.25])
    assert torch.allclose(blend(a, b, "normal"), b)
    assert torch.allclose(blend(a, b, "multiply"), a * b)
    assert torch.allclose(blend(a, b, "screen"), 1 - (1 - a) * (1 - b))
    assert torch.allclose(blend(a, b, "overlay"), torch.tensor([2 * 0.2 * 0.5, 1 - 2 * 0.2 * 0.75]))
    assert torch.allclose(blend(a, b, "difference"), a - b)  # signed, as ComfyUI (clamped by the node)
    # soft light: b <= 0.5 darkens by a(1 - a)(1 - 2b); 0.5 leaves a unchanged
    assert torch.allclose(blend(a, torch.full((2,), 0.5), "soft_light"), a)
    assert set(BLEND_MODES) == {"normal", "multiply", "screen", "overlay", "soft_light", "difference"}


def test_image_blend_factor_resize_and_alpha(ctx: Any) -> None:
    base = torch.zeros(2, 8, 8, 4)
    layer = torch.ones(1, 4, 4, 3)  # smaller, no alpha: resized and given alpha 1, batch broadcast
    out = ImageBlend().run(ctx, image1=base, image2=layer, blend_factor=0.25, blend_mode="normal")[0]
    assert out.shape == (2, 8, 8, 4) and torch.allclose(out, torch.full_like(out, 0.25))
    diff = ImageBlend().run(ctx, image1=base, image2=layer, blend_factor=1.0, blend_mode="difference")[0]
    assert diff.min() == 0  # 0 - 1 clamped


def test_image_blend_batch_mismatch_is_explained(ctx: Any) -> None:
    with pytest.raises(ValueError, match="image1 has 2 images and image2 3"):
        ImageBlend().run(
            ctx,
            image1=torch.zeros(2, 4, 4, 3),
            image2=torch.zeros(3, 4, 4, 3),
            blend_factor=0.5,
            blend_mode="multiply",
        )


def test_blur_keeps_flat_images_and_spreads_a_dot(ctx: Any) -> None:
    flat = torch.full((1, 9, 9, 3), 0.3)
    assert torch.allclose(ImageBlur().run(ctx, image=flat, blur_radius=3, sigma=1.0)[0], flat, atol=1e-6)
    dot = torch.zeros(1, 9, 9, 1)
    dot[0, 4, 4] = 1
    out = ImageBlur().run(ctx, image=dot, blur_radius=1, sigma=1.0)[0]
    kernel = torch.exp(-torch.tensor([[2.0, 1, 2], [1, 0, 1], [2, 1, 2]]) / 2)  # coordinates -1..1, sigma 1
    assert torch.allclose(out[0, 3:6, 3:6, 0], kernel / kernel.sum(), atol=1e-6)
    assert out.sum() == pytest.approx(1.0, abs=1e-5)


def test_blur_radius_larger_than_image_is_explained(ctx: Any) -> None:
    with pytest.raises(ValueError, match="blur_radius=5 needs an image larger than 5 pixels"):
        ImageBlur().run(ctx, image=torch.rand(1, 4, 4, 3), blur_radius=5, sigma=1.0)


def test_sharpen_keeps_flat_areas_and_raises_edge_contrast(ctx: Any) -> None:
    flat = torch.full((1, 6, 6, 3), 0.4)
    assert torch.allclose(
        ImageSharpen().run(ctx, image=flat, sharpen_radius=1, sigma=1.0, alpha=1.0)[0], flat, atol=1e-5
    )
    edge = torch.zeros(1, 6, 6, 1)
    edge[:, :, 3:] = 0.5
    out = ImageSharpen().run(ctx, image=edge, sharpen_radius=1, sigma=1.0, alpha=0.1)[0]
    assert out[0, 2, 3, 0] > 0.5 and out[0, 2, 2, 0] == 0  # overshoot above, clamped at 0 below


def test_quantize_limits_colours_and_dithers(ctx: Any) -> None:
    torch.manual_seed(0)
    image = torch.rand(1, 16, 16, 3)
    for dither in ("none", "floyd-steinberg", "bayer-4"):
        out = ImageQuantize().run(ctx, image=image, colors=4, dither=dither)[0]
        assert out.shape == image.shape
        assert len(torch.unique(out.reshape(-1, 3), dim=0)) <= 4, dither
    rgba = torch.rand(1, 8, 8, 4)
    kept = ImageQuantize().run(ctx, image=rgba, colors=2, dither="none")[0]
    assert torch.equal(kept[..., 3], rgba[..., 3])


def test_morphology_on_a_dot(ctx: Any) -> None:
    dot = torch.zeros(1, 7, 7, 1)
    dot[0, 3, 3] = 1
    dilated = Morphology().run(ctx, image=dot, operation="dilate", kernel_size=3)[0]
    assert dilated.sum() == 9 and dilated[0, 2:5, 2:5].min() == 1
    assert Morphology().run(ctx, image=dot, operation="erode", kernel_size=3)[0].sum() == 0
    assert Morphology().run(ctx, image=dot, operation="open", kernel_size=3)[0].sum() == 0
    assert torch.equal(Morphology().run(ctx, image=dot, operation="top_hat", kernel_size=3)[0], dot)
    assert Morphology().run(ctx, image=dot, operation="gradient", kernel_size=3)[0].sum() == 9
    hole = 1 - dot
    assert Morphology().run(ctx, image=hole, operation="close", kernel_size=3)[0].min() == 1
    assert torch.equal(Morphology().run(ctx, image=hole, operation="bottom_hat", kernel_size=3)[0], dot)


def test_morphology_even_kernel_keeps_size_and_borders_do_not_leak(ctx: Any) -> None:
    image = torch.ones(1, 5, 6, 3)
    for op in ("erode", "dilate", "open", "close"):
        out = Morphology().run(ctx, image=image, operation=op, kernel_size=4)[0]
        assert out.shape == image.shape and torch.all(out == 1), op  # geodesic border: no dark frame


def test_yuv_round_trip_and_known_values(ctx: Any) -> None:
    torch.manual_seed(1)
    image = torch.rand(2, 5, 5, 4)
    y, u, v = ImageRGBToYUV().run(ctx, image=image)
    assert y.shape == (2, 5, 5, 3) and torch.equal(y[..., 0], y[..., 2])
    grey = ImageRGBToYUV().run(ctx, image=torch.full((1, 1, 1, 3), 0.6))
    assert [t[0, 0, 0, 0].item() for t in grey] == pytest.approx([0.6, 0.5, 0.5])
    back = ImageYUVToRGB().run(ctx, Y=y, U=u, V=v)[0]
    assert torch.allclose(back, image[..., :3], atol=2e-3)  # the rounded coefficients invert to ~1e-3


def test_yuv_planes_of_different_sizes_are_explained(ctx: Any) -> None:
    with pytest.raises(ValueError, match="same batch and size"):
        ImageYUVToRGB().run(ctx, Y=torch.rand(1, 4, 4, 3), U=torch.rand(1, 4, 4, 3), V=torch.rand(1, 2, 4, 3))
