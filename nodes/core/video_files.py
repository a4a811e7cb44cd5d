"""Video files through PyAV (``av``), the library ComfyUI uses: probe, decode, encode, remux.

What ComfyUI writes, written the same way (``comfy_api/latest/_input_impl/video_types.py``,
``comfy_extras/nodes_video.py``):

    MP4   H.264 (yuv420p) + AAC audio; ``movflags=use_metadata_tags`` so each metadata item (``prompt``,
          ``workflow``, ...) is a JSON string container tag; frame rate rounded to 1/1000
    WebM  VP9 (yuv420p) or AV1 (libsvtav1, yuv420p10le, preset 6), ``crf`` option, bit rate 0;
          the same JSON tags

Every file is written under a temporary name in its folder and renamed when complete, so a failed
encode leaves nothing half-written behind.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import torch

VIDEO_EXTENSIONS = (".mp4", ".m4v", ".mov", ".webm", ".mkv", ".avi", ".mpg", ".mpeg", ".ogv", ".flv", ".3gp")
CONTAINERS = ("auto", "mp4")  # SaveVideo's formats (ComfyUI's VideoContainer)
CODECS = ("auto", "h264")  # SaveVideo's codecs (ComfyUI's VideoCodec)
WEBM_CODECS = {"vp9": "libvpx-vp9", "av1": "libsvtav1"}


class VideoError(ValueError):
    """A video file or value a node cannot use; the message says how to fix it."""


@dataclass(frozen=True)
class VideoInfo:
    """What a file's header says: (width, height), frame count, frame rate, container and codec names."""

    size: tuple[int, int]
    frames: int
    frame_rate: Fraction
    container: str
    codec: str


def _av() -> Any:
    try:
        import av  # lazy: PyAV loads FFmpeg's libraries (~100 ms); only video nodes need it
    except ImportError as exc:
        raise VideoError("video files need PyAV: pip install 'av>=14'") from exc
    return av


@contextmanager
def _opened(path: Path) -> Iterator[Any]:
    """``path`` opened for reading, or a teaching error when it is not a video PyAV can read."""
    av = _av()
    try:
        container = av.open(str(path), mode="r")
    except (av.error.FFmpegError, OSError) as exc:
        raise VideoError(
            f"{path.name!r} is not a video file PyAV can read ({exc}); use an MP4, WebM, MKV or MOV file"
        ) from exc
    try:
        if not container.streams.video:
            raise VideoError(f"{path.name!r} has no video stream (audio only?); load a file with video in it")
        yield container
    finally:
        container.close()


def probe(path: Path, *, count_frames: bool = False) -> VideoInfo:
    """The header of the video file at ``path``. ``frames`` is the header's count (0 when it has none,
    as WebM); ``count_frames`` decodes the file to count them in that case."""
    with _opened(path) as container:
        stream = container.streams.video[0]
        frames = int(stream.frames or 0)
        if frames == 0 and count_frames:
            frames = sum(1 for _ in _decoded(container, path))
        rate = Fraction(stream.average_rate) if stream.average_rate else Fraction(1)
        size = (int(stream.width), int(stream.height))
        return VideoInfo(size, frames, rate, container.format.name, stream.codec_context.name)


def _decoded(container: Any, path: Path) -> Iterator[Any]:
    av = _av()
    try:
        yield from container.decode(video=0)
    except av.error.FFmpegError as exc:
        raise VideoError(
            f"{path.name!r} is damaged or truncated ({exc}); upload the whole file again"
        ) from exc


def read_video(path: Path) -> tuple[torch.Tensor, Fraction, dict[str, Any] | None, dict[str, str]]:
    """Decode a whole file: frames [T, H, W, 3] in 0..1, frame rate, audio (ComfyUI's AUDIO dict or
    None) and the container's metadata tags."""
    with _opened(path) as container:
        frames = [torch.from_numpy(f.to_ndarray(format="rgb24")) for f in _decoded(container, path)]
        if not frames:
            raise VideoError(f"{path.name!r} has a video stream without frames; load another file")
        images = torch.stack(frames).float() / 255.0  # [T, H, W, 3]
        stream = container.streams.video[0]
        rate = Fraction(stream.average_rate) if stream.average_rate else Fraction(1)
        audio = None
        if container.streams.audio:
            container.seek(0)
            audio_stream = container.streams.audio[0]
            chunks = [f.to_ndarray() for p in container.demux(audio_stream) for f in p.decode()]
            if chunks:
                waveform = np.concatenate([_planar(c, audio_stream) for c in chunks], axis=1)
                audio = {
                    "waveform": torch.from_numpy(waveform).float().unsqueeze(0),  # [1, C, S]
                    "sample_rate": int(audio_stream.sample_rate or 1),
                }
        return images, rate, audio, dict(container.metadata)


def _planar(chunk: np.ndarray, stream: Any) -> np.ndarray:
    """An audio frame's samples as [C, S] whatever the sample layout (packed formats come [1, S*C])."""
    channels = stream.codec_context.layout.nb_channels
    if chunk.shape[0] == channels:
        return chunk
    return chunk.reshape(-1, channels).T


def check_format(format: str, codec: str) -> None:
    """SaveVideo's format/codec choice, or the error ComfyUI gives for the rest."""
    if format not in CONTAINERS:
        raise VideoError(f"format {format!r} is not offered; choose one of {', '.join(CONTAINERS)}")
    if codec not in CODECS:
        raise VideoError(f"codec {codec!r} is not offered; choose one of {', '.join(CODECS)}")


def _tags(metadata: Any) -> dict[str, str]:
    """Metadata items as container tags: strings as they are, everything else as JSON."""
    if not metadata:
        return {}
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in metadata.items()}


def _frames_uint8(images: torch.Tensor, channels: int = 3) -> np.ndarray:
    return (
        (images[..., :channels] * 255).clamp(0, 255).to(torch.uint8).cpu().numpy()
    )  # truncating, as ComfyUI


def _encoder(codec: str) -> None:
    av = _av()
    if codec not in av.codecs_available:
        raise VideoError(
            f"this machine's PyAV has no {codec!r} encoder; install a PyAV wheel built with it "
            "(pip install --force-reinstall 'av>=14') or choose another codec"
        )


def write_atomic_video(path: Path, write: Callable[[Path], None]) -> None:
    """Run ``write(temporary path)`` and move the finished file to ``path``; nothing stays on failure."""
    av = _av()
    partial = path.with_name(f".{path.stem}.partial{path.suffix}")
    try:
        write(partial)
        os.replace(partial, path)
    except av.error.FFmpegError as exc:
        raise VideoError(f"encoding {path.name!r} failed ({exc}); check the frame size and codec") from exc
    finally:
        partial.unlink(missing_ok=True)


def write_mp4(path: Path, parts: Any, metadata: Any, *, format: str = "auto", codec: str = "auto") -> None:
    """``parts`` (VideoComponents) as MP4/H.264 (+ AAC audio) at ``path``, the metadata as JSON tags."""
    check_format(format, codec)
    _encoder("h264")
    images = parts.images
    if images.ndim != 4 or images.shape[0] == 0:
        raise VideoError(f"a video needs frames [T, H, W, 3] with T >= 1; got shape {tuple(images.shape)}")
    height, width = int(images.shape[1]), int(images.shape[2])
    if width % 2 or height % 2:
        raise VideoError(
            f"H.264 (yuv420p) needs an even width and height; the frames are {width}x{height}. "
            "Crop or scale them to even sides (e.g. ImageScale) first"
        )
    av = _av()

    def write(target: Path) -> None:
        with av.open(str(target), mode="w", format="mp4", options={"movflags": "use_metadata_tags"}) as out:
            out.metadata.update(_tags(metadata))
            rate = Fraction(round(parts.frame_rate * 1000), 1000)
            stream = out.add_stream("h264", rate=rate)
            stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
            audio = parts.audio
            audio_stream = out.add_stream("aac", rate=int(audio["sample_rate"])) if audio else None
            for pixels in _frames_uint8(images):
                frame = av.VideoFrame.from_ndarray(pixels, format="rgb24").reformat(format="yuv420p")
                out.mux(stream.encode(frame))
            out.mux(stream.encode(None))
            if audio_stream is not None and audio is not None:
                _mux_audio(out, audio_stream, audio, math.ceil(audio["sample_rate"] / rate * images.shape[0]))

    write_atomic_video(Path(path), write)


def _mux_audio(out: Any, stream: Any, audio: dict[str, Any], samples: int) -> None:
    av = _av()
    waveform = audio["waveform"][:, :, :samples]  # [1, C, S], cut to the video's length
    layout = "mono" if waveform.shape[1] == 1 else "stereo"
    packed = waveform[:, :2].movedim(2, 1).reshape(1, -1).float().cpu().numpy()
    frame = av.AudioFrame.from_ndarray(packed, format="flt", layout=layout)
    frame.sample_rate, frame.pts = int(audio["sample_rate"]), 0
    out.mux(stream.encode(frame))
    out.mux(stream.encode(None))


def remux(source: Path, path: Path, metadata: Any) -> None:
    """Copy ``source``'s streams into a new MP4 at ``path`` without re-encoding; its tags are kept
    except those ``metadata`` replaces (ComfyUI's save of a loaded video)."""
    av = _av()
    tags = _tags(metadata)

    def write(target: Path) -> None:
        with _opened(source) as src:
            options = {"movflags": "use_metadata_tags"}
            with av.open(str(target), mode="w", format="mp4", options=options) as out:
                out.metadata.update({k: v for k, v in src.metadata.items() if k not in tags})
                out.metadata.update(tags)
                streams = {
                    s: out.add_stream_from_template(s) for s in (*src.streams.video, *src.streams.audio)
                }
                for packet in src.demux(*streams):
                    if packet.dts is not None:
                        packet.stream = streams[packet.stream]
                        out.mux(packet)

    write_atomic_video(Path(path), write)


def write_webm(path: Path, images: torch.Tensor, codec: str, fps: float, crf: float, metadata: Any) -> None:
    """SaveWEBM's file: VP9 or AV1 in WebM at ``fps``, constant quality ``crf``, the metadata as tags."""
    if codec not in WEBM_CODECS:
        raise VideoError(f"codec {codec!r} is not offered; choose one of {', '.join(WEBM_CODECS)}")
    _encoder(WEBM_CODECS[codec])
    av = _av()

    def write(target: Path) -> None:
        with av.open(str(target), mode="w", format="webm") as out:
            out.metadata.update(_tags(metadata))
            stream = out.add_stream(WEBM_CODECS[codec], rate=Fraction(round(fps * 1000), 1000))
            stream.width, stream.height = int(images.shape[-2]), int(images.shape[-3])
            stream.pix_fmt = "yuv420p10le" if codec == "av1" else "yuv420p"
            stream.bit_rate = 0
            stream.options = {"crf": str(crf), **({"preset": "6"} if codec == "av1" else {})}
            for pixels in _frames_uint8(images):
                out.mux(stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")))
            out.mux(stream.encode(None))

    write_atomic_video(Path(path), write)
