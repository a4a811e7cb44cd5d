"""The Flux.2 Klein example workflow (web/workflows/flux2_klein.api.json, after ComfyUI's template:
UNETLoader + CLIPLoader(flux2) + VAELoader, EmptyFlux2LatentImage, Flux2Scheduler, CFGGuider at cfg 1
with the negative zeroed, euler via SamplerCustomAdvanced) runs offline on the demo files; Flux.2 LoRAs
in the layouts users have change exactly the weights they name (fused qkv split); wrong files fail with
errors that say what to do; and loading, encoding and sampling never open a network connection."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from nodes.core.weights import ModelLoadError, fingerprint
from nodes.demo.flux2 import DEMO_FLUX2_VAE, DEMO_KLEIN, DEMO_KLEIN_QWEN3
from nodes.families.components.flux2_dit import Flux2Transformer
from nodes.load.handles import open_diffusion_model, open_text_encoders, open_vae
from nodes.load.lora import LoraPatch
from tests.nodes.test_generation_e2e import make_executor, run

WORKFLOWS = Path(__file__).resolve().parents[3] / "web" / "workflows"
RANK, ALPHA, STRENGTH = 2, 1.0, 0.7


@pytest.fixture(scope="module")
def demo_models(flux2_demo: Path) -> Path:
    return flux2_demo


def workflow() -> dict[str, Any]:
    return dict(json.loads((WORKFLOWS / "flux2_klein.api.json").read_text()))


def test_flux2_klein_workflow_runs(demo_models: Path, tmp_path: Path) -> None:
    prompt = workflow()
    assert prompt["48"] == {"class_type": "Flux2Scheduler", "inputs": {"steps": 4, "width": 64, "height": 64}}
    assert prompt["11"]["inputs"]["type"] == "flux2" and prompt["22"]["inputs"]["cfg"] == 1.0
    result = run(make_executor(demo_models, tmp_path), prompt)
    assert result.status == "success", (result.node_errors, result.error)
    (image,) = result.outputs["9"]["images"]
    with Image.open(tmp_path / "output" / image["subfolder"] / image["filename"]) as png:
        assert png.size == (64, 64)
        assert np.asarray(png).std() > 1.0  # not a flat image


def test_loom_format_workflow_holds_the_same_prompt() -> None:
    saved = json.loads((WORKFLOWS / "flux2_klein.loom.json").read_text())
    assert saved["format"] == "loom.workflow" and saved["prompt"] == workflow()
    assert set(saved["layout"]["nodes"]) == set(workflow())


def test_vae_encode_then_decode_keeps_the_image_size(demo_models: Path, make_ctx: Any) -> None:
    from nodes.latent.vae import VAEDecode, VAEEncode

    ctx = make_ctx()
    vae = open_vae(demo_models / "vae" / DEMO_FLUX2_VAE)
    (latent,) = VAEEncode().run(ctx, pixels=torch.rand(1, 48, 64, 3), vae=vae)
    assert latent["samples"].shape == (1, 128, 3, 4)
    (image,) = VAEDecode().run(ctx, samples=latent, vae=vae)
    assert image.shape == (1, 48, 64, 3)


# --- LoRA ------------------------------------------------------------------------------------------
LAYERS = (
    "double_blocks.0.img_attn.qkv",
    "double_blocks.0.txt_mlp.0",
    "single_blocks.1.linear1",
    "double_stream_modulation_img.lin",
    "img_in",
)


def _pairs(original: dict[str, Any], names: Any) -> dict[str, tuple[Any, Any]]:
    torch.manual_seed(3)
    return {
        n: (
            torch.randn(RANK, original[f"{n}.weight"].shape[1]),
            torch.randn(original[f"{n}.weight"].shape[0], RANK),
        )
        for n in names
    }


def _write_lora(path: Path, heads: dict[str, tuple[Any, Any]], kohya: bool) -> None:
    from safetensors.torch import save_file

    tensors = {}
    for head, (down, up) in heads.items():
        a, b = (".lora_down.weight", ".lora_up.weight") if kohya else (".lora_A.weight", ".lora_B.weight")
        tensors |= {head + a: down, head + b: up, f"{head}.alpha": torch.tensor(ALPHA)}
    save_file(tensors, str(path))


@pytest.mark.parametrize("layout", ["comfyui", "kohya"])
def test_original_layout_lora_equals_editing_the_file(layout: str, demo_models: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    model_file = demo_models / "diffusion_models" / DEMO_KLEIN
    original = load_file(model_file)
    pairs = _pairs(original, LAYERS)
    prefix = "lora_unet_" if layout == "kohya" else "diffusion_model."
    heads = {prefix + (n.replace(".", "_") if layout == "kohya" else n): p for n, p in pairs.items()}
    _write_lora(tmp_path / "lora.safetensors", heads, kohya=layout == "kohya")
    handle = open_diffusion_model(model_file)
    patched = (
        handle.with_patch(
            LoraPatch(
                tmp_path / "lora.safetensors", fingerprint(tmp_path / "lora.safetensors"), STRENGTH, "unet"
            )
        )
        .load()
        .state_dict()
    )
    edited = dict(original)
    for name, (down, up) in pairs.items():
        edited[f"{name}.weight"] = original[f"{name}.weight"] + STRENGTH * (ALPHA / RANK) * (up @ down)
    expected = Flux2Transformer().to_diffusers(edited, handle.parts[0].config)
    assert patched.keys() == expected.keys()
    for key, value in expected.items():
        torch.testing.assert_close(patched[key], value, atol=1e-5, rtol=1e-5, msg=key)
    assert not torch.equal(
        patched["transformer_blocks.0.attn.to_v.weight"],
        handle.load().state_dict()["transformer_blocks.0.attn.to_v.weight"],
    )


def test_diffusers_named_lora_in_the_workflow(demo_models: Path, tmp_path: Path) -> None:
    base = open_diffusion_model(demo_models / "diffusion_models" / DEMO_KLEIN).load().state_dict()
    (demo_models / "loras").mkdir(exist_ok=True)
    names = ["transformer_blocks.0.attn.to_k", "single_transformer_blocks.0.attn.to_qkv_mlp_proj"]
    _write_lora(
        demo_models / "loras" / "klein_style.safetensors",
        {f"transformer.{n}": p for n, p in _pairs(base, names).items()},
        kohya=False,
    )
    prompt = workflow()
    prompt["20"] = {
        "class_type": "LoraLoaderModelOnly",
        "inputs": {"model": ["12", 0], "lora_name": "klein_style.safetensors", "strength_model": 1.0},
    }
    prompt["22"]["inputs"]["model"] = ["20", 0]
    result = run(make_executor(demo_models, tmp_path), prompt)
    assert result.status == "success", (result.node_errors, result.error)


# --- wrong files ----------------------------------------------------------------------------------
def test_flux2_transformer_given_to_clip_loader_says_use_unet_loader(demo_models: Path) -> None:
    with pytest.raises(ModelLoadError, match="Flux.2 transformer, not a text encoder.*UNETLoader"):
        open_text_encoders([demo_models / "diffusion_models" / DEMO_KLEIN], "flux2")


def test_flux2_file_in_checkpoint_loader_says_use_the_component_loaders(demo_models: Path) -> None:
    from nodes.load.handles import open_checkpoint

    with pytest.raises(ModelLoadError, match="UNETLoader.*CLIPLoader \\(type flux2\\).*VAELoader"):
        open_checkpoint(demo_models / "diffusion_models" / DEMO_KLEIN)


def test_z_image_qwen3_with_klein_names_the_layers(demo_models: Path, tmp_path: Path) -> None:
    """Z-Image's 3-layer demo Qwen3 loads as a Qwen3 file but cannot give Klein layers 9, 18 and 27."""
    from safetensors.torch import save_file

    from nodes.demo.zimage import DEMO_QWEN3, demo_zimage_modules, zimage_files

    save_file(
        zimage_files(demo_zimage_modules(vae=False))[DEMO_QWEN3],
        str(demo_models / "text_encoders" / DEMO_QWEN3),
    )
    prompt = workflow()
    prompt["11"]["inputs"]["clip_name"] = DEMO_QWEN3
    result = run(make_executor(demo_models, tmp_path), prompt)
    assert result.status != "success" and result.error["node_id"] == "6"
    assert "reads layers [9, 18, 27]" in result.error["exception_message"]


def test_flux1_vae_with_flux2_is_refused(demo_models: Path, tmp_path: Path) -> None:
    from safetensors.torch import save_file

    from nodes.demo.flux import DEMO_FLUX_VAE, demo_flux_modules
    from nodes.families.base import Part
    from nodes.families.build import original_state_dict
    from nodes.families.components import KLVae

    vae = demo_flux_modules()["vae"]
    save_file(
        original_state_dict(Part.make("vae", KLVae(), "", "vae", dict(vae.config)), vae),
        str(demo_models / "vae" / DEMO_FLUX_VAE),
    )
    prompt = workflow()
    prompt["10"]["inputs"]["vae_name"] = DEMO_FLUX_VAE
    prompt["48"]["inputs"]["steps"] = 1
    result = run(make_executor(demo_models, tmp_path), prompt)
    assert result.status != "success" and result.error["node_id"] == "8"
    assert "128 channels" in result.error["exception_message"]


# no network: tests/nodes/families/test_dit_workflows_offline.py, for every DiT family's workflow


def test_demo_files_have_the_users_layouts(demo_models: Path) -> None:
    from nodes.families.flux2 import Flux2

    assert isinstance(open_diffusion_model(demo_models / "diffusion_models" / DEMO_KLEIN).family, Flux2)
    assert isinstance(
        open_text_encoders([demo_models / "text_encoders" / DEMO_KLEIN_QWEN3], "flux2").family, Flux2
    )
    assert isinstance(open_vae(demo_models / "vae" / DEMO_FLUX2_VAE).family, Flux2)


def test_tiled_decode_and_encode_work_at_one_sixteenth(demo_models: Path, make_ctx: Any) -> None:
    """VAEDecodeTiled / VAEEncodeTiled use the Flux.2 VAE's 16 pixels per latent pixel; the tiled decode
    of a latent smaller than one tile equals the plain decode, and VAEEncode centre-crops to 16."""
    from nodes.latent.vae import VAEDecode, VAEDecodeTiled, VAEEncode, VAEEncodeTiled

    ctx = make_ctx()
    vae = open_vae(demo_models / "vae" / DEMO_FLUX2_VAE)
    torch.manual_seed(0)
    latent = {"samples": torch.randn(1, 128, 4, 6)}
    (plain,) = VAEDecode().run(ctx, samples=latent, vae=vae)
    (tiled,) = VAEDecodeTiled().run(ctx, samples=latent, vae=vae, tile_size=512, overlap=64)
    assert tiled.shape == plain.shape == (1, 64, 96, 3)
    torch.testing.assert_close(tiled, plain, atol=1e-5, rtol=1e-5)
    (encoded,) = VAEEncodeTiled().run(
        ctx, pixels=torch.rand(1, 70, 100, 3), vae=vae, tile_size=512, overlap=64
    )
    assert encoded["samples"].shape == (1, 128, 4, 6)
    (cropped,) = VAEEncode().run(ctx, pixels=torch.rand(1, 70, 100, 3), vae=vae)
    assert cropped["samples"].shape == (1, 128, 4, 6)


def test_clip_loader_type_flux_with_a_qwen3_file_is_flux2_as_in_comfyui(demo_models: Path) -> None:
    from nodes.families.flux2 import Flux2

    for clip_type in ("flux", "flux2"):
        handle = open_text_encoders([demo_models / "text_encoders" / DEMO_KLEIN_QWEN3], clip_type)
        assert isinstance(handle.family, Flux2)


def test_default_sampling_is_comfyuis_flux2_shift(demo_models: Path) -> None:
    """Without Flux2Scheduler (KSampler with a named scheduler) the model samples as ComfyUI's Flux2 config
    says: ModelSamplingFlux with shift (mu) 2.02, sigma(t) = e^mu / (e^mu + 1/t − 1), timestep = sigma."""
    import math

    from nodes.diffusion.schedulers import ksampler_sigmas

    model = open_diffusion_model(demo_models / "diffusion_models" / DEMO_KLEIN)
    mu = 2.02
    expected = [1.0] + [math.exp(mu) / (math.exp(mu) + 1 / t - 1) for t in (0.75, 0.5, 0.25)] + [0.0]
    torch.testing.assert_close(
        ksampler_sigmas(model.model_sampling, "simple", "euler", 4),
        torch.tensor(expected),
        atol=1e-4,
        rtol=1e-4,
    )
    assert float(model.model_sampling.timestep(torch.tensor(0.4))) == pytest.approx(0.4)


def test_comfyui_saved_klein_checkpoint_loads_with_checkpoint_loader(
    demo_models: Path, tmp_path: Path, make_ctx: Any
) -> None:
    """A ComfyUI-saved all-in-one Klein file (model.diffusion_model., text_encoders.qwen3_4b.transformer.model.,
    vae.) gives the same model, conditioning and VAE as the separate files."""
    from safetensors.torch import load_file, save_file

    from nodes.encode.conditioning import CLIPTextEncode
    from nodes.load.handles import open_checkpoint

    files = {
        "diffusion_models/" + DEMO_KLEIN: "model.diffusion_model.",
        "vae/" + DEMO_FLUX2_VAE: "vae.",
        "text_encoders/" + DEMO_KLEIN_QWEN3: "text_encoders.qwen3_4b.transformer.",
    }
    merged = {
        prefix + k: v for name, prefix in files.items() for k, v in load_file(demo_models / name).items()
    }
    save_file(merged, str(tmp_path / "klein_aio.safetensors"))
    ckpt = open_checkpoint(tmp_path / "klein_aio.safetensors")
    ctx = make_ctx()
    separate = open_text_encoders([demo_models / "text_encoders" / DEMO_KLEIN_QWEN3], "flux2")
    (a,) = CLIPTextEncode().run(ctx, text="a cat", clip=ckpt.clip)[0]
    (b,) = CLIPTextEncode().run(ctx, text="a cat", clip=separate)[0]
    torch.testing.assert_close(a.embeds, b.embeds)
    unet = open_diffusion_model(demo_models / "diffusion_models" / DEMO_KLEIN).load().state_dict()
    assert all(torch.equal(v, unet[k]) for k, v in ckpt.unet.load().state_dict().items())
    vae = open_vae(demo_models / "vae" / DEMO_FLUX2_VAE).load().state_dict()
    assert all(torch.equal(v, vae[k]) for k, v in ckpt.vae.load().state_dict().items())


def test_an_empty_sd3_latent_is_widened_and_halved_as_comfyui_does(demo_models: Path, tmp_path: Path) -> None:
    """ComfyUI turns an all-zero 16-channel 1/8 latent into Flux.2's 128-channel 1/16 one: the image
    keeps the asked size."""
    from PIL import Image

    prompt = workflow()
    prompt["47"] = {
        "class_type": "EmptySD3LatentImage",
        "inputs": {"width": 64, "height": 64, "batch_size": 1},
    }
    result = run(make_executor(demo_models, tmp_path), prompt)
    assert result.status == "success", (result.node_errors, result.error)
    (image,) = result.outputs["9"]["images"]
    with Image.open(tmp_path / "output" / image["subfolder"] / image["filename"]) as png:
        assert png.size == (64, 64)
