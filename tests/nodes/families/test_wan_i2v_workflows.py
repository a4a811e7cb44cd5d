"""ComfyUI's Wan 2.1 image-to-video graph (UNETLoader → CLIPLoader type wan → CLIPTextEncode,
CLIPVisionLoader / CLIPVisionEncode of the start image → WanImageToVideo → KSampler → VAEDecode →
SaveImage) runs offline on the demo files (the demo i2v transformer, the demo CLIP vision model): every
frame comes out, and the start image reaches the model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from nodes.demo.vision import DEMO_CLIP_VISION
from nodes.demo.wan import DEMO_WAN_I2V
from tests.nodes.families.test_wan_workflows import HEIGHT, LENGTH, WIDTH, t2v_prompt
from tests.nodes.test_generation_e2e import make_executor, run


@pytest.fixture(scope="module")
def wan_i2v_demo(wan_demo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's Wan demo files (``make-demo-model``'s) copied beside the demo CLIP vision model."""
    import shutil

    from nodes.demo.vision import make_demo_vision_models

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("wan_i2v_demo") / "models"
    shutil.copytree(wan_demo, root)
    make_demo_vision_models(root)
    return root


def i2v_prompt(color: int) -> dict[str, Any]:
    prompt = t2v_prompt()
    prompt["1"]["inputs"]["unet_name"] = DEMO_WAN_I2V
    prompt |= {
        "11": {"class_type": "CLIPVisionLoader", "inputs": {"clip_name": DEMO_CLIP_VISION}},
        "12": {
            "class_type": "EmptyImage",
            "inputs": {"width": WIDTH, "height": HEIGHT, "batch_size": 1, "color": color},
        },
        "13": {
            "class_type": "CLIPVisionEncode",
            "inputs": {"clip_vision": ["11", 0], "image": ["12", 0], "crop": "center"},
        },
        "14": {
            "class_type": "WanImageToVideo",
            "inputs": {
                "positive": ["3", 0],
                "negative": ["4", 0],
                "vae": ["8", 0],
                "width": WIDTH,
                "height": HEIGHT,
                "length": LENGTH,
                "batch_size": 1,
                "clip_vision_output": ["13", 0],
                "start_image": ["12", 0],
            },
        },  # fmt: skip
    }
    prompt["7"]["inputs"] |= {"positive": ["14", 0], "negative": ["14", 1], "latent_image": ["14", 2]}
    return prompt


def test_wan_i2v_graph_runs_on_the_demo_files(wan_i2v_demo: Path, tmp_path: Path) -> None:
    frames = []
    for color in (0x000000, 0xFFFFFF):
        out = tmp_path / f"{color:06x}"
        result = run(make_executor(wan_i2v_demo, out), i2v_prompt(color))
        assert result.status == "success", (result.node_errors, result.error)
        images = result.outputs["10"]["images"]
        assert len(images) == LENGTH
        with Image.open(out / "output" / images[0]["subfolder"] / images[0]["filename"]) as png:
            assert png.size == (WIDTH, HEIGHT)
            frames.append(np.asarray(png).astype(np.float32))
    assert np.abs(frames[0] - frames[1]).max() > 1.0  # the start image reaches the model
