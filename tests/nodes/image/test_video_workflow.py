"""A video workflow through the executor: EmptyImage → CreateVideo → Video Slice → SaveVideo, then
LoadVideo → VideoFrameSample → GetVideoComponents → SaveImage. Validation accepts the VIDEO links,
the saved video is reported as ComfyUI reports it, and the second run reads it back."""

from __future__ import annotations

import json
import os
from pathlib import Path

from engine.cache import OutputCache
from engine.context import Folders
from engine.executor import Executor, RunRequest
from engine.registry import NodeRegistry
from nodes import register_core


def test_video_workflow_runs_and_reports_the_saved_video(tmp_path: Path) -> None:
    folders = Folders(tmp_path / "input", tmp_path / "output", tmp_path / "temp")
    folders.ensure()
    registry = NodeRegistry()
    register_core(registry, None, folders.input_dir, folders.output_dir)
    executor = Executor(registry, OutputCache(1 << 28), folders)
    make = {
        "1": {
            "class_type": "EmptyImage",
            "inputs": {"width": 32, "height": 32, "batch_size": 6, "color": 0x336699},
        },
        "2": {"class_type": "CreateVideo", "inputs": {"images": ["1", 0], "fps": 12.0}},
        "3": {
            "class_type": "Video Slice",
            "inputs": {"video": ["2", 0], "start_time": 0.0, "duration": 0.25, "strict_duration": False},
        },
        "4": {
            "class_type": "SaveVideo",
            "inputs": {
                "video": ["3", 0],
                "filename_prefix": "video/ComfyUI",
                "format": "auto",
                "codec": "auto",
            },
        },
    }
    result = executor.run(RunRequest(prompt=make))
    assert result.status == "success", (result.node_errors, result.error)
    assert result.outputs["4"] == {  # ComfyUI's history shape for a video (ui.PreviewVideo)
        "images": [{"filename": "ComfyUI_00001_.mp4", "subfolder": "video", "type": "output"}],
        "animated": [True],
    }
    os.replace(folders.output_dir / "video" / "ComfyUI_00001_.mp4", folders.input_dir / "clip.mp4")

    read = {
        "1": {"class_type": "LoadVideo", "inputs": {"file": "clip.mp4"}},
        "2": {
            "class_type": "VideoFrameSample",
            "inputs": {"video": ["1", 0], "num_frames": 2, "strategy": "head", "seed": 0},
        },
        "3": {"class_type": "GetVideoComponents", "inputs": {"video": ["2", 0]}},
        "4": {"class_type": "SaveImage", "inputs": {"images": ["3", 0], "filename_prefix": "frame"}},
    }
    result = executor.run(RunRequest(prompt=read))
    assert result.status == "success", (result.node_errors, result.error)
    assert len(result.outputs["4"]["images"]) == 2  # 3 frames were saved (0.25 s at 12 fps), 2 sampled
    assert json.loads(json.dumps(registry.object_info("LoadVideo")))["LoadVideo"]["input"]["required"][
        "file"
    ][0] == ["clip.mp4"]
