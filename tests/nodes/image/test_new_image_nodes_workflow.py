"""The new image nodes inside the executor: list outputs fan out and list inputs gather
(SplitImageToTileList → AdjustBrightness per tile → ImageMergeTileList), a BOUNDING_BOX from
PrimitiveBoundingBox and a constant one feed ImageCropV2, and PadImageNode's dotted DynamicCombo
inputs and COLOR constant validate and run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from engine.cache import OutputCache
from engine.context import Folders
from engine.executor import Executor, RunRequest
from engine.registry import NodeRegistry
from nodes.image import bbox, dataset_images, pad, tiles
from nodes.image.load_save import EmptyImage, SaveImage


def _saved(folders: Folders, result: Any, node: str) -> np.ndarray:
    entry = result.outputs[node]["images"][0]
    return np.array(Image.open(folders.output_dir / entry["subfolder"] / entry["filename"]))


def test_tiles_boxes_and_padding_run_through_the_executor(tmp_path: Path) -> None:
    folders = Folders(tmp_path / "input", tmp_path / "output", tmp_path / "temp")
    folders.ensure()
    registry = NodeRegistry()
    registry.register_all(
        [EmptyImage, SaveImage, *tiles.NODES, *dataset_images.NODES, *bbox.NODES, *pad.NODES]
    )
    executor = Executor(registry, OutputCache(1 << 28), folders)
    prompt = {
        "1": {
            "class_type": "EmptyImage",
            "inputs": {"width": 160, "height": 96, "batch_size": 1, "color": 0x404040},
        },
        "2": {
            "class_type": "SplitImageToTileList",
            "inputs": {"image": ["1", 0], "tile_width": 64, "tile_height": 64, "overlap": 16},
        },
        "3": {"class_type": "AdjustBrightness", "inputs": {"images": ["2", 0], "factor": 2.0}},
        "4": {
            "class_type": "ImageMergeTileList",
            "inputs": {"image_list": ["3", 0], "final_width": 160, "final_height": 96, "overlap": 16},
        },
        "5": {"class_type": "PrimitiveBoundingBox", "inputs": {"x": 8, "y": 4, "width": 100, "height": 50}},
        "6": {"class_type": "ImageCropV2", "inputs": {"image": ["4", 0], "crop_region": ["5", 0]}},
        "7": {
            "class_type": "PadImageNode",
            "inputs": {
                "image": ["6", 0],
                "padding_type": "pad to multiple",
                "padding_type.multiple": 32,
                "padding_style": "color",
                "padding_style.color": "#ff0000",
                "padding_style.feathering": 0,
            },
        },
        "8": {"class_type": "SaveImage", "inputs": {"images": ["7", 0], "filename_prefix": "out"}},
        "9": {
            "class_type": "ImageCropV2",
            "inputs": {"image": ["1", 0], "crop_region": {"x": 150, "y": 0, "width": 30, "height": 10}},
        },
        "10": {"class_type": "SaveImage", "inputs": {"images": ["9", 0], "filename_prefix": "crop"}},
        "11": {
            "class_type": "ImageDeduplication",
            "inputs": {"images": ["3", 0], "similarity_threshold": 0.95},
        },
        "12": {
            "class_type": "ImageGrid",
            "inputs": {"images": ["2", 0], "columns": 3, "cell_width": 32, "cell_height": 32, "padding": 2},
        },
        "13": {"class_type": "SaveImage", "inputs": {"images": ["12", 0], "filename_prefix": "grid"}},
        "14": {"class_type": "SaveImage", "inputs": {"images": ["11", 0], "filename_prefix": "unique"}},
    }
    result = executor.run(RunRequest(prompt=prompt))
    assert result.status == "success", (result.node_errors, result.error)
    padded = _saved(folders, result, "8")
    assert padded.shape == (64, 128, 3)  # 100 x 50 padded to multiples of 32: 14 + 14 wide, 7 + 7 tall
    assert tuple(padded[0, 0]) == (255, 0, 0) and tuple(padded[32, 64]) == (128, 128, 128)  # 0x40 * 2
    assert _saved(folders, result, "10").shape == (10, 10, 3)  # cut at the right edge
    assert _saved(folders, result, "13").shape == (2 * 32 + 2, 3 * 32 + 2 * 2, 3)  # 6 tiles: 3 x 2 cells
    assert len(result.outputs["14"]["images"]) == 1  # six identical flat tiles: one is kept
