"""The SD3 example workflows (web/workflows/sd35*.api.json: ComfyUI's SD3.5 example with
CheckpointLoaderSimple for the model and VAE and TripleCLIPLoader for the text encoders, and an
all-in-one checkpoint with ModelSamplingSD3, SkipLayerGuidanceSD3 and CLIPTextEncodeSD3;
sd3_medium.api.json: ComfyUI's SD3 medium example, its negative zeroed out after the first tenth of
the steps, dpmpp_2m) run offline
on the demo files; the separate-files chain (UNETLoader, TripleCLIPLoader / DualCLIPLoader type sd3,
VAELoader) runs; wrong files fail with errors that say what to do."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from nodes.core.weights import ModelLoadError
from nodes.demo.sd3 import (
    DEMO_SD3_CLIP_G,
    DEMO_SD3_CLIP_L,
    DEMO_SD3_MMDIT,
    DEMO_SD3_T5XXL,
    DEMO_SD3_VAE,
    DEMO_SD35,
)
from tests.nodes.test_generation_e2e import make_executor, run

WORKFLOWS = Path(__file__).resolve().parents[3] / "web" / "workflows"


@pytest.fixture(scope="module")
def demo_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from nodes.demo.sd3 import make_sd3_demo

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("sd3_demo")
    make_sd3_demo(root)
    return root


def _image_ok(result, tmp_path: Path, node: str = "9") -> None:  # type: ignore[no-untyped-def]
    assert result.status == "success", (result.node_errors, result.error)
    (image,) = result.outputs[node]["images"]
    with Image.open(tmp_path / "output" / image["subfolder"] / image["filename"]) as png:
        assert png.size == (64, 64)
        assert np.asarray(png).std() > 1.0  # not a flat image


@pytest.mark.parametrize("name", ["sd35", "sd35_incl_clips", "sd3_medium"])
def test_sd35_workflow_runs(name: str, demo_models: Path, tmp_path: Path) -> None:
    prompt = json.loads((WORKFLOWS / f"{name}.api.json").read_text())
    _image_ok(run(make_executor(demo_models, tmp_path), prompt), tmp_path)


def _separate_files(prompt: dict, clip_node: dict) -> dict:
    prompt = dict(prompt)
    prompt["12"] = {
        "class_type": "UNETLoader",
        "inputs": {"unet_name": DEMO_SD3_MMDIT, "weight_dtype": "default"},
    }
    prompt["10"] = {"class_type": "VAELoader", "inputs": {"vae_name": DEMO_SD3_VAE}}
    prompt["11"] = clip_node
    del prompt["4"]
    prompt["3"]["inputs"]["model"] = ["12", 0]
    prompt["8"]["inputs"]["vae"] = ["10", 0]
    return prompt


def test_separate_files_chain_runs(demo_models: Path, tmp_path: Path) -> None:
    prompt = json.loads((WORKFLOWS / "sd35.api.json").read_text())
    triple = {
        "class_type": "TripleCLIPLoader",
        "inputs": {
            "clip_name1": DEMO_SD3_T5XXL,
            "clip_name2": DEMO_SD3_CLIP_L,
            "clip_name3": DEMO_SD3_CLIP_G,
        },
    }  # any order
    _image_ok(run(make_executor(demo_models, tmp_path), _separate_files(prompt, triple)), tmp_path)


def test_dual_clip_loader_sd3_without_t5_encodes_the_clips_alone(demo_models: Path, make_ctx: Any) -> None:
    """ComfyUI lets SD3 run on CLIP-L + CLIP-G only: 77 CLIP tokens, zero-padded to T5's width (4096)."""
    from nodes.encode.conditioning import CLIPTextEncode
    from nodes.load.handles import open_text_encoders

    te = demo_models / "text_encoders"
    clip = open_text_encoders([te / DEMO_SD3_CLIP_L, te / DEMO_SD3_CLIP_G], "sd3")
    (entry,) = CLIPTextEncode().run(make_ctx(), text="a fox", clip=clip)[0]
    assert entry.embeds.shape == (1, 77, 4096) and entry.pooled is not None and entry.pooled.shape == (1, 64)
    assert entry.embeds[..., 64:].abs().max() == 0 and entry.embeds[..., :64].abs().max() > 0


def test_comfyui_sd3_checkpoint_without_text_encoders_says_use_triple_clip_loader(
    demo_models: Path, tmp_path: Path
) -> None:
    prompt = json.loads((WORKFLOWS / "sd35.api.json").read_text())
    prompt["16"]["inputs"]["clip"] = ["4", 1]  # the checkpoint's (empty) CLIP instead of TripleCLIPLoader's
    result = run(make_executor(demo_models, tmp_path), prompt)
    assert result.status != "success" and result.error["node_id"] == "16"
    assert "TripleCLIPLoader" in result.error["exception_message"]


def test_transformer_only_file_in_checkpoint_loader_says_use_unet_loader(demo_models: Path) -> None:
    from nodes.load.handles import open_checkpoint

    with pytest.raises(ModelLoadError, match="UNETLoader"):
        open_checkpoint(demo_models / "diffusion_models" / DEMO_SD3_MMDIT)


def test_wrong_files_for_triple_clip_loader_teach(demo_models: Path) -> None:
    from nodes.load.handles import open_text_encoders

    te = demo_models / "text_encoders"
    with pytest.raises(ModelLoadError, match="second t5xxl"):  # a T5 file where CLIP-G belongs
        open_text_encoders([te / DEMO_SD3_CLIP_L, te / DEMO_SD3_T5XXL, te / DEMO_SD3_T5XXL], "sd3")
    with pytest.raises(ModelLoadError, match="SD3 transformer, not a text encoder.*UNETLoader"):
        open_text_encoders([te / DEMO_SD3_CLIP_L, demo_models / "diffusion_models" / DEMO_SD3_MMDIT], "sd3")
    with pytest.raises(ModelLoadError, match="clip_g text encoder; Flux.1 uses"):
        open_text_encoders([te / DEMO_SD3_CLIP_G, te / DEMO_SD3_T5XXL], "flux")


def test_sd3_checkpoint_detected_by_tensors(demo_models: Path) -> None:
    from nodes.load.handles import open_checkpoint

    ck = open_checkpoint(demo_models / "checkpoints" / DEMO_SD35)
    assert ck.unet.family.name == "sd3" and ck.clip.parts == ()
    assert ck.unet.model_sampling.timestep(torch.tensor([0.5])).item() == pytest.approx(500.0)
    assert ck.unet.parts[0].config["dual_attention_layers"] == [0]


def test_sd35_ui_format_workflow_converts_to_the_example_and_runs(demo_models: Path, tmp_path: Path) -> None:
    """The SD3.5 example saved in ComfyUI's UI format (litegraph nodes and links, widget values in
    ComfyUI's order, KSampler's control_after_generate included) converts to the API example."""
    from engine.formats import convert_ui_to_api

    ui = json.loads((Path(__file__).parents[1] / "comfyui_workflows" / "sd35_ui.json").read_text())
    executor = make_executor(demo_models, tmp_path)
    prompt = convert_ui_to_api(ui, executor.registry.object_info())
    expected = json.loads((WORKFLOWS / "sd35.api.json").read_text())
    assert {k: (v["class_type"], v["inputs"]) for k, v in prompt.items()} == {
        k: (v["class_type"], v["inputs"]) for k, v in expected.items()
    }
    _image_ok(run(executor, prompt), tmp_path)


def test_checkpoint_save_writes_comfyuis_sd3_layout(demo_models: Path, make_ctx: Any) -> None:
    """CheckpointSave of an all-in-one SD3 checkpoint writes the same tensors under the same names."""
    from safetensors.torch import load_file

    from nodes.demo.sd3 import DEMO_SD35_AIO
    from nodes.load.checkpoint_loaders import CheckpointSave
    from nodes.load.handles import open_checkpoint

    ctx = make_ctx()
    source = demo_models / "checkpoints" / DEMO_SD35_AIO
    ck = open_checkpoint(source)
    out = CheckpointSave().run(
        ctx, model=ck.unet, clip=ck.clip, vae=ck.vae, filename_prefix="checkpoints/sd3"
    )
    saved = out.ui["checkpoints"][0]
    written = load_file(str(ctx.folders.output_dir / saved["subfolder"] / saved["filename"]))
    original = load_file(str(source))
    assert written.keys() == original.keys()
    assert all(torch.equal(written[k], v) for k, v in original.items())
