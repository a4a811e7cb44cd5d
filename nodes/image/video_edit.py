"""Video utility nodes of today's ComfyUI that need no model: ``Video Slice`` (shown as "Trim Video"),
``VideoFrameSample``, ``VideoTemporalCrop``, ``VideoRandomTemporalCrop`` (names, inputs, ranges and
semantics from ComfyUI's ``comfy_extras/nodes_video.py`` and its node documentation).

Each returns a new VIDEO; the input video is never changed.
"""

from __future__ import annotations

import random
from typing import Any

from engine.context import NodeContext
from engine.node import Node
from engine.schema import BOOLEAN, COMBO, FLOAT, INT, Input, NodeSchema, Output
from nodes.core.video import FRAME_STRATEGIES, VIDEO, as_video, sample_frame_indices
from nodes.core.video_files import VideoError

MAX_SEED = 0xFFFFFFFFFFFFFFFF
MAX_FRAMES = 99999


class VideoSlice(Node):
    SCHEMA = NodeSchema(
        node_id="Video Slice",
        display_name="Trim Video",
        category="image/video",
        description="Keep `duration` seconds of a video from `start_time` (negative: from the end).",
        inputs=(
            Input("video", VIDEO, "The video to slice."),
            Input("start_time", FLOAT, "Start time in seconds", default=0.0, min=-1e5, max=1e5, step=0.001),
            Input(
                "duration",
                FLOAT,
                "Duration in seconds, or 0 for unlimited duration",
                default=0.0,
                min=0.0,
                max=1e5,
                step=0.001,
            ),
            Input(
                "strict_duration",
                BOOLEAN,
                "If True, when the specified duration is not possible, an error will be raised.",
                default=False,
            ),
        ),
        outputs=(Output("VIDEO", VIDEO, "The slice."),),
    )

    def run(
        self, ctx: NodeContext, *, video: Any, start_time: float, duration: float, strict_duration: bool
    ) -> tuple[Any]:
        video = as_video(video, "Video Slice")
        sliced = video.as_trimmed(start_time, duration, strict_duration)
        if sliced is None:
            raise VideoError(
                f"Video Slice cannot cut {duration} s from {start_time} s: the video lasts "
                f"{video.get_duration():.3f} s. Lower start_time or duration, or turn strict_duration off"
            )
        return (sliced,)


class VideoFrameSample(Node):
    SCHEMA = NodeSchema(
        node_id="VideoFrameSample",
        display_name="Sample Video Frame",
        category="image/video",
        description="Keep a fixed number of frames: evenly spaced, the first, the last, or random ones.",
        inputs=(
            Input("video", VIDEO, "Input video."),
            Input("num_frames", INT, "Number of frames to sample.", default=16, min=1, max=9999),
            Input(
                "strategy",
                COMBO,
                "uniform: evenly spaced, head: first N, tail: last N, random: random sorted",
                options=FRAME_STRATEGIES,
                default="uniform",
            ),
            Input(
                "seed",
                INT,
                "Random seed, only used with the random strategy.",
                default=0,
                min=0,
                max=MAX_SEED,
            ),
        ),
        outputs=(Output("video", VIDEO, "Sampled video."),),
    )

    def run(self, ctx: NodeContext, *, video: Any, num_frames: int, strategy: str, seed: int) -> tuple[Any]:
        video = as_video(video, "VideoFrameSample")
        indices = sample_frame_indices(video.get_frame_count(), num_frames, strategy, seed)
        return (video.as_frames(indices),)


def _temporal_crop(video: Any, start_frame: int, length: int) -> Any:
    total = video.get_frame_count()
    start = min(start_frame, total - 1)  # at most the last frame
    return video.as_frames(range(start, min(start + length, total)))


class VideoTemporalCrop(Node):
    SCHEMA = NodeSchema(
        node_id="VideoTemporalCrop",
        display_name="Crop Video (Temporal)",
        category="image/video",
        description="Keep `length` consecutive frames from `start_frame` (both clamped to the video).",
        inputs=(
            Input("video", VIDEO, "Input video."),
            Input("start_frame", INT, "Starting frame index.", default=0, min=0, max=MAX_FRAMES),
            Input("length", INT, "Number of frames to keep.", default=16, min=1, max=MAX_FRAMES),
        ),
        outputs=(Output("video", VIDEO, "Cropped video."),),
    )

    def run(self, ctx: NodeContext, *, video: Any, start_frame: int, length: int) -> tuple[Any]:
        return (_temporal_crop(as_video(video, "VideoTemporalCrop"), start_frame, length),)


class VideoRandomTemporalCrop(Node):
    SCHEMA = NodeSchema(
        node_id="VideoRandomTemporalCrop",
        display_name="Crop Video (Temporal Random)",
        category="image/video",
        description="Keep `length` consecutive frames starting at a seeded random frame.",
        inputs=(
            Input("video", VIDEO, "Input video."),
            Input(
                "length",
                INT,
                "Number of frames to keep; longer than the video keeps all of it.",
                default=16,
                min=1,
                max=MAX_FRAMES,
            ),
            Input("seed", INT, "Random seed.", default=0, min=0, max=MAX_SEED),
        ),
        outputs=(Output("video", VIDEO, "Cropped video."),),
    )

    def run(self, ctx: NodeContext, *, video: Any, length: int, seed: int) -> tuple[Any]:
        video = as_video(video, "VideoRandomTemporalCrop")
        spare = max(0, video.get_frame_count() - length)
        return (_temporal_crop(video, random.Random(seed).randint(0, spare), length),)


NODES: list[type[Node]] = [VideoSlice, VideoFrameSample, VideoTemporalCrop, VideoRandomTemporalCrop]
