"""Video utility nodes (nodes/image/video_edit.py): Video Slice, VideoFrameSample, VideoTemporalCrop,
VideoRandomTemporalCrop keep the frames ComfyUI's documentation says, and teach on bad input."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import torch

from nodes.core.video import VideoComponents, VideoFromComponents
from nodes.core.video_files import VideoError
from nodes.image.video_edit import VideoFrameSample, VideoRandomTemporalCrop, VideoSlice, VideoTemporalCrop
from tests.nodes.image.image_ctx import image_ctx


@pytest.fixture()
def ctx(tmp_path: Path) -> Any:
    return image_ctx(tmp_path)


def numbered(count: int = 10, fps: int = 5, audio: bool = False) -> VideoFromComponents:
    """A video whose frame i is filled with i / 100, so the kept frames can be read back."""
    images = (torch.arange(count).float() / 100).view(count, 1, 1, 1).expand(count, 4, 4, 3).clone()
    sound = {"waveform": torch.arange(count * 100).float().view(1, 1, -1), "sample_rate": fps * 100}
    return VideoFromComponents(VideoComponents(images, Fraction(fps), sound if audio else None))


def kept(video: Any) -> list[int]:
    return [round(v * 100) for v in video.get_components().images[:, 0, 0, 0].tolist()]


def test_slice_by_seconds_and_from_the_end(ctx: Any) -> None:
    video = numbered()  # 10 frames at 5 fps: 2 s
    node = VideoSlice()
    assert kept(node.run(ctx, video=video, start_time=0.4, duration=0.6, strict_duration=False)[0]) == [
        2,
        3,
        4,
    ]
    assert kept(node.run(ctx, video=video, start_time=1.0, duration=0.0, strict_duration=False)[0]) == [
        5,
        6,
        7,
        8,
        9,
    ]
    assert kept(node.run(ctx, video=video, start_time=-0.4, duration=0.0, strict_duration=False)[0]) == [8, 9]
    assert kept(node.run(ctx, video=video, start_time=1.6, duration=5.0, strict_duration=False)[0]) == [8, 9]


def test_slice_cuts_the_audio_with_the_frames(ctx: Any) -> None:
    sliced = VideoSlice().run(
        ctx, video=numbered(audio=True), start_time=0.2, duration=0.4, strict_duration=False
    )[0]
    waveform = sliced.get_components().audio["waveform"]
    assert waveform.shape[-1] == 200 and waveform[0, 0, 0] == 100  # frames 1-2 of 100 samples each


def test_slice_that_cannot_be_cut_teaches(ctx: Any) -> None:
    with pytest.raises(
        VideoError, match="cannot cut 5.0 s from 1.0 s: the video lasts 2.000 s.*strict_duration"
    ):
        VideoSlice().run(ctx, video=numbered(), start_time=1.0, duration=5.0, strict_duration=True)
    with pytest.raises(VideoError, match="lasts 2.000 s"):
        VideoSlice().run(ctx, video=numbered(), start_time=3.0, duration=0.0, strict_duration=False)
    with pytest.raises(VideoError, match="Video Slice expected a VIDEO"):
        VideoSlice().run(ctx, video="clip.mp4", start_time=0.0, duration=0.0, strict_duration=False)


@pytest.mark.parametrize(
    ("strategy", "num_frames", "expected"),
    [
        ("head", 3, [0, 1, 2]),
        ("tail", 3, [7, 8, 9]),
        ("uniform", 4, [0, 3, 6, 9]),
        ("uniform", 1, [5]),  # the middle frame
        ("head", 50, list(range(10))),  # clamped to the frame count
    ],
)
def test_frame_sample_strategies(ctx: Any, strategy: str, num_frames: int, expected: list[int]) -> None:
    out = VideoFrameSample().run(ctx, video=numbered(), num_frames=num_frames, strategy=strategy, seed=0)[0]
    assert kept(out) == expected and out.get_frame_rate() == 5


def test_random_frame_sample_is_sorted_and_seeded(ctx: Any) -> None:
    def pick(seed: int) -> list[int]:
        return kept(
            VideoFrameSample().run(ctx, video=numbered(), num_frames=4, strategy="random", seed=seed)[0]
        )

    assert pick(3) == pick(3) and pick(3) == sorted(pick(3)) and len(set(pick(3))) == 4
    assert any(pick(s) != pick(3) for s in range(4, 10))
    with pytest.raises(VideoError, match="strategy must be one of uniform, head, tail, random; got 'middle'"):
        VideoFrameSample().run(ctx, video=numbered(), num_frames=4, strategy="middle", seed=0)


def test_temporal_crop_clamps_start_and_length(ctx: Any) -> None:
    node = VideoTemporalCrop()
    assert kept(node.run(ctx, video=numbered(), start_frame=2, length=3)[0]) == [2, 3, 4]
    assert kept(node.run(ctx, video=numbered(), start_frame=8, length=16)[0]) == [8, 9]
    assert kept(node.run(ctx, video=numbered(), start_frame=500, length=4)[0]) == [9]  # the last frame


def test_random_temporal_crop_keeps_consecutive_frames(ctx: Any) -> None:
    node = VideoRandomTemporalCrop()
    frames = kept(node.run(ctx, video=numbered(), length=4, seed=11)[0])
    assert len(frames) == 4 and frames == list(range(frames[0], frames[0] + 4))
    assert frames == kept(node.run(ctx, video=numbered(), length=4, seed=11)[0])
    assert kept(node.run(ctx, video=numbered(), length=40, seed=1)[0]) == list(range(10))
