"""Today's ComfyUI video edits that need no model: VideoTrim ("Trim Video (Advanced)"), VideoCrop
("Crop Video") and ConcatenateVideo (names, inputs and semantics from ComfyUI's
``comfy_extras/nodes_video.py`` and its node documentation).

VideoTrim and VideoCrop read ComfyUI's VIDEO_EDIT widget: a dict holding ``{"trim": {"start_time",
"duration"}}`` (seconds) or ``{"crop": {"x", "y", "width", "height"}}`` (pixels). It is a constant in
API-format prompts, so the nodes check it themselves (:func:`edit_values`). Like ComfyUI they are
output nodes: each writes a temporary MP4 preview of its result.
"""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction
from typing import Any

import torch

from engine.context import NodeContext
from engine.node import NativeNodeDef, Node, NodeOutput
from engine.schema import BOOLEAN, COMBO, Input, NodeSchema, Output
from nodes.core.video import AUDIO, VIDEO, Video, VideoComponents, VideoFromComponents, as_video
from nodes.core.video_files import CODECS, VideoError
from nodes.image.load_save import save_path

VIDEO_EDIT = "VIDEO_EDIT"
CONCAT_SLOTS = 100  # videos.video_1 .. videos.video_100


def edit_values(edit: Any, part: str, keys: tuple[str, ...], name: str) -> dict[str, float]:
    """The numbers of ``edit[part]`` (missing ones 0); a teaching error for anything else."""
    if edit is None:
        edit = {}
    if not isinstance(edit, dict) or not isinstance(edit.get(part, {}), dict):
        raise VideoError(
            f"{name}: expected the VIDEO_EDIT value {{'{part}': {{{', '.join(repr(k) for k in keys)}}}}}, found {edit!r}"
        )
    values = edit.get(part) or {}
    out: dict[str, float] = {}
    for key in keys:
        value = values.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise VideoError(f"{name}.{part}.{key}: expected a number, found {value!r}")
        out[key] = float(value)
    return out


def preview(ctx: NodeContext, video: Video) -> NodeOutput:
    """The video as the node's result, with a temporary MP4 preview for the editor."""
    folder, stem, sub, counter = save_path(ctx.folders.temp_dir, "ComfyUI_temp_video")
    name = f"{stem}_{counter:05}_.mp4"
    video.save_to(folder / name)
    return NodeOutput(
        values=(video,),
        ui={"images": [{"filename": name, "subfolder": sub, "type": "temp"}], "animated": (True,)},
    )


class VideoTrim(Node):
    SCHEMA = NodeSchema(
        node_id="VideoTrim",
        display_name="Trim Video (Advanced)",
        category="video",
        description="Cut a video to a window of `duration` seconds from `start_time` (0 and 0: unchanged).",
        inputs=(
            Input("video", VIDEO, "The video to trim."),
            Input(
                "trim",
                VIDEO_EDIT,
                "Trim window in seconds. Duration 0 keeps the video until the end.",
                default={"trim": {"start_time": 0.0, "duration": 0.0}},
                extra={"features": ["trim"]},
            ),
            Input(
                "strict_duration",
                BOOLEAN,
                "If True, when the specified duration is not possible, an error will be raised.",
                default=False,
            ),
        ),
        outputs=(Output("VIDEO", VIDEO, "The trimmed video."),),
        output_node=True,
        experimental=True,
    )

    def run(self, ctx: NodeContext, *, video: Any, trim: Any, strict_duration: bool) -> NodeOutput:
        video = as_video(video, "VideoTrim")
        window = edit_values(trim, "trim", ("start_time", "duration"), "trim")
        start, duration = window["start_time"], window["duration"]
        if duration < 0:
            raise VideoError(f"trim.duration: must be 0 or more seconds, found {duration}")
        if start == 0 and duration == 0:
            return preview(ctx, video)
        trimmed = video.as_trimmed(start, duration, strict_duration)
        if trimmed is None:
            raise VideoError(
                f"trim: cannot cut {duration} s from {start} s of a {video.get_duration():.3f} s video; "
                "lower start_time or duration, or turn strict_duration off"
            )
        return preview(ctx, trimmed)


def cropped(video: Video, x: int, y: int, width: int, height: int) -> Video:
    """The frames' region from (x, y); width or height 0 runs to the frame's edge."""
    parts = video.get_components()
    frame_h, frame_w = int(parts.images.shape[1]), int(parts.images.shape[2])
    if x >= frame_w or y >= frame_h:
        raise VideoError(
            f"crop: the corner ({x}, {y}) lies outside the {frame_w}x{frame_h} frame; choose x < {frame_w}, y < {frame_h}"
        )
    x2 = frame_w if width <= 0 else min(frame_w, x + width)
    y2 = frame_h if height <= 0 else min(frame_h, y + height)
    return VideoFromComponents(replace(parts, images=parts.images[:, y:y2, x:x2], metadata=None))


class VideoCrop(Node):
    SCHEMA = NodeSchema(
        node_id="VideoCrop",
        display_name="Crop Video",
        category="video",
        description="Crop a video to a rectangle in pixels (zero width and height: the full frame).",
        inputs=(
            Input("video", VIDEO, "The video to crop."),
            Input(
                "crop",
                VIDEO_EDIT,
                "Crop region in pixels. Zero width/height keeps the full frame.",
                default={"crop": {"x": 0, "y": 0, "width": 0, "height": 0}},
                extra={"features": ["crop"]},
            ),
        ),
        outputs=(Output("VIDEO", VIDEO, "The cropped video."),),
        output_node=True,
        experimental=True,
    )

    def run(self, ctx: NodeContext, *, video: Any, crop: Any) -> NodeOutput:
        video = as_video(video, "VideoCrop")
        box = {k: int(v) for k, v in edit_values(crop, "crop", ("x", "y", "width", "height"), "crop").items()}
        if min(box.values()) < 0:
            raise VideoError(f"crop: x, y, width and height must be 0 or more, found {box}")
        if not any(box.values()):
            return preview(ctx, video)
        return preview(ctx, cropped(video, box["x"], box["y"], box["width"], box["height"]))


def joined_audio(parts: list[VideoComponents]) -> dict[str, Any] | None:
    """The segments' audio end to end (silence for a segment without), or None if none has audio."""
    tracks = [p.audio for p in parts if p.audio is not None]
    if not tracks:
        return None
    rate = int(tracks[0]["sample_rate"])
    channels = max(int(t["waveform"].shape[1]) for t in tracks)
    pieces = []
    for p in parts:
        samples = round(p.images.shape[0] * rate / float(p.frame_rate))
        wave = p.audio["waveform"] if p.audio is not None else torch.zeros(1, channels, samples)
        if p.audio is not None and int(p.audio["sample_rate"]) != rate:
            raise VideoError(
                f"videos: audio sample rates differ ({p.audio['sample_rate']} and {rate} Hz); "
                "give the segments one rate, or pass complete_audio"
            )
        pieces.append(wave.expand(-1, channels, -1) if wave.shape[1] == 1 else wave)
    return {"waveform": torch.cat(pieces, dim=-1), "sample_rate": rate}


class ConcatenateVideo(Node):
    SCHEMA = NodeSchema(
        node_id="ConcatenateVideo",
        display_name="ConcatenateVideo",
        category="video",
        description="Join video segments end to end, in slot order; an optional soundtrack replaces their audio.",
        inputs=(
            *(
                Input(f"videos.video_{i}", VIDEO, f"Segment #{i}.", optional=i > 1)
                for i in range(1, CONCAT_SLOTS + 1)
            ),
            Input(
                "codec",
                COMBO,
                "Codec used to encode video tensors. Auto uses H.264.",
                options=CODECS,
                default="auto",
            ),
            Input(
                "complete_audio",
                AUDIO,
                "Optional complete soundtrack for the concatenated video. Overrides audio carried by the input videos.",
                optional=True,
            ),
        ),
        outputs=(Output("VIDEO", VIDEO, "The concatenated video."),),
    )

    def run(self, ctx: NodeContext, *, codec: str, complete_audio: Any = None, **videos: Any) -> tuple[Video]:
        segments = [
            as_video(videos[f"videos.video_{i}"], "ConcatenateVideo")
            for i in range(1, CONCAT_SLOTS + 1)
            if videos.get(f"videos.video_{i}") is not None
        ]
        if codec not in CODECS:
            raise VideoError(f"codec: {codec!r} is not offered; choose one of {', '.join(CODECS)}")
        if not segments:
            raise VideoError("videos: connect at least one VIDEO to videos.video_1")
        parts = [s.get_components() for s in segments]
        size, rate = parts[0].images.shape[1:], Fraction(parts[0].frame_rate)
        for i, p in enumerate(parts[1:], start=2):
            if p.images.shape[1:] != size or Fraction(p.frame_rate) != rate:
                raise VideoError(
                    f"videos.video_{i}: {p.images.shape[2]}x{p.images.shape[1]} at {float(p.frame_rate):g} fps, but "
                    f"video_1 is {size[1]}x{size[0]} at {float(rate):g} fps; resize or resample the segments to match"
                )
        audio = complete_audio if complete_audio is not None else joined_audio(parts)
        images = torch.cat([p.images for p in parts])
        return (VideoFromComponents(VideoComponents(images, rate, audio)),)


class VideoEditDef(NativeNodeDef):
    """VIDEO_EDIT inputs may be constants: the node checks them (:func:`edit_values`)."""

    self_validated = frozenset({"trim", "crop"})


NODES = [VideoEditDef(VideoTrim), VideoEditDef(VideoCrop), ConcatenateVideo]
