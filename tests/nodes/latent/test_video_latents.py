"""Video latents (nodes/latent/video_latents.py, nodes/family_nodes/video_nodes.py): EmptyHunyuanLatentVideo's 5-D shape and declared size,
TrimVideoLatent, ReplaceVideoLatentFrames (ComfyUI's semantics, negative index, no-fit keeps the
destination), NormalizeVideoLatentStart (ComfyUI's clamped mean/std match, by hand), and the batch
nodes passing 5-D latents through as ComfyUI does."""

from __future__ import annotations

import logging

import pytest
import torch

from engine.node import TensorSize
from nodes.family_nodes.video_nodes import EmptyHunyuanLatentVideo
from nodes.latent.batch import LatentBatch, LatentConcat, LatentFromBatch, RepeatLatentBatch
from nodes.latent.vae import LatentError
from nodes.latent.video_latents import NormalizeVideoLatentStart, ReplaceVideoLatentFrames, TrimVideoLatent


def video(frames: int, fill: float = 0.0, batch: int = 1) -> dict:
    """A video latent whose frame f holds fill + f (so frames can be told apart)."""
    samples = torch.full((batch, 16, frames, 2, 3), fill)
    samples += torch.arange(frames).float().view(1, 1, frames, 1, 1)
    return {"samples": samples}


@pytest.mark.parametrize(("length", "frames"), [(1, 1), (25, 7), (33, 9), (24, 6)])
def test_empty_hunyuan_latent_video_shape(length: int, frames: int) -> None:
    out = EmptyHunyuanLatentVideo().run(None, width=64, height=48, length=length, batch_size=2)[0]["samples"]
    assert out.shape == (2, 16, frames, 6, 8) and not out.any()


def test_empty_hunyuan_latent_video_declares_its_size_and_comfyui_defaults() -> None:
    sizes = EmptyHunyuanLatentVideo.estimate_outputs(width=848, height=480, length=25, batch_size=1)
    assert sizes == (TensorSize((1, 16, 7, 60, 106)),)
    assert EmptyHunyuanLatentVideo.estimate_outputs(width=None, height=480, length=25, batch_size=1) == (
        None,
    )
    spec = {i.name: (i.default, i.min, i.step) for i in EmptyHunyuanLatentVideo.SCHEMA.inputs}
    assert spec == {
        "width": (848, 16, 16),
        "height": (480, 16, 16),
        "length": (25, 1, 4),
        "batch_size": (1, 1, None),
    }


def test_trim_video_latent_drops_leading_frames() -> None:
    out = TrimVideoLatent().run(None, samples={**video(5), "batch_index": [0]}, trim_amount=2)[0]
    assert out["samples"].shape[2] == 3 and out["samples"][0, 0, 0, 0, 0] == 2 and out["batch_index"] == [0]
    with pytest.raises(
        LatentError, match=r"expected a video latent \[B, C, frames, H, W\].*empty video latent node"
    ):
        TrimVideoLatent().run(None, samples={"samples": torch.zeros(1, 4, 8, 8)}, trim_amount=1)


def test_replace_video_latent_frames_places_the_source_at_index() -> None:
    node = ReplaceVideoLatentFrames()
    out = node.run(None, destination=video(6), source=video(2, fill=100.0), index=1)[0]["samples"]
    assert out[0, 0, :, 0, 0].tolist() == [0, 100, 101, 3, 4, 5]
    out = node.run(None, destination=video(6), source=video(2, fill=100.0), index=-2)[0]["samples"]
    assert out[0, 0, :, 0, 0].tolist() == [0, 1, 2, 3, 100, 101]
    destination = video(6)
    assert node.run(None, destination=destination, index=3)[0] is destination  # no source: unchanged
    assert destination["samples"][0, 0, 1, 0, 0] == 1  # the input is never changed


def test_replace_video_latent_frames_that_do_not_fit_keep_the_destination(
    caplog: pytest.LogCaptureFixture,
) -> None:
    destination = video(4)
    with caplog.at_level(logging.WARNING):
        out = ReplaceVideoLatentFrames().run(None, destination=destination, source=video(3), index=2)[0]
    assert out is destination and "do not fit" in caplog.text
    with pytest.raises(LatentError, match="batch, channels and size must agree"):
        ReplaceVideoLatentFrames().run(
            None, destination=video(4), source={"samples": torch.zeros(1, 16, 1, 5, 5)}, index=0
        )


def test_batch_nodes_pass_video_latents_through() -> None:
    joined = LatentBatch().run(None, samples1=video(3), samples2=video(3, batch=2))[0]
    assert joined["samples"].shape == (3, 16, 3, 2, 3) and joined["batch_index"] == [0, 0, 1]
    longer = LatentConcat().run(None, samples1=video(3), samples2=video(2, fill=10.0), dim="t")[0]["samples"]
    assert longer[0, 0, :, 0, 0].tolist() == [0, 1, 2, 10, 11]
    assert RepeatLatentBatch().run(None, samples=video(3), amount=2)[0]["samples"].shape == (2, 16, 3, 2, 3)
    picked = LatentFromBatch().run(None, samples=video(3, batch=3), batch_index=1, length=1)[0]
    assert picked["samples"].shape == (1, 16, 3, 2, 3)


def test_normalize_video_latent_start_schema_is_comfyuis() -> None:
    schema = NormalizeVideoLatentStart.SCHEMA
    assert schema.category == "conditioning/video_models"
    assert [(i.name, i.type, i.default, i.min, i.max) for i in schema.inputs] == [
        ("latent", "LATENT", None, None, None),
        ("start_frame_count", "INT", 4, 1, 16384),
        ("reference_frame_count", "INT", 5, 1, 16384),
    ]
    assert [(o.name, o.type) for o in schema.outputs] == [("latent", "LATENT")]


def test_normalize_video_latent_start_matches_the_reference_frames_statistics() -> None:
    g = torch.Generator().manual_seed(0)
    samples = torch.randn(2, 4, 6, 3, 3, generator=g)
    samples[:, :, :2] = samples[:, :, :2] * 1.2 + 0.2  # the first frames drift a little
    before = samples.clone()
    out = NormalizeVideoLatentStart().run(
        None, latent={"samples": samples}, start_frame_count=2, reference_frame_count=3
    )
    result = out[0]["samples"]
    reference = samples[:, :, 2:5]  # min(reference_frame_count, frames - 1) frames after the start frames
    for b in range(2):
        for f in range(2):
            frame = samples[b, :, f]
            mean, std = frame.mean(), frame.std()
            target_mean = min(max(float(reference.mean()), float(mean) - 0.3), float(mean) + 0.35)
            target_std = min(max(float(reference.std()), float(std) - 0.35), float(std) + 0.5)
            expected = (frame - mean) / (std + 1e-8) * target_std + target_mean
            assert torch.allclose(result[b, :, f], expected, atol=1e-5)
            assert float(result[b, :, f].mean()) == pytest.approx(target_mean, abs=1e-5)
    assert torch.equal(result[:, :, 2:], samples[:, :, 2:])
    assert torch.equal(samples, before)  # the input latent is not changed in place


def test_normalize_video_latent_start_keeps_a_single_frame_and_refuses_no_reference() -> None:
    one = video(1)
    assert (
        NormalizeVideoLatentStart().run(None, latent=one, start_frame_count=4, reference_frame_count=5)[0]
        is one
    )
    with pytest.raises(LatentError, match="start_frame_count"):
        NormalizeVideoLatentStart().run(None, latent=video(3), start_frame_count=3, reference_frame_count=5)
