"""ComfyUI's Wan 2.1 text-to-video graph (UNETLoader → CLIPLoader type wan → CLIPTextEncode →
EmptyHunyuanLatentVideo → ModelSamplingSD3 → KSampler → VAELoader / VAEDecode → SaveImage) runs
offline on the demo files that ``make-demo-model`` writes: every frame comes out, at the latent's size;
the UNETLoader's model is the Wan 2.1 family with its umT5 text encoder. The shipped example
(``web/workflows/wan21_t2v.api.json``: that graph, saved as one animated WebP, which the editor shows)
writes every frame. The image-to-video graph is ``test_wan_i2v_workflows``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from nodes.demo.umt5 import DEMO_UMT5
from nodes.demo.wan import DEMO_WAN, DEMO_WAN_I2V, DEMO_WAN_VAE
from tests.nodes.test_generation_e2e import make_executor, run

WIDTH, HEIGHT, LENGTH = 48, 32, 9
WORKFLOWS = Path(__file__).resolve().parents[3] / "web" / "workflows"


def test_make_demo_model_writes_the_four_wan_files_once(wan_demo: Path) -> None:
    from nodes.demo.wan import write_demo

    assert {p.name for p in wan_demo.rglob("*.safetensors")} == {
        DEMO_WAN,
        DEMO_WAN_I2V,
        DEMO_UMT5,
        DEMO_WAN_VAE,
    }
    assert write_demo(wan_demo) == []  # kept once written


def t2v_prompt(cfg: float = 4.0) -> dict[str, Any]:
    return {
        "1": {"class_type": "UNETLoader", "inputs": {"unet_name": DEMO_WAN, "weight_dtype": "default"}},
        "2": {
            "class_type": "CLIPLoader",
            "inputs": {"clip_name": DEMO_UMT5, "type": "wan", "device": "default"},
        },
        "3": {
            "class_type": "CLIPTextEncode",
            "inputs": {"text": "a cat walking in the garden", "clip": ["2", 0]},
        },
        "4": {"class_type": "CLIPTextEncode", "inputs": {"text": "blurry", "clip": ["2", 0]}},
        "5": {
            "class_type": "EmptyHunyuanLatentVideo",
            "inputs": {"width": WIDTH, "height": HEIGHT, "length": LENGTH, "batch_size": 1},
        },
        "6": {"class_type": "ModelSamplingSD3", "inputs": {"model": ["1", 0], "shift": 8.0}},
        "7": {
            "class_type": "KSampler",
            "inputs": {
                "model": ["6", 0],
                "seed": 3,
                "steps": 3,
                "cfg": cfg,
                "sampler_name": "uni_pc",
                "scheduler": "simple",
                "positive": ["3", 0],
                "negative": ["4", 0],
                "latent_image": ["5", 0],
                "denoise": 1.0,
            },
        },  # fmt: skip
        "8": {"class_type": "VAELoader", "inputs": {"vae_name": DEMO_WAN_VAE}},
        "9": {"class_type": "VAEDecode", "inputs": {"samples": ["7", 0], "vae": ["8", 0]}},
        "10": {"class_type": "SaveImage", "inputs": {"images": ["9", 0], "filename_prefix": "wan"}},
    }


def test_wan_t2v_graph_runs_on_the_demo_files(wan_demo: Path, tmp_path: Path) -> None:
    result = run(make_executor(wan_demo, tmp_path), t2v_prompt())
    assert result.status == "success", (result.node_errors, result.error)
    images = result.outputs["10"]["images"]
    assert len(images) == LENGTH  # (9 - 1) // 4 + 1 = 3 latent frames decode to 9 frames
    with Image.open(tmp_path / "output" / images[0]["subfolder"] / images[0]["filename"]) as png:
        assert png.size == (WIDTH, HEIGHT)
        assert np.asarray(png).std() > 1.0  # not a flat image


def test_the_demo_transformer_is_wan_in_the_original_layout(wan_demo: Path) -> None:
    from nodes.core.weights import read_index
    from nodes.load.handles import open_diffusion_model, open_text_encoders

    index = read_index(wan_demo / "diffusion_models" / DEMO_WAN)
    assert index.has("blocks.0.self_attn.q.weight") and index.has("head.modulation")
    model = open_diffusion_model(wan_demo / "diffusion_models" / DEMO_WAN)
    assert model.family.title == "Wan 2.1" and model.latent_format.channels == 16
    clip = open_text_encoders([wan_demo / "text_encoders" / DEMO_UMT5], "wan")
    assert clip.family.title == "Wan 2.1"


def test_the_shipped_wan_example_writes_an_animation_of_every_frame(wan_demo: Path, tmp_path: Path) -> None:
    prompt = json.loads((WORKFLOWS / "wan21_t2v.api.json").read_text(encoding="utf-8"))
    width, height, length = (prompt["40"]["inputs"][k] for k in ("width", "height", "length"))
    result = run(make_executor(wan_demo, tmp_path), prompt)
    assert result.status == "success", (result.node_errors, result.error)
    (animation,) = result.outputs["28"]["images"]
    with Image.open(tmp_path / "output" / animation["subfolder"] / animation["filename"]) as webp:
        assert (webp.format, webp.n_frames, webp.size) == ("WEBP", length, (width, height))
        assert np.asarray(webp.convert("RGB")).std() > 1.0  # not a flat picture
