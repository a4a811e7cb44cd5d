"""Video files and values (nodes/image/video.py, nodes/core/video.py): CreateVideo → SaveVideo →
LoadVideo → GetVideoComponents gives back the frames (count, size, fps, pixels within H.264's
tolerance) and the workflow as ComfyUI embeds it; SaveWEBM; the UI entry ComfyUI reports; bad input
teaches."""

from __future__ import annotations

import json
import os
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import pytest
import torch

from engine.registry import NodeRegistry
from nodes.core.options import OptionSources
from nodes.core.video import VideoComponents, VideoFromComponents, VideoFromFile
from nodes.core.video_files import VideoError
from nodes.image.video import (
    CreateVideo,
    GetVideoComponents,
    LoadVideo,
    SaveVideo,
    SaveWEBM,
    list_input_videos,
    register_options,
)
from tests.nodes.image.image_ctx import image_ctx

PROMPT = {"1": {"class_type": "CreateVideo", "inputs": {"fps": 8.0}}}
WORKFLOW = {"workflow": {"nodes": [], "version": 0.4}}


def frames(count: int = 5, size: int = 32) -> torch.Tensor:
    """Smooth frames (gradients that shift per frame), which H.264 keeps closely: [T, H, W, 3]."""
    ramp = torch.linspace(0.2, 0.8, size)
    out = torch.empty(count, size, size, 3)
    for t in range(count):
        out[t, ..., 0] = ramp[None, :]
        out[t, ..., 1] = ramp[:, None]
        out[t, ..., 2] = 0.3 + 0.1 * t
    return out


@pytest.fixture()
def ctx(tmp_path: Path) -> Any:
    return image_ctx(tmp_path)


def save(ctx: Any, video: Any, prefix: str = "video/ComfyUI", **hidden: Any) -> dict[str, Any]:
    return SaveVideo().run(ctx, video=video, filename_prefix=prefix, format="auto", codec="auto", **hidden).ui


def test_round_trip_keeps_frame_count_size_fps_and_pixels(ctx: Any) -> None:
    images = frames()
    video = CreateVideo().run(ctx, images=images, fps=8.0)[0]
    ui = save(ctx, video, prompt=PROMPT, extra_pnginfo=WORKFLOW)
    assert ui == {
        "images": [{"filename": "ComfyUI_00001_.mp4", "subfolder": "video", "type": "output"}],
        "animated": (True,),
    }
    written = ctx.folders.output_dir / "video" / "ComfyUI_00001_.mp4"
    os.replace(written, ctx.folders.input_dir / "clip.mp4")

    loaded = LoadVideo().run(ctx, file="clip.mp4")[0]
    assert loaded.get_dimensions() == (32, 32) and loaded.get_frame_count() == 5
    back, audio, fps = GetVideoComponents().run(ctx, video=loaded)
    assert back.shape == (5, 32, 32, 3) and fps == 8.0 and audio is None
    assert (back - images).abs().mean() < 0.02 and (back - images).abs().max() < 0.1


def test_the_workflow_is_embedded_as_json_container_tags(ctx: Any) -> None:
    save(ctx, CreateVideo().run(ctx, images=frames(), fps=8.0)[0], prompt=PROMPT, extra_pnginfo=WORKFLOW)
    with av.open(str(ctx.folders.output_dir / "video" / "ComfyUI_00001_.mp4")) as container:
        tags = dict(container.metadata)
        assert container.streams.video[0].codec_context.name == "h264"
    assert json.loads(tags["prompt"]) == PROMPT and json.loads(tags["workflow"]) == WORKFLOW["workflow"]


def test_metadata_is_left_out_when_the_run_says_so(tmp_path: Path) -> None:
    ctx = image_ctx(tmp_path, png_metadata=False)
    save(ctx, CreateVideo().run(ctx, images=frames(), fps=8.0)[0], prompt=PROMPT, extra_pnginfo=WORKFLOW)
    parts = VideoFromFile(ctx.folders.output_dir / "video" / "ComfyUI_00001_.mp4").get_components()
    assert parts.metadata is not None and "prompt" not in parts.metadata and "workflow" not in parts.metadata


def test_saving_a_loaded_mp4_copies_its_streams_and_replaces_the_workflow(ctx: Any) -> None:
    save(ctx, CreateVideo().run(ctx, images=frames(), fps=8.0)[0], prompt={"old": 1})
    first = ctx.folders.output_dir / "video" / "ComfyUI_00001_.mp4"
    ui = save(ctx, VideoFromFile(first), prompt=PROMPT)
    assert ui["images"][0]["filename"] == "ComfyUI_00002_.mp4"  # the counter goes on
    second = VideoFromFile(ctx.folders.output_dir / "video" / "ComfyUI_00002_.mp4")
    parts = second.get_components()
    assert json.loads(parts.metadata["prompt"]) == PROMPT
    assert torch.equal(parts.images, VideoFromFile(first).get_components().images)  # no re-encode


def test_audio_goes_through_create_save_load(ctx: Any) -> None:
    audio = {"waveform": torch.sin(torch.linspace(0, 400, 16000)).repeat(1, 2, 1) * 0.3, "sample_rate": 16000}
    video = CreateVideo().run(ctx, images=frames(8), fps=8.0, audio=audio)[0]
    save(ctx, video)
    _, back, _ = GetVideoComponents().run(
        ctx, video=VideoFromFile(ctx.folders.output_dir / "video" / "ComfyUI_00001_.mp4")
    )
    assert back["sample_rate"] == 16000 and back["waveform"].shape[:2] == (1, 2)
    assert back["waveform"].shape[2] >= 16000 * 0.9  # about the clip's second of sound


def test_save_webm_writes_vp9_with_the_workflow(ctx: Any) -> None:
    ui = (
        SaveWEBM()
        .run(ctx, images=frames(), filename_prefix="ComfyUI", codec="vp9", fps=8.0, crf=20.0, prompt=PROMPT)
        .ui
    )
    assert ui == {
        "images": [{"filename": "ComfyUI_00001_.webm", "subfolder": "", "type": "output"}],
        "animated": (True,),
    }
    loaded = VideoFromFile(ctx.folders.output_dir / "ComfyUI_00001_.webm")
    parts = loaded.get_components()
    assert parts.images.shape == (5, 32, 32, 3) and parts.frame_rate == 8
    assert {k.lower(): v for k, v in parts.metadata.items()}["prompt"] == json.dumps(PROMPT)
    assert loaded.get_container_format() == "matroska,webm"


def test_save_webm_av1(ctx: Any) -> None:
    if "libsvtav1" not in av.codecs_available:
        pytest.skip("this PyAV has no SVT-AV1 encoder")
    SaveWEBM().run(ctx, images=frames(2), filename_prefix="clip", codec="av1", fps=24.0, crf=40.0)
    assert VideoFromFile(ctx.folders.output_dir / "clip_00001_.webm").get_frame_count() == 2


def test_input_videos_are_listed_for_load_video(ctx: Any) -> None:
    for name in ("b.mp4", "a.webm", "note.txt", "pic.png"):
        (ctx.folders.input_dir / name).write_bytes(b"x")
    assert list_input_videos(ctx.folders.input_dir) == ["a.webm", "b.mp4"]
    registry = NodeRegistry()
    registry.register_all([LoadVideo], origin="core")
    register_options(registry, OptionSources(None, ctx.folders.input_dir, None))
    spec = registry.object_info("LoadVideo")["LoadVideo"]["input"]["required"]["file"]
    assert spec[0] == ["a.webm", "b.mp4"] and spec[1]["video_upload"] is True


def test_load_video_fingerprint_is_the_modification_time(ctx: Any) -> None:
    (ctx.folders.input_dir / "a.mp4").write_bytes(b"x")
    os.utime(ctx.folders.input_dir / "a.mp4", (5, 5))
    assert LoadVideo.fingerprint(ctx.folders, file="a.mp4") == 5
    assert LoadVideo.fingerprint(ctx.folders, file="gone.mp4") == "missing"


def test_a_file_that_is_not_a_video_says_so(ctx: Any) -> None:
    (ctx.folders.input_dir / "fake.mp4").write_bytes(b"this is text, not a video")
    with pytest.raises(VideoError, match="'fake.mp4' is not a video file PyAV can read.*MP4"):
        LoadVideo().run(ctx, file="fake.mp4")
    with pytest.raises(VideoError, match="'gone.mp4' not found in the input folder.*upload"):
        LoadVideo().run(ctx, file="gone.mp4")
    with pytest.raises(VideoError, match="outside the input folder"):
        LoadVideo().run(ctx, file="../x.mp4")


def test_a_truncated_video_says_so(ctx: Any) -> None:
    save(ctx, CreateVideo().run(ctx, images=frames(), fps=8.0)[0])
    data = (ctx.folders.output_dir / "video" / "ComfyUI_00001_.mp4").read_bytes()
    (ctx.folders.input_dir / "cut.mp4").write_bytes(data[: len(data) // 2])
    with pytest.raises(VideoError, match="'cut.mp4'"):
        GetVideoComponents().run(ctx, video=LoadVideo().run(ctx, file="cut.mp4")[0])


def test_odd_sizes_and_wrong_values_teach_and_leave_nothing_behind(ctx: Any) -> None:
    odd = CreateVideo().run(ctx, images=torch.rand(2, 31, 32, 3), fps=8.0)[0]
    with pytest.raises(VideoError, match="even width and height.*32x31"):
        save(ctx, odd)
    assert os.listdir(ctx.folders.output_dir / "video") == []  # no half-written file
    with pytest.raises(VideoError, match="SaveVideo expected a VIDEO.*CreateVideo"):
        save(ctx, torch.rand(2, 32, 32, 3))
    with pytest.raises(VideoError, match="CreateVideo expected IMAGE frames"):
        CreateVideo().run(ctx, images=torch.rand(32, 32, 3), fps=8.0)
    with pytest.raises(VideoError, match="format 'mkv' is not offered"):
        VideoFromComponents(VideoComponents(frames(), Fraction(8))).save_to(
            ctx.folders.output_dir / "x.mp4", "mkv"
        )


def test_a_video_value_reports_its_size_to_the_cache(ctx: Any) -> None:
    video = CreateVideo().run(ctx, images=frames(), fps=8.0)[0]
    assert video.cache_size_bytes() >= frames().numel() * 4


def test_a_codec_this_pyav_lacks_is_named_with_the_fix(ctx: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(av, "codecs_available", frozenset({"h264", "aac"}))
    with pytest.raises(VideoError, match="this machine's PyAV has no 'libvpx-vp9' encoder.*pip install"):
        SaveWEBM().run(ctx, images=frames(), filename_prefix="ComfyUI", codec="vp9", fps=8.0, crf=32.0)
    assert os.listdir(ctx.folders.output_dir) == []  # nothing half-written
    with pytest.raises(VideoError, match="codec 'h265' is not offered; choose one of vp9, av1"):
        SaveWEBM().run(ctx, images=frames(), filename_prefix="ComfyUI", codec="h265", fps=8.0, crf=32.0)


def test_an_encode_that_fails_midway_leaves_no_file(tmp_path: Path) -> None:
    from nodes.core.video_files import write_atomic_video

    def fails(target: Path) -> None:
        target.write_bytes(b"half a video")
        raise av.error.InvalidDataError(1094995529, "stopped midway")

    with pytest.raises(VideoError, match="encoding 'clip.mp4' failed"):
        write_atomic_video(tmp_path / "clip.mp4", fails)
    assert os.listdir(tmp_path) == []
