"""The Z-Image Turbo example workflow (web/workflows/z_image_turbo.api.json: ComfyUI's template —
UNETLoader + CLIPLoader(lumina2) + VAELoader, ModelSamplingAuraFlow 3, KSampler 8 steps res_multistep /
simple at cfg 1, the negative zeroed) runs offline on the demo files; Z-Image LoRAs in the layouts
users have change exactly the weights they name; wrong files fail with errors that say what to do;
and loading, encoding and sampling never open a network connection."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from nodes.core.tensors import ModelLoadError
from nodes.core.weights import fingerprint
from nodes.demo.flux import DEMO_T5XXL
from nodes.demo.zimage import DEMO_QWEN3, DEMO_ZIMAGE
from nodes.families.components.zimage_dit import ZImageTransformer
from nodes.load.handles import open_diffusion_model, open_text_encoders
from nodes.load.lora import LoraPatch
from tests.nodes.test_generation_e2e import make_executor, run

WORKFLOWS = Path(__file__).resolve().parents[3] / "web" / "workflows"
COMPAT_WORKFLOWS = Path(__file__).resolve().parents[2] / "compat" / "workflows"
RANK, ALPHA, STRENGTH = 2, 1.0, 0.7


@pytest.fixture(scope="module")
def demo_models(zimage_demo: Path) -> Path:
    return zimage_demo


def workflow() -> dict[str, Any]:
    return dict(json.loads((WORKFLOWS / "z_image_turbo.api.json").read_text()))


def test_z_image_turbo_workflow_runs(demo_models: Path, tmp_path: Path) -> None:
    prompt = workflow()
    assert prompt["3"]["inputs"] | {"model": None} == {
        "model": None,
        "seed": 42,
        "steps": 8,
        "cfg": 1.0,
        "sampler_name": "res_multistep",
        "scheduler": "simple",
        "positive": ["6", 0],
        "negative": ["7", 0],
        "latent_image": ["5", 0],
        "denoise": 1.0,
    }
    result = run(make_executor(demo_models, tmp_path), prompt)
    assert result.status == "success", (result.node_errors, result.error)
    (image,) = result.outputs["9"]["images"]
    with Image.open(tmp_path / "output" / image["subfolder"] / image["filename"]) as png:
        assert png.size == (64, 64)
        assert np.asarray(png).std() > 1.0  # not a flat image


def test_template_with_combined_prompts_runs(demo_models: Path, tmp_path: Path) -> None:
    """ComfyUI's current template combines the prompt with a second one (ConditioningCombine): two
    captions of different lengths, whose predictions the sampler averages."""
    prompt = workflow()
    prompt["14"] = {
        "class_type": "CLIPTextEncode",
        "inputs": {
            "text": "safe for work, fully clothed, appropriate attire, decent, family friendly",
            "clip": ["11", 0],
        },
    }
    prompt["15"] = {
        "class_type": "ConditioningCombine",
        "inputs": {"conditioning_1": ["6", 0], "conditioning_2": ["14", 0]},
    }
    prompt["3"]["inputs"] |= {"positive": ["15", 0], "steps": 2}
    result = run(make_executor(demo_models, tmp_path), prompt)
    assert result.status == "success", (result.node_errors, result.error)


def test_ui_format_template_with_a_subgraph_runs(demo_models: Path, tmp_path: Path) -> None:
    """A UI-format file shaped like ComfyUI's Z-Image Turbo template (the graph inside a subgraph whose
    prompt, size, steps and model names are promoted to the instance) converts to the example's
    graph and runs."""
    from engine.formats import load_workflow

    ui = json.loads((COMPAT_WORKFLOWS / "z_image_turbo_subgraph.json").read_text())
    executor = make_executor(demo_models, tmp_path)
    prompt = load_workflow(ui, executor.registry.object_info()).prompt
    expected = workflow()
    assert sorted(n["class_type"] for n in prompt.values()) == sorted(
        n["class_type"] for n in expected.values()
    )
    (sampler,) = [n for n in prompt.values() if n["class_type"] == "KSampler"]
    assert {k: v for k, v in sampler["inputs"].items() if not isinstance(v, list)} == {
        k: v for k, v in expected["3"]["inputs"].items() if not isinstance(v, list)
    }
    result = run(executor, prompt)
    assert result.status == "success", (result.node_errors, result.error)


def test_loom_format_workflow_holds_the_same_prompt() -> None:
    from engine.formats import from_saved

    saved = from_saved(json.loads((WORKFLOWS / "z_image_turbo.loom.json").read_text()))
    assert saved.prompt == workflow() and set(saved.layout["nodes"]) == set(workflow())


# --- LoRA ------------------------------------------------------------------------------------------
LAYERS = {  # original name -> diffusers module name
    "layers.0.attention.qkv": None,  # fused: lands split over to_q/to_k/to_v
    "layers.1.attention.out": "layers.1.attention.to_out.0",
    "noise_refiner.0.feed_forward.w1": "noise_refiner.0.feed_forward.w1",
    "layers.0.adaLN_modulation.0": "layers.0.adaLN_modulation.0",
    "x_embedder": "all_x_embedder.2-1",
}


def _pairs(original: dict[str, Any], names: Any) -> dict[str, tuple[Any, Any]]:
    torch.manual_seed(3)
    return {
        n: (
            torch.randn(RANK, original[f"{n}.weight"].shape[1]),
            torch.randn(original[f"{n}.weight"].shape[0], RANK),
        )
        for n in names
    }


def write_lora(path: Path, heads: dict[str, tuple[Any, Any]], kohya: bool) -> None:
    from safetensors.torch import save_file

    tensors = {}
    for head, (down, up) in heads.items():
        a, b = (".lora_down.weight", ".lora_up.weight") if kohya else (".lora_A.weight", ".lora_B.weight")
        tensors |= {head + a: down, head + b: up, f"{head}.alpha": torch.tensor(ALPHA)}
    save_file(tensors, str(path))


def _patched(model_file: Path, lora: Path) -> tuple[dict[str, Any], Any]:
    handle = open_diffusion_model(model_file)
    patch = LoraPatch(lora, fingerprint(lora), STRENGTH, "unet")
    return handle.with_patch(patch).load().state_dict(), handle


@pytest.mark.parametrize("layout", ["comfyui", "kohya"])
def test_original_layout_lora_equals_editing_the_file(layout: str, demo_models: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    model_file = demo_models / "diffusion_models" / DEMO_ZIMAGE
    original = load_file(model_file)
    pairs = _pairs(original, LAYERS)
    prefix = "lora_unet_" if layout == "kohya" else "diffusion_model."
    heads = {prefix + (n.replace(".", "_") if layout == "kohya" else n): p for n, p in pairs.items()}
    write_lora(tmp_path / "lora.safetensors", heads, kohya=layout == "kohya")
    patched, handle = _patched(model_file, tmp_path / "lora.safetensors")
    edited = dict(original)
    for name, (down, up) in pairs.items():
        edited[f"{name}.weight"] = original[f"{name}.weight"] + STRENGTH * (ALPHA / RANK) * (up @ down)
    expected = ZImageTransformer().to_diffusers(edited, handle.parts[0].config)
    assert patched.keys() == expected.keys()
    for key, value in expected.items():
        torch.testing.assert_close(patched[key], value, atol=1e-5, rtol=1e-5, msg=key)
    assert not torch.equal(
        patched["layers.0.attention.to_v.weight"],
        handle.load().state_dict()["layers.0.attention.to_v.weight"],
    )


@pytest.mark.parametrize(
    "prefix",
    ["diffusion_model.", "transformer.", "lora_unet_"],
    ids=["ai_toolkit", "diffusers_peft", "kohya_diffusers_names"],
)
def test_diffusers_named_lora_applies(prefix: str, demo_models: Path, tmp_path: Path) -> None:
    """LoRAs trained on the diffusers module names (ai-toolkit writes them under diffusion_model.)."""
    model_file = demo_models / "diffusion_models" / DEMO_ZIMAGE
    base = open_diffusion_model(model_file).load().state_dict()
    names = ["layers.1.attention.to_k", "layers.0.attention.to_out.0", "context_refiner.0.feed_forward.w2"]
    pairs = _pairs(base, names)
    kohya = prefix == "lora_unet_"
    write_lora(
        tmp_path / "lora.safetensors",
        {prefix + (n.replace(".", "_") if kohya else n): p for n, p in pairs.items()},
        kohya=kohya,
    )
    patched, _ = _patched(model_file, tmp_path / "lora.safetensors")
    for name, (down, up) in pairs.items():
        expected = base[f"{name}.weight"] + STRENGTH * (ALPHA / RANK) * (up @ down)
        torch.testing.assert_close(patched[f"{name}.weight"], expected, atol=1e-5, rtol=1e-5, msg=name)


def test_lora_of_another_width_is_refused(demo_models: Path, tmp_path: Path) -> None:
    write_lora(
        tmp_path / "wide.safetensors",
        {"diffusion_model.layers.0.attention.qkv": (torch.randn(RANK, 7), torch.randn(5, RANK))},
        False,
    )
    with pytest.raises(ModelLoadError, match="another model family or size"):
        _patched(demo_models / "diffusion_models" / DEMO_ZIMAGE, tmp_path / "wide.safetensors")


def test_lora_loader_node_in_the_workflow(demo_models: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    original = load_file(demo_models / "diffusion_models" / DEMO_ZIMAGE)
    (demo_models / "loras").mkdir(exist_ok=True)
    write_lora(
        demo_models / "loras" / "z_style.safetensors",
        {f"diffusion_model.{n}": p for n, p in _pairs(original, LAYERS).items()},
        kohya=False,
    )
    prompt = workflow()
    prompt["20"] = {
        "class_type": "LoraLoaderModelOnly",
        "inputs": {"model": ["12", 0], "lora_name": "z_style.safetensors", "strength_model": 1.0},
    }
    prompt["13"]["inputs"]["model"] = ["20", 0]
    result = run(make_executor(demo_models, tmp_path), prompt)
    assert result.status == "success", (result.node_errors, result.error)


@pytest.mark.parametrize("clip_type", ["lumina2", "stable_diffusion", "qwen_image"])
def test_qwen3_4b_file_is_z_images_encoder_for_any_type_but_flux(clip_type: str, demo_models: Path) -> None:
    """As ComfyUI routes qwen_3_4b.safetensors: the file decides, the type only matters for Flux (Klein)."""
    from nodes.families.catalog import ZImage

    handle = open_text_encoders([demo_models / "text_encoders" / DEMO_QWEN3], clip_type)
    assert handle.family == ZImage() and [p.name for p in handle.parts] == ["qwen3_4b"]
    assert handle.hidden_state_index("qwen3_4b") == -2


# --- wrong files ----------------------------------------------------------------------------------
def test_z_image_transformer_given_to_clip_loader_says_use_unet_loader(demo_models: Path) -> None:
    with pytest.raises(ModelLoadError, match="Z-Image transformer, not a text encoder.*UNETLoader"):
        open_text_encoders([demo_models / "diffusion_models" / DEMO_ZIMAGE], "lumina2")


def test_qwen3_file_given_to_unet_loader_says_use_clip_loader(demo_models: Path) -> None:
    with pytest.raises(ModelLoadError, match="Qwen3 text encoder.*CLIPLoader"):
        open_diffusion_model(demo_models / "text_encoders" / DEMO_QWEN3)


@pytest.fixture(scope="module")
def t5_file(demo_models: Path) -> Path:
    from safetensors.torch import save_file

    from nodes.demo.flux import demo_flux_modules
    from nodes.families.components.t5_text import T5Text

    path = demo_models / "text_encoders" / DEMO_T5XXL
    save_file(T5Text().to_original(demo_flux_modules()["t5xxl"].state_dict(), {}), str(path))
    return path


def test_t5_file_for_z_image_names_the_encoder_it_needs(t5_file: Path) -> None:
    with pytest.raises(ModelLoadError, match="t5xxl text encoder; Z-Image uses \\['qwen3_4b'\\]"):
        open_text_encoders([t5_file], "lumina2")


def test_conditioning_of_another_text_encoder_is_refused(
    demo_models: Path, t5_file: Path, tmp_path: Path
) -> None:
    prompt = workflow()
    prompt["11"]["inputs"] |= {"clip_name": t5_file.name, "type": "chroma"}
    result = run(make_executor(demo_models, tmp_path), prompt)
    assert result.status != "success" and result.error["node_id"] == "3"
    message = result.error["exception_message"]
    assert "32-wide embeddings but this Z-Image model expects 48" in message and "lumina2" in message


def test_z_image_file_in_checkpoint_loader_says_use_the_component_loaders(demo_models: Path) -> None:
    from nodes.load.handles import open_checkpoint

    with pytest.raises(ModelLoadError, match="UNETLoader.*CLIPLoader \\(type lumina2\\).*VAELoader"):
        open_checkpoint(demo_models / "diffusion_models" / DEMO_ZIMAGE)


def test_sd_vae_with_z_image_is_refused(demo_models: Path, tmp_path: Path) -> None:
    from safetensors.torch import save_file

    from nodes.core.parts import Part
    from nodes.demo.models import demo_modules
    from nodes.families.build import original_state_dict
    from nodes.families.components import KLVae

    vae = demo_modules()["vae"]  # SD1.5 demo VAE (4 latent channels)
    save_file(
        original_state_dict(Part.make("vae", KLVae(), "", "vae", dict(vae.config)), vae),
        str(demo_models / "vae" / "sd_vae.safetensors"),
    )
    prompt = workflow()
    prompt["10"]["inputs"]["vae_name"] = "sd_vae.safetensors"
    prompt["3"]["inputs"]["steps"] = 1
    result = run(make_executor(demo_models, tmp_path), prompt)
    assert result.status != "success" and result.error["node_id"] == "8"
    assert (
        "4-channel" in result.error["exception_message"]
        and "ae.safetensors" in result.error["exception_message"]
    )


def test_empty_four_channel_latent_is_widened_as_comfyui_does(demo_models: Path, tmp_path: Path) -> None:
    """ComfyUI widens an all-zero EmptyLatentImage to the model's 16 channels (its Flux schnell
    example relies on it); a latent with content and the wrong width is refused, naming the fix."""
    import torch

    from nodes.latent.vae import fit_empty_latent

    prompt = workflow()
    prompt["5"] = {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 64, "batch_size": 1}}
    prompt["3"]["inputs"]["steps"] = 1
    result = run(make_executor(demo_models, tmp_path), prompt)
    assert result.status == "success", (result.node_errors, result.error)
    empty = {"samples": torch.zeros(2, 4, 8, 8), "batch_index": [0, 1]}
    from nodes.families.latent_format import FLUX2_LATENT
    from nodes.families.zimage import ZImage

    widened = fit_empty_latent(empty, ZImage.latent_format)
    assert widened["samples"].shape == (2, 16, 8, 8) and widened["batch_index"] == [0, 1]
    assert fit_empty_latent(empty, FLUX2_LATENT)["samples"].shape == (2, 128, 4, 4)  # 1/8 -> 1/16 as ComfyUI
    encoded = {"samples": torch.ones(1, 4, 8, 8)}
    assert fit_empty_latent(encoded, ZImage.latent_format) is encoded


# no network: tests/nodes/families/test_dit_workflows_offline.py, for every DiT family's workflow
