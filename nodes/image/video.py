"""Video files and values: LoadVideo, SaveVideo, CreateVideo, GetVideoComponents, SaveWEBM (ComfyUI's
names, inputs and semantics, ``comfy_extras/nodes_video.py``).

A saved video is reported as ComfyUI's ``ui.PreviewVideo`` reports it: ``{"images": [{"filename",
"subfolder", "type"}], "animated": (True,)}``, so ``/history``, the websocket and the frontend show it;
``/view`` serves the file. Names follow SaveImage's ``{prefix}_{counter:05}_.{ext}`` with sub-folders.
The workflow goes into the container's tags (``prompt`` and each extra_pnginfo item as JSON), as
ComfyUI embeds it, unless the run's settings say ``png_metadata=False``.
"""

from __future__ import annotations

import os
from fractions import Fraction
from pathlib import Path
from typing import Any

import torch

from engine.context import Folders, NodeContext
from engine.node import Node, NodeOutput
from engine.registry import NodeRegistry
from engine.schema import (
    COMBO,
    FLOAT,
    HIDDEN_EXTRA_PNGINFO,
    HIDDEN_PROMPT,
    IMAGE,
    STRING,
    DynamicOptions,
    Input,
    NodeSchema,
    Output,
)
from nodes.core.options import OptionSources
from nodes.core.video import AUDIO, VIDEO, VideoComponents, VideoFromComponents, VideoFromFile, as_video
from nodes.core.video_files import CODECS, CONTAINERS, VIDEO_EXTENSIONS, VideoError, write_webm
from nodes.image.load_save import ImageError, input_path, save_path


def list_input_videos(input_dir: Path) -> list[str]:
    """Video files directly in the input folder, sorted (LoadVideo's choices, as ComfyUI lists them)."""
    if not input_dir.is_dir():
        return []
    return sorted(p.name for p in input_dir.iterdir() if p.is_file() and p.suffix.lower() in VIDEO_EXTENSIONS)


def video_metadata(ctx: NodeContext, prompt: Any, extra_pnginfo: Any) -> dict[str, Any] | None:
    """SaveVideo's metadata: the extra_pnginfo items, then ``prompt``; None when empty or turned off."""
    if not ctx.settings.png_metadata:
        return None
    metadata: dict[str, Any] = dict(extra_pnginfo or {})
    if prompt is not None:
        metadata["prompt"] = prompt
    return metadata or None


def saved_video(ctx: NodeContext, folder: Path, name: str, sub: str) -> NodeOutput:
    """The UI entry of a written video (ComfyUI's PreviewVideo); its bytes kept when the run asked."""
    entry = {"filename": name, "subfolder": sub, "type": "output"}
    if ctx.kept_images is not None:
        ctx.kept_images.add(ctx.node_id, entry, (folder / name).read_bytes(), on_disk=True)
    return NodeOutput(ui={"images": [entry], "animated": (True,)})


class LoadVideo(Node):
    SCHEMA = NodeSchema(
        node_id="LoadVideo",
        display_name="Load Video",
        category="image/video",
        description="Load a video from the input folder (read lazily: frames are decoded when a node needs them).",
        inputs=(
            Input(
                "file",
                COMBO,
                "A video file in the input folder (or upload one).",
                options=DynamicOptions("input_videos"),
                extra={"video_upload": True},
            ),
        ),
        outputs=(Output("VIDEO", VIDEO, "The video."),),
    )

    @classmethod
    def fingerprint(cls, folders: Folders, **inputs: Any) -> Any:
        try:  # the modification time, as ComfyUI (no hash of a large file)
            return os.path.getmtime(input_path(folders, str(inputs.get("file", ""))))
        except (OSError, ImageError):
            return "missing"  # the run reports the problem

    def run(self, ctx: NodeContext, *, file: str) -> tuple[Any]:
        try:
            path = input_path(ctx.folders, file)
        except ImageError as exc:
            raise VideoError(str(exc).replace("image", "video", 1)) from exc
        if not path.is_file():
            raise VideoError(
                f"video {file!r} not found in the input folder ({path.parent}); "
                "upload it (POST /upload/image) or copy it there"
            )
        video = VideoFromFile(path)
        video.get_dimensions()  # a file that is not a video fails here, naming the file
        return (video,)


class SaveVideo(Node):
    SCHEMA = NodeSchema(
        node_id="SaveVideo",
        display_name="Save Video",
        category="image/video",
        description="Saves the input images to your ComfyUI output directory.",
        inputs=(
            Input("video", VIDEO, "The video to save."),
            Input(
                "filename_prefix",
                STRING,
                "The prefix for the file to save; may contain sub-folders.",
                default="video/ComfyUI",
            ),
            Input("format", COMBO, "The format to save the video as.", options=CONTAINERS, default="auto"),
            Input("codec", COMBO, "The codec to use for the video.", options=CODECS, default="auto"),
        ),
        hidden=(HIDDEN_PROMPT, HIDDEN_EXTRA_PNGINFO),
        output_node=True,
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        video: Any,
        filename_prefix: str,
        format: str,
        codec: str,
        prompt: Any = None,
        extra_pnginfo: Any = None,
    ) -> NodeOutput:
        video = as_video(video, "SaveVideo")
        folder, stem, sub, counter = save_path(ctx.folders.output_dir, filename_prefix)
        name = f"{stem}_{counter:05}_.mp4"
        video.save_to(folder / name, format, codec, video_metadata(ctx, prompt, extra_pnginfo))
        return saved_video(ctx, folder, name, sub)


class CreateVideo(Node):
    SCHEMA = NodeSchema(
        node_id="CreateVideo",
        display_name="Create Video",
        category="image/video",
        description="Create a video from images.",
        inputs=(
            Input("images", IMAGE, "The images to create a video from."),
            Input("fps", FLOAT, "Frames per second.", default=30.0, min=1.0, max=120.0, step=1.0),
            Input("audio", AUDIO, "The audio to add to the video.", optional=True),
        ),
        outputs=(Output("VIDEO", VIDEO, "The video."),),
    )

    def run(self, ctx: NodeContext, *, images: torch.Tensor, fps: float, audio: Any = None) -> tuple[Any]:
        if not isinstance(images, torch.Tensor) or images.ndim != 4:
            raise VideoError(
                "CreateVideo expected IMAGE frames [T, H, W, C]; got "
                f"{getattr(images, 'shape', type(images).__name__)}. Connect an IMAGE batch."
            )
        return (VideoFromComponents(VideoComponents(images, Fraction(fps), audio)),)


class GetVideoComponents(Node):
    SCHEMA = NodeSchema(
        node_id="GetVideoComponents",
        display_name="Get Video Components",
        category="image/video",
        description="Extracts all components from a video: frames, audio, and framerate.",
        inputs=(Input("video", VIDEO, "The video to extract components from."),),
        outputs=(
            Output("images", IMAGE, "The frames [T, H, W, 3] in 0..1."),
            Output("audio", AUDIO, "The audio (None when the video has none)."),
            Output("fps", FLOAT, "Frames per second."),
        ),
    )

    def run(self, ctx: NodeContext, *, video: Any) -> tuple[Any, ...]:
        parts = as_video(video, "GetVideoComponents").get_components()
        return (parts.images, parts.audio, float(parts.frame_rate))


class SaveWEBM(Node):
    SCHEMA = NodeSchema(
        node_id="SaveWEBM",
        display_name="SaveWEBM",
        category="image/video",
        description="Save the frames as a WebM video (VP9 or AV1) in the output folder, with the workflow.",
        inputs=(
            Input("images", IMAGE, "The frames, in order."),
            Input("filename_prefix", STRING, "File name prefix; may contain sub-folders.", default="ComfyUI"),
            Input("codec", COMBO, "The video codec.", options=("vp9", "av1")),
            Input("fps", FLOAT, "Frames per second.", default=24.0, min=0.01, max=1000.0, step=0.01),
            Input(
                "crf",
                FLOAT,
                "Higher crf means lower quality with a smaller file size, lower crf means higher quality "
                "higher filesize.",
                default=32.0,
                min=0,
                max=63.0,
                step=1,
            ),
        ),
        hidden=(HIDDEN_PROMPT, HIDDEN_EXTRA_PNGINFO),
        output_node=True,
        experimental=True,
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        images: torch.Tensor,
        filename_prefix: str,
        codec: str,
        fps: float,
        crf: float,
        prompt: Any = None,
        extra_pnginfo: Any = None,
    ) -> NodeOutput:
        folder, stem, sub, counter = save_path(ctx.folders.output_dir, filename_prefix)
        name = f"{stem}_{counter:05}_.webm"
        metadata: dict[str, Any] = {}
        if ctx.settings.png_metadata:  # ComfyUI: prompt first, then each extra_pnginfo item
            if prompt is not None:
                metadata["prompt"] = prompt
            metadata.update(extra_pnginfo or {})
        write_webm(folder / name, images, codec, fps, crf, metadata)
        return saved_video(ctx, folder, name, sub)


NODES: list[type[Node]] = [SaveWEBM, SaveVideo, CreateVideo, GetVideoComponents, LoadVideo]


def register_options(registry: NodeRegistry, sources: OptionSources) -> None:
    """LoadVideo's choices, when the input folder is known."""
    if sources.input_dir is not None:
        input_dir = Path(sources.input_dir)
        registry.add_options_source("input_videos", lambda: list_input_videos(input_dir))
