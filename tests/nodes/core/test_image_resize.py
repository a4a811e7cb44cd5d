"""The shared resize (nodes/core/resize.py): every ComfyUI upscale_method, centre crop, and the checks
of lanczos against Pillow and of bislerp against a per-pixel reference written out in plain Python."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from PIL import Image

from nodes.core.resize import UPSCALE_METHODS, bislerp, center_crop, lanczos, resize, total_pixels_size


@pytest.mark.parametrize("method", UPSCALE_METHODS)
@pytest.mark.parametrize("size", [(13, 7), (4, 9), (5, 5)])
def test_every_method_gives_the_asked_size_and_keeps_range(method: str, size: tuple[int, int]) -> None:
    torch.manual_seed(0)
    x = torch.rand(2, 3, 6, 5)
    out = resize(x, size[0], size[1], method)
    assert out.shape == (2, 3, size[1], size[0]) and out.dtype == x.dtype
    if method in ("nearest-exact", "bilinear", "area", "lanczos"):
        # no overshoot: convex blends, or (lanczos) clamped as Pillow clamps 8-bit images
        assert out.min() >= -1e-6 and out.max() <= 1 + 1e-6
    assert torch.isfinite(out).all()


def test_identity_size_is_a_no_op_for_the_sampling_methods() -> None:
    x = torch.rand(1, 4, 8, 8)
    for method in ("nearest-exact", "bilinear", "area", "bislerp", "lanczos"):
        assert torch.allclose(resize(x, 8, 8, method), x, atol=1e-5), method


def _pil_lanczos(image_u8: np.ndarray, width: int, height: int) -> np.ndarray:
    resized = Image.fromarray(image_u8).resize((width, height), Image.Resampling.LANCZOS)
    return np.asarray(resized, dtype=np.float32) / 255.0


@pytest.mark.parametrize("size", [(64, 50), (13, 11), (29, 80), (7, 37)])
def test_lanczos_matches_pillow(size: tuple[int, int]) -> None:
    torch.manual_seed(1)
    smooth = torch.nn.functional.interpolate(torch.rand(1, 3, 6, 5), size=(37, 29), mode="bicubic").clamp(
        0, 1
    )
    u8 = (smooth[0].permute(1, 2, 0) * 255).round().to(torch.uint8).numpy()
    ours = (
        lanczos(torch.from_numpy(u8).permute(2, 0, 1)[None].float() / 255, *size)[0].permute(1, 2, 0).numpy()
    )
    # Pillow rounds to 8 bits between its two passes; we stay in float: within ~1 level of 255
    assert np.abs(ours - _pil_lanczos(u8, *size)).max() <= 1.5 / 255


def test_lanczos_works_on_one_channel_and_clamps() -> None:
    mask = (torch.rand(2, 1, 10, 10) > 0.5).float()
    out = lanczos(mask, 23, 17)
    assert out.shape == (2, 1, 17, 23) and out.min() >= 0 and out.max() <= 1


def _slerp_reference(a: list[float], b: list[float], r: float) -> list[float]:
    na, nb = math.sqrt(sum(v * v for v in a)), math.sqrt(sum(v * v for v in b))
    ua = [v / na if na else 0.0 for v in a]
    ub = [v / nb if nb else 0.0 for v in b]
    dot = sum(p * q for p, q in zip(ua, ub, strict=True))
    if dot > 1 - 1e-5:
        return list(a)
    if dot < 1e-5 - 1:
        return [p * (1 - r) + q * r for p, q in zip(a, b, strict=True)]
    omega = math.acos(dot)
    length = na * (1 - r) + nb * r
    return [
        (math.sin((1 - r) * omega) * p + math.sin(r * omega) * q) / math.sin(omega) * length
        for p, q in zip(ua, ub, strict=True)
    ]


def _taps(n_in: int, n_out: int, i: int) -> tuple[int, int, float]:
    pos = min(max((i + 0.5) * n_in / n_out - 0.5, 0.0), n_in - 1)
    first = math.floor(pos)
    return first, min(first + 1, n_in - 1), pos - first


def _bislerp_reference(x: torch.Tensor, width: int, height: int) -> torch.Tensor:
    b, c, h, w = x.shape
    rows = torch.zeros(b, c, h, width)
    for n in range(b):
        for y in range(h):
            for i in range(width):
                p, q, r = _taps(w, width, i)
                rows[n, :, y, i] = torch.tensor(
                    _slerp_reference(x[n, :, y, p].tolist(), x[n, :, y, q].tolist(), r)
                )
    out = torch.zeros(b, c, height, width)
    for n in range(b):
        for j in range(height):
            p, q, r = _taps(h, height, j)
            for i in range(width):
                out[n, :, j, i] = torch.tensor(
                    _slerp_reference(rows[n, :, p, i].tolist(), rows[n, :, q, i].tolist(), r)
                )
    return out


@pytest.mark.parametrize("size", [(7, 6), (3, 2), (10, 3)])
def test_bislerp_matches_a_per_pixel_reference(size: tuple[int, int]) -> None:
    torch.manual_seed(2)
    x = torch.randn(2, 4, 4, 5)
    x[0, :, 1, 1] = 0  # a zero vector: its direction counts as zero
    x[1, :, 2, 2] = -x[1, :, 2, 3]  # opposite neighbours: linear fallback
    assert torch.allclose(bislerp(x, *size), _bislerp_reference(x, *size), atol=1e-4)


def test_bislerp_keeps_the_norm_between_equal_length_vectors() -> None:
    x = torch.nn.functional.normalize(torch.randn(1, 4, 3, 3), dim=1) * 2.0
    assert torch.allclose(bislerp(x, 9, 9).norm(dim=1), torch.full((1, 9, 9), 2.0), atol=1e-4)


def test_center_crop_follows_comfyui_rounding() -> None:
    x = torch.arange(10 * 7, dtype=torch.float32).view(1, 1, 7, 10)
    assert center_crop(x, 4, 4).shape == (1, 1, 7, 6)  # wider than square: round(1.5) = 2 off each side
    assert center_crop(x, 20, 2).shape == (1, 1, 1, 10)  # taller than 10:1: rows 3..3
    assert resize(x, 4, 4, "nearest-exact", "center").shape == (1, 1, 4, 4)


def test_total_pixels_size() -> None:
    assert total_pixels_size(512, 512, 1.0) == (1024, 1024)
    assert total_pixels_size(300, 200, 1.0, 64) == (1280, 832)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("cubic", "disabled"), "unknown upscale_method 'cubic'"),
        (("bilinear", "middle"), "unknown crop 'middle'"),
    ],
)
def test_bad_arguments_say_what_is_allowed(args: tuple[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        resize(torch.rand(1, 3, 4, 4), 8, 8, *args)
    with pytest.raises(ValueError, match="at least 1 pixel"):
        resize(torch.rand(1, 3, 4, 4), 0, 8, "bilinear")
    with pytest.raises(ValueError, match=r"\[B, C, H, W\]"):
        resize(torch.rand(3, 4, 4), 8, 8, "bilinear")
