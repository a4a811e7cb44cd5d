"""ColorTransfer (nodes/image/color_transfer.py): Reinhard and MKL move the Lab statistics onto the
reference's, the histogram LUT by hand, the source_stats modes, strength, and the errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from nodes.image.color_transfer import ColorTransfer, ColorTransferError, frame_stats, mkl_matrix, to_lab
from tests.nodes.image.image_ctx import image_ctx


@pytest.fixture()
def ctx(tmp_path: Path) -> Any:
    return image_ctx(tmp_path)


def _run(
    ctx: Any, target: torch.Tensor, ref: torch.Tensor | None, method: str, stats: str = "per_frame", **kw: Any
) -> torch.Tensor:
    return ColorTransfer().run(
        ctx,
        image_target=target,
        image_ref=ref,
        method=method,
        source_stats=stats,
        strength=kw.pop("strength", 1.0),
        **kw,
    )[0]


@pytest.fixture()
def pair() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    target = 0.4 + 0.1 * torch.rand(2, 8, 8, 3, generator=g)
    ref = 0.3 + 0.3 * torch.rand(1, 8, 8, 3, generator=g)
    ref[..., 0] += 0.1
    return target, ref


def test_schema_follows_comfyui() -> None:
    names = [(i.name, i.default, i.optional) for i in ColorTransfer.SCHEMA.inputs]
    assert names == [
        ("image_target", None, False),
        ("image_ref", None, True),
        ("method", "reinhard_lab", False),
        ("source_stats", "per_frame", False),
        ("source_stats.target_index", 0, True),
        ("strength", 1.0, False),
    ]
    assert ColorTransfer.SCHEMA.input("method").options == ("reinhard_lab", "mkl_lab", "histogram")
    assert ColorTransfer.SCHEMA.category == "image/postprocessing"


def test_reinhard_moves_lab_mean_and_std_onto_the_reference(ctx: Any, pair: Any) -> None:
    target, ref = pair
    out = _run(ctx, target, ref, "reinhard_lab")
    want_mean, want_std = frame_stats(to_lab(ref[0]), True)
    for frame in out:
        mean, std = frame_stats(to_lab(frame), True)
        assert torch.allclose(mean, want_mean, atol=0.05) and torch.allclose(std, want_std, atol=0.05)


def test_mkl_matches_the_covariance(ctx: Any, pair: Any) -> None:
    target, ref = pair
    out = _run(ctx, target, ref, "mkl_lab")
    mean, cov = frame_stats(to_lab(out[0]), False)
    assert torch.allclose(mean, frame_stats(to_lab(ref[0]), False)[0], atol=0.5)
    cov_s = frame_stats(to_lab(target[0]), False)[1]
    t = mkl_matrix(cov_s, frame_stats(to_lab(ref[0]), False)[1])
    assert torch.allclose(t @ cov_s @ t.T, frame_stats(to_lab(ref[0]), False)[1], atol=1e-3)


def test_histogram_lut_by_hand(ctx: Any) -> None:
    target = torch.full((1, 4, 4, 3), 0.2)
    ref = torch.full((1, 4, 4, 3), 0.8)
    out = _run(ctx, target, ref, "histogram")
    assert torch.allclose(
        out, torch.full_like(out, 204 / 255)
    )  # bin 51 -> the first bin where ref's CDF is 1
    half = _run(ctx, target, ref, "histogram", strength=0.5)
    assert torch.allclose(half, torch.full_like(half, (0.2 + 204 / 255) / 2))


def test_target_frame_applies_one_transform_to_all(ctx: Any) -> None:
    target = torch.stack([torch.full((4, 4, 3), 0.2), torch.full((4, 4, 3), 0.4)])
    ref = torch.full((1, 4, 4, 3), 0.8)
    out = _run(ctx, target, ref, "histogram", "target_frame", **{"source_stats.target_index": 5})
    # index clamped to the last frame (0.4 -> 0.8); frame 0's bin 51 is below 0.4's bin, so it maps to 0
    assert torch.allclose(out[1], torch.full_like(out[1], 204 / 255)) and torch.all(out[0] == 0)


def test_strength_zero_and_no_reference_return_the_input(ctx: Any, pair: Any) -> None:
    target, ref = pair
    assert _run(ctx, target, ref, "mkl_lab", strength=0.0) is target
    assert _run(ctx, target, None, "mkl_lab") is target


def test_errors_teach(ctx: Any, pair: Any) -> None:
    target, ref = pair
    with pytest.raises(ColorTransferError, match="method: unknown 'lut'; expected one of reinhard_lab"):
        _run(ctx, target, ref, "lut")
    with pytest.raises(
        ColorTransferError, match=r"image_ref: expected an RGB IMAGE \[B, H, W, 3\], found \(1, 8, 8, 4\)"
    ):
        _run(ctx, target, torch.zeros(1, 8, 8, 4), "histogram")
