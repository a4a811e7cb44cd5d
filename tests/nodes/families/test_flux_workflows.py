"""The Flux example workflows (web/workflows/flux_*.api.json: ComfyUI's Flux dev chain with
FluxGuidance + ModelSamplingFlux + SamplerCustomAdvanced, and schnell with KSampler) run offline on
the demo files; a ComfyUI-style all-in-one Flux checkpoint loads through CheckpointLoaderSimple;
wrong files fail with errors that say what to do."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from nodes.core.tensors import ModelLoadError
from nodes.demo.flux import DEMO_CLIP_L, DEMO_FLUX_DEV, DEMO_FLUX_VAE, DEMO_T5XXL
from tests.nodes.test_generation_e2e import make_executor, run

WORKFLOWS = Path(__file__).resolve().parents[3] / "web" / "workflows"


@pytest.fixture
def demo_models(flux_demo: Path) -> Path:
    return flux_demo


@pytest.mark.parametrize("name", ["flux_dev", "flux_schnell", "chroma"])
def test_flux_workflow_runs(name: str, demo_models: Path, tmp_path: Path) -> None:
    prompt = json.loads((WORKFLOWS / f"{name}.api.json").read_text())
    result = run(make_executor(demo_models, tmp_path), prompt)
    assert result.status == "success", (result.node_errors, result.error)
    (image,) = result.outputs["9"]["images"]
    with Image.open(tmp_path / "output" / image["subfolder"] / image["filename"]) as png:
        assert png.size == (64, 64)
        assert np.asarray(png).std() > 1.0  # not a flat image


def comfy_checkpoint(models: Path) -> dict[str, Any]:
    """An all-in-one checkpoint as ComfyUI saves Flux: model.diffusion_model., text_encoders.*, VAE."""
    from safetensors.torch import load_file

    out = {
        f"model.diffusion_model.{k}": v
        for k, v in load_file(models / "diffusion_models" / DEMO_FLUX_DEV).items()
    }
    out |= {
        f"text_encoders.clip_l.transformer.{k}": v
        for k, v in load_file(models / "text_encoders" / DEMO_CLIP_L).items()
    }
    out |= {
        f"text_encoders.t5xxl.transformer.{k}": v
        for k, v in load_file(models / "text_encoders" / DEMO_T5XXL).items()
    }
    out |= {f"first_stage_model.{k}": v for k, v in load_file(models / "vae" / DEMO_FLUX_VAE).items()}
    return out


def test_comfyui_flux_checkpoint_loads_with_checkpoint_loader(demo_models: Path, tmp_path: Path) -> None:
    from safetensors.torch import save_file

    (demo_models / "checkpoints").mkdir(exist_ok=True)
    save_file(comfy_checkpoint(demo_models), str(demo_models / "checkpoints" / "flux_aio.safetensors"))
    prompt = json.loads((WORKFLOWS / "flux_schnell.api.json").read_text())
    for node in ("12", "11", "10"):
        del prompt[node]
    prompt["4"] = {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "flux_aio.safetensors"}}
    prompt["3"]["inputs"]["model"] = ["4", 0]
    prompt["6"]["inputs"]["clip"] = prompt["33"]["inputs"]["clip"] = ["4", 1]
    prompt["8"]["inputs"]["vae"] = ["4", 2]
    result = run(make_executor(demo_models, tmp_path), prompt)
    assert result.status == "success", (result.node_errors, result.error)


def test_transformer_only_file_in_checkpoint_loader_says_use_unet_loader(demo_models: Path) -> None:
    from nodes.load.handles import open_checkpoint

    with pytest.raises(ModelLoadError, match="UNETLoader"):
        open_checkpoint(demo_models / "diffusion_models" / DEMO_FLUX_DEV)


def test_wrong_files_for_dual_clip_loader_teach(demo_models: Path) -> None:
    from nodes.load.handles import open_text_encoders

    t5 = demo_models / "text_encoders" / DEMO_T5XXL
    with pytest.raises(ModelLoadError, match="second t5xxl"):
        open_text_encoders([t5, t5], "flux")
    with pytest.raises(ModelLoadError, match="Flux transformer, not a text encoder"):
        open_text_encoders([demo_models / "diffusion_models" / DEMO_FLUX_DEV, t5], "flux")
    with pytest.raises(ModelLoadError, match="not supported yet"):
        open_text_encoders([t5], "hidream")


def test_sd_vae_with_flux_is_refused(demo_models: Path, demo_models_source: Path, tmp_path: Path) -> None:
    prompt = json.loads((WORKFLOWS / "flux_schnell.api.json").read_text())
    sd_vae = demo_models_source / "vae" / "loom_demo_vae.safetensors"  # SD1.5 demo VAE (4 latent channels)
    (demo_models / "vae" / "sd_vae.safetensors").write_bytes(sd_vae.read_bytes())
    prompt["10"]["inputs"]["vae_name"] = "sd_vae.safetensors"
    result = run(make_executor(demo_models, tmp_path / "work"), prompt)
    assert result.status != "success" and result.error["node_id"] == "8"
    assert (
        "4-channel" in result.error["exception_message"]
        and "ae.safetensors" in result.error["exception_message"]
    )


def test_flux_vae_file_belongs_to_the_flux_latent_space(demo_models: Path, tmp_path: Path) -> None:
    """VAEDecodeTiled checks the channel count: a Flux latent decodes with the 16-channel VAE file."""
    from nodes.load.handles import open_vae

    assert open_vae(demo_models / "vae" / DEMO_FLUX_VAE).family.latent_format.channels == 16
    prompt = json.loads((WORKFLOWS / "flux_schnell.api.json").read_text())
    prompt["8"] = {
        "class_type": "VAEDecodeTiled",
        "inputs": {
            "samples": ["3", 0],
            "vae": ["10", 0],
            "tile_size": 512,
            "overlap": 64,
            "temporal_size": 64,
            "temporal_overlap": 8,
        },
    }
    result = run(make_executor(demo_models, tmp_path), prompt)
    assert result.status == "success", (result.node_errors, result.error)
