"""VideoTrim, VideoCrop and ConcatenateVideo (nodes/image/video_cuts.py): the frames and pixels kept,
the VIDEO_EDIT values read, the preview written, and teaching errors."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.registry import NodeRegistry
from engine.validate import validate_node
from nodes.core.video import VideoComponents, VideoFromComponents
from nodes.core.video_files import VideoError
from nodes.image.video import LoadVideo
from nodes.image.video_cuts import ConcatenateVideo, VideoCrop, VideoEditDef, VideoTrim
from tests.nodes.image.image_ctx import image_ctx


@pytest.fixture()
def ctx(tmp_path: Path) -> Any:
    return image_ctx(tmp_path)


def numbered(count: int = 10, fps: int = 5, audio: bool = False, start: int = 0) -> VideoFromComponents:
    """Frame i is filled with (start + i) / 100; 16x16 so an MP4 preview can be written."""
    values = (torch.arange(start, start + count).float() / 100).view(count, 1, 1, 1)
    images = values.expand(count, 16, 16, 3).clone()
    sound = {"waveform": torch.ones(1, 1, count * 100), "sample_rate": fps * 100}
    return VideoFromComponents(VideoComponents(images, Fraction(fps), sound if audio else None))


def kept(video: Any) -> list[int]:
    return [round(v * 100) for v in video.get_components().images[:, 0, 0, 0].tolist()]


def test_schemas_follow_comfyui() -> None:
    trim = VideoTrim.SCHEMA
    assert [(i.name, i.type) for i in trim.inputs] == [
        ("video", "VIDEO"),
        ("trim", "VIDEO_EDIT"),
        ("strict_duration", "BOOLEAN"),
    ]
    assert trim.output_node and trim.category == "video" and trim.display_name == "Trim Video (Advanced)"
    assert [(i.name, i.type) for i in VideoCrop.SCHEMA.inputs] == [("video", "VIDEO"), ("crop", "VIDEO_EDIT")]
    concat = [i.name for i in ConcatenateVideo.SCHEMA.inputs]
    assert concat[0] == "videos.video_1" and concat[99] == "videos.video_100"
    assert concat[100:] == ["codec", "complete_audio"]


def test_trim_keeps_the_window_and_writes_a_preview(ctx: Any) -> None:
    out = VideoTrim().run(
        ctx, video=numbered(), trim={"trim": {"start_time": 0.4, "duration": 0.6}}, strict_duration=False
    )
    assert kept(out.values[0]) == [2, 3, 4]
    entry = out.ui["images"][0]
    assert (
        entry["type"] == "temp" and (ctx.folders.temp_dir / entry["subfolder"] / entry["filename"]).is_file()
    )
    video = numbered()
    same = VideoTrim().run(
        ctx, video=video, trim={"trim": {"start_time": 0, "duration": 0}}, strict_duration=False
    )
    assert same.values[0] is video


def test_trim_errors_teach(ctx: Any) -> None:
    with pytest.raises(VideoError, match="trim.duration: must be 0 or more seconds"):
        VideoTrim().run(ctx, video=numbered(), trim={"trim": {"duration": -1}}, strict_duration=False)
    with pytest.raises(VideoError, match=r"trim: cannot cut 5.0 s from 1.0 s of a 2.000 s video"):
        VideoTrim().run(
            ctx, video=numbered(), trim={"trim": {"start_time": 1, "duration": 5}}, strict_duration=True
        )
    with pytest.raises(VideoError, match=r"trim.trim.start_time: expected a number, found 'soon'"):
        VideoTrim().run(ctx, video=numbered(), trim={"trim": {"start_time": "soon"}}, strict_duration=False)
    with pytest.raises(VideoError, match=r"trim: expected the VIDEO_EDIT value"):
        VideoTrim().run(ctx, video=numbered(), trim=[0, 1], strict_duration=False)


def test_crop_keeps_the_region_and_zero_sizes_run_to_the_edge(ctx: Any) -> None:
    video = numbered(count=2)
    video.components.images[:, 3, 5] = 0.9  # a marked pixel
    out = (
        VideoCrop().run(ctx, video=video, crop={"crop": {"x": 4, "y": 2, "width": 6, "height": 8}}).values[0]
    )
    images = out.get_components().images
    assert images.shape == (2, 8, 6, 3) and images[0, 1, 1, 0] == pytest.approx(0.9)
    to_edge = VideoCrop().run(ctx, video=video, crop={"crop": {"x": 10, "y": 4}}).values[0]
    assert to_edge.get_dimensions() == (6, 12)
    assert VideoCrop().run(ctx, video=video, crop={"crop": {}}).values[0] is video
    with pytest.raises(VideoError, match=r"crop: the corner \(20, 0\) lies outside the 16x16 frame"):
        VideoCrop().run(ctx, video=video, crop={"crop": {"x": 20, "width": 2}})


def test_concatenate_joins_in_slot_order_with_audio(ctx: Any) -> None:
    first, second = numbered(3, audio=True), numbered(2, start=50)
    out = ConcatenateVideo().run(ctx, codec="auto", **{"videos.video_1": first, "videos.video_2": second})[0]
    assert kept(out) == [0, 1, 2, 50, 51]
    wave = out.get_components().audio["waveform"]
    assert wave.shape == (1, 1, 500) and wave[..., :300].min() == 1 and wave[..., 300:].max() == 0  # silence
    soundtrack = {"waveform": torch.zeros(1, 2, 10), "sample_rate": 44100}
    dubbed = ConcatenateVideo().run(
        ctx, codec="auto", complete_audio=soundtrack, **{"videos.video_1": first}
    )[0]
    assert dubbed.get_components().audio is soundtrack


def test_concatenate_errors_teach(ctx: Any) -> None:
    with pytest.raises(VideoError, match="videos: connect at least one VIDEO to videos.video_1"):
        ConcatenateVideo().run(ctx, codec="auto")
    other = numbered(2, fps=10)
    with pytest.raises(VideoError, match="videos.video_2: 16x16 at 10 fps, but video_1 is 16x16 at 5 fps"):
        ConcatenateVideo().run(ctx, codec="auto", **{"videos.video_1": numbered(2), "videos.video_2": other})


def test_constant_edit_values_validate() -> None:
    registry = NodeRegistry()
    registry.register_all([VideoEditDef(VideoTrim), VideoEditDef(VideoCrop), LoadVideo])
    prompt = {
        "1": {"class_type": "LoadVideo", "inputs": {"file": "a.mp4"}},
        "2": {
            "class_type": "VideoTrim",
            "inputs": {
                "video": ["1", 0],
                "trim": {"trim": {"start_time": 1.0, "duration": 2.0}},
                "strict_duration": False,
            },
        },
        "3": {
            "class_type": "VideoCrop",
            "inputs": {"video": ["1", 0], "crop": {"crop": {"x": 0, "y": 0, "width": 8, "height": 8}}},
        },
    }
    assert validate_node("2", prompt, registry)[0] == [] and validate_node("3", prompt, registry)[0] == []
