"""ComfyUI's VIDEO value: frames, audio and a frame rate, from a file (read lazily) or from components.

A VIDEO flows along links like an IMAGE; nodes ask it for what they need. The two kinds match
ComfyUI's ``VideoFromFile`` / ``VideoFromComponents`` (``comfy_api/latest/_input_impl/video_types.py``):

    VideoFromFile(path)          nothing is decoded until a node asks for components (or the size)
    VideoFromComponents(parts)   IMAGE frames [T, H, W, 3] in 0..1, AUDIO {"waveform" [1, C, S],
                                 "sample_rate"}, the frame rate as a Fraction

Values are immutable: trimming or sampling frames returns a new VIDEO. The file reading and writing
(PyAV) lives in :mod:`nodes.core.video_files`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from fractions import Fraction
from pathlib import Path
from typing import Any

import torch

from nodes.core import video_files
from nodes.core.video_files import VideoError

VIDEO = "VIDEO"
AUDIO = "AUDIO"

FRAME_STRATEGIES = ("uniform", "head", "tail", "random")


@dataclass(frozen=True)
class VideoComponents:
    """The parts of a video: ``images`` [T, H, W, 3] in 0..1, ``frame_rate`` (frames per second), the
    optional ``audio`` (ComfyUI's AUDIO dict) and, for a file, its container ``metadata``."""

    images: torch.Tensor
    frame_rate: Fraction
    audio: dict[str, Any] | None = None
    metadata: dict[str, str] | None = None


class Video:
    """A VIDEO value. Subclasses give :meth:`get_components`; the rest is derived from it."""

    def get_components(self) -> VideoComponents:
        raise NotImplementedError

    def get_dimensions(self) -> tuple[int, int]:
        """(width, height) in pixels."""
        images = self.get_components().images
        return int(images.shape[2]), int(images.shape[1])

    def get_frame_count(self) -> int:
        return int(self.get_components().images.shape[0])

    def get_frame_rate(self) -> Fraction:
        return self.get_components().frame_rate

    def get_duration(self) -> float:
        """Seconds: frames over the frame rate."""
        return self.get_frame_count() / float(self.get_frame_rate())

    def save_to(self, path: Path, format: str = "auto", codec: str = "auto", metadata: Any = None) -> None:
        """Write an MP4 (H.264, AAC audio) with ``metadata`` (a dict) as JSON container tags."""
        video_files.write_mp4(path, self.get_components(), metadata, format=format, codec=codec)

    def cache_size_bytes(self) -> int:
        return 64

    def as_trimmed(self, start_time: float, duration: float, strict_duration: bool = False) -> Video | None:
        """ComfyUI's ``as_trimmed``: ``duration`` seconds from ``start_time`` (negative counts from the
        end; ``duration`` 0 runs to the end). None when the window is empty, or when
        ``strict_duration`` and the video is shorter than asked."""
        parts = self.get_components()
        fps = float(parts.frame_rate)
        total = int(parts.images.shape[0])
        start = round(start_time * fps)
        if start < 0:
            start = max(0, total + start)
        if start >= total:
            return None
        available = total - start
        wanted = round(duration * fps) if duration > 0 else available
        if strict_duration and wanted > available:
            return None
        return self.as_frames(range(start, start + min(wanted, available)))

    def as_frames(self, indices: range | list[int]) -> Video:
        """A video of the frames at ``indices`` (in order); the audio keeps the span they cover."""
        parts = self.get_components()
        picked = list(indices)
        audio = parts.audio
        if audio is not None and picked:
            rate = int(audio["sample_rate"])
            first = round(picked[0] * rate / float(parts.frame_rate))
            last = round((picked[-1] + 1) * rate / float(parts.frame_rate))
            audio = {**audio, "waveform": audio["waveform"][..., first:last]}
        return VideoFromComponents(replace(parts, images=parts.images[picked], audio=audio, metadata=None))


class VideoFromFile(Video):
    """A video file; decoded (once per call) only when a node asks for its frames."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def get_components(self) -> VideoComponents:
        images, frame_rate, audio, metadata = video_files.read_video(self.path)
        return VideoComponents(images, frame_rate, audio, metadata)

    def get_dimensions(self) -> tuple[int, int]:
        return video_files.probe(self.path).size

    def get_frame_count(self) -> int:
        return video_files.probe(self.path, count_frames=True).frames

    def get_frame_rate(self) -> Fraction:
        return video_files.probe(self.path).frame_rate

    def get_container_format(self) -> str:
        return video_files.probe(self.path).container

    def save_to(self, path: Path, format: str = "auto", codec: str = "auto", metadata: Any = None) -> None:
        """An MP4/H.264 file is copied stream by stream (no re-encode) with the metadata replaced, as
        ComfyUI does; any other file is decoded and encoded as MP4/H.264."""
        info = video_files.probe(self.path)
        if "mp4" in info.container.split(",") and info.codec == "h264":
            video_files.check_format(format, codec)
            video_files.remux(self.path, path, metadata)
        else:
            super().save_to(path, format, codec, metadata)


class VideoFromComponents(Video):
    """A video made of frames in memory (CreateVideo, or a trimmed/sampled video)."""

    def __init__(self, components: VideoComponents) -> None:
        self.components = components

    def get_components(self) -> VideoComponents:
        return self.components

    def cache_size_bytes(self) -> int:
        audio = self.components.audio
        waveform = audio["waveform"] if audio else None
        extra = waveform.element_size() * waveform.numel() if isinstance(waveform, torch.Tensor) else 0
        images = self.components.images
        return 64 + images.element_size() * images.numel() + extra


def sample_frame_indices(total: int, num_frames: int, strategy: str, seed: int) -> list[int]:
    """VideoFrameSample's choice of ``num_frames`` of ``total`` frames (clamped to ``total``)."""
    count = min(num_frames, total)
    if strategy == "head":
        return list(range(count))
    if strategy == "tail":
        return list(range(total - count, total))
    if strategy == "uniform":
        if count == 1:
            return [total // 2]  # the middle frame
        return [round(i * (total - 1) / (count - 1)) for i in range(count)]
    if strategy == "random":
        return sorted(random.Random(seed).sample(range(total), count))
    raise VideoError(f"strategy must be one of {', '.join(FRAME_STRATEGIES)}; got {strategy!r}")


def as_video(value: Any, node: str) -> Video:
    """``value`` as a VIDEO, or a teaching error naming ``node``."""
    if isinstance(value, Video):
        return value
    raise VideoError(
        f"{node} expected a VIDEO (from LoadVideo or CreateVideo); got {type(value).__name__}. "
        "Connect a VIDEO output, or turn IMAGE frames into one with CreateVideo."
    )
