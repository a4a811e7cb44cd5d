"""The Qwen-Image example workflow (web/workflows/qwen_image.api.json: ComfyUI's template — UNETLoader +
CLIPLoader(qwen_image) + VAELoader, ModelSamplingAuraFlow 3.1, KSampler 20 steps euler / simple at
cfg 2.5 with a negative prompt, EmptySD3LatentImage) runs offline on the demo files; Qwen-Image LoRAs in
the layouts users have (ComfyUI/ai-toolkit ``diffusion_model.``, diffusers/PEFT ``transformer.``,
kohya ``lora_unet_``, LyCORIS ``lycoris_``, Qwen-Image-Lightning's bare ``transformer_blocks.``; all on
diffusers' module names, which are the file's) change exactly the weights they name; wrong files fail with errors that say what to do; nothing opens a network connection."""

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
from nodes.demo.qwen_image import DEMO_QWEN25, DEMO_QWEN_IMAGE
from nodes.load.handles import open_diffusion_model, open_text_encoders
from nodes.load.lora import LoraPatch
from tests.nodes.families.test_zimage_workflows import ALPHA, RANK, STRENGTH, write_lora
from tests.nodes.test_generation_e2e import make_executor, run

WORKFLOWS = Path(__file__).resolve().parents[3] / "web" / "workflows"


@pytest.fixture(scope="module")
def demo_models(qwen_image_demo: Path) -> Path:
    return qwen_image_demo


def workflow() -> dict[str, Any]:
    return dict(json.loads((WORKFLOWS / "qwen_image.api.json").read_text()))


def test_qwen_image_workflow_runs(demo_models: Path, tmp_path: Path) -> None:
    prompt = workflow()
    assert prompt["3"]["inputs"] | {"model": None} == {
        "model": None,
        "seed": 42,
        "steps": 20,
        "cfg": 2.5,
        "sampler_name": "euler",
        "scheduler": "simple",
        "positive": ["6", 0],
        "negative": ["7", 0],
        "latent_image": ["58", 0],
        "denoise": 1.0,
    }
    assert prompt["66"]["inputs"]["shift"] == 3.1 and prompt["38"]["inputs"]["type"] == "qwen_image"
    result = run(make_executor(demo_models, tmp_path), prompt)
    assert result.status == "success", (result.node_errors, result.error)
    (image,) = result.outputs["60"]["images"]
    with Image.open(tmp_path / "output" / image["subfolder"] / image["filename"]) as png:
        assert png.size == (64, 64)
        assert np.asarray(png).std() > 1.0  # not a flat image


def test_loom_format_workflow_holds_the_same_prompt() -> None:
    saved = json.loads((WORKFLOWS / "qwen_image.loom.json").read_text())
    assert saved["format"] == "loom.workflow" and saved["prompt"] == workflow()


# --- LoRA ------------------------------------------------------------------------------------------
NAMES = [
    "transformer_blocks.0.attn.to_q",
    "transformer_blocks.1.attn.add_v_proj",
    "transformer_blocks.0.img_mlp.net.2",
    "transformer_blocks.1.txt_mod.1",
    "img_in",
    "proj_out",
]


@pytest.mark.parametrize(
    "prefix",
    ["diffusion_model.", "transformer.", "lora_unet_", "lycoris_", ""],
    ids=["comfyui_ai_toolkit", "diffusers_peft", "kohya", "lycoris", "bare_lightning"],
)
def test_lora_layouts_change_exactly_the_named_weights(
    prefix: str, demo_models: Path, tmp_path: Path
) -> None:
    model_file = demo_models / "diffusion_models" / DEMO_QWEN_IMAGE
    handle = open_diffusion_model(model_file)
    base = handle.load().state_dict()
    torch.manual_seed(3)
    pairs = {
        n: (torch.randn(RANK, base[f"{n}.weight"].shape[1]), torch.randn(base[f"{n}.weight"].shape[0], RANK))
        for n in NAMES
    }
    kohya = prefix in ("lora_unet_", "lycoris_")
    names = NAMES if prefix else [n for n in NAMES if n.startswith("transformer_blocks.")]
    pairs = {n: pairs[n] for n in names}
    write_lora(
        tmp_path / "lora.safetensors",
        {prefix + (n.replace(".", "_") if kohya else n): p for n, p in pairs.items()},
        kohya=kohya,
    )
    lora = tmp_path / "lora.safetensors"
    patched = handle.with_patch(LoraPatch(lora, fingerprint(lora), STRENGTH, "unet")).load().state_dict()
    changed = {k for k in base if not torch.equal(base[k], patched[k])}
    assert changed == {f"{n}.weight" for n in names}
    for name, (down, up) in pairs.items():
        expected = base[f"{name}.weight"] + STRENGTH * (ALPHA / RANK) * (up @ down)
        torch.testing.assert_close(patched[f"{name}.weight"], expected, atol=1e-5, rtol=1e-5, msg=name)


def test_lora_loader_node_in_the_workflow(demo_models: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    original = load_file(demo_models / "diffusion_models" / DEMO_QWEN_IMAGE)
    (demo_models / "loras").mkdir(exist_ok=True)
    name = "transformer_blocks.0.attn.to_k"
    write_lora(
        demo_models / "loras" / "qwen_style.safetensors",
        {
            f"diffusion_model.{name}": (
                torch.randn(RANK, original[f"{name}.weight"].shape[1]),
                torch.randn(original[f"{name}.weight"].shape[0], RANK),
            )
        },
        kohya=False,
    )
    prompt = workflow()
    prompt["20"] = {
        "class_type": "LoraLoaderModelOnly",
        "inputs": {"model": ["37", 0], "lora_name": "qwen_style.safetensors", "strength_model": 1.0},
    }
    prompt["66"]["inputs"]["model"] = ["20", 0]
    prompt["3"]["inputs"]["steps"] = 2
    result = run(make_executor(demo_models, tmp_path), prompt)
    assert result.status == "success", (result.node_errors, result.error)


# --- wrong files ----------------------------------------------------------------------------------
def test_transformer_given_to_clip_loader_says_use_unet_loader(demo_models: Path) -> None:
    with pytest.raises(ModelLoadError, match="Qwen-Image transformer, not a text encoder.*UNETLoader"):
        open_text_encoders([demo_models / "diffusion_models" / DEMO_QWEN_IMAGE], "qwen_image")


def test_qwen_encoder_files_choose_their_family_as_in_comfyui(demo_models: Path) -> None:
    """ComfyUI routes a Qwen3-4B file to Z-Image and a Qwen2.5-VL-7B file to Qwen-Image whatever the
    CLIPLoader type (but Flux's / HunyuanImage's); the mismatch then shows at the sampler."""
    from safetensors.torch import save_file

    from nodes.demo.zimage import DEMO_QWEN3, demo_zimage_modules, zimage_files

    path = demo_models / "text_encoders" / DEMO_QWEN3
    save_file(zimage_files(demo_zimage_modules(vae=False))[DEMO_QWEN3], str(path))
    assert open_text_encoders([path], "qwen_image").family.title == "Z-Image"
    assert (
        open_text_encoders([demo_models / "text_encoders" / DEMO_QWEN25], "lumina2").family.title
        == "Qwen-Image"
    )
    with pytest.raises(ModelLoadError, match="'hunyuan_image' is not supported"):
        open_text_encoders([demo_models / "text_encoders" / DEMO_QWEN25], "hunyuan_image")


@pytest.mark.parametrize(
    ("folder", "name", "advice"),
    [
        ("text_encoders", DEMO_QWEN25, "Qwen2.5-VL text encoder.*CLIPLoader \\(type qwen_image\\)"),
        ("vae", "loom_demo_qwen_image_vae.safetensors", "Wan / Qwen-Image VAE.*VAELoader"),
    ],
)
def test_other_files_given_to_unet_loader_say_which_loader(
    folder: str, name: str, advice: str, demo_models: Path
) -> None:
    with pytest.raises(ModelLoadError, match=advice):
        open_diffusion_model(demo_models / folder / name)


def test_vae_file_given_to_clip_loader_says_use_vae_loader(demo_models: Path) -> None:
    from nodes.demo.qwen_image import DEMO_QWEN_VAE

    with pytest.raises(ModelLoadError, match="not a text encoder; put it in models/vae"):
        open_text_encoders([demo_models / "vae" / DEMO_QWEN_VAE], "qwen_image")


def test_transformer_in_checkpoint_loader_says_use_the_component_loaders(demo_models: Path) -> None:
    from nodes.load.handles import open_checkpoint

    with pytest.raises(ModelLoadError, match="UNETLoader.*CLIPLoader \\(type qwen_image\\).*VAELoader"):
        open_checkpoint(demo_models / "diffusion_models" / DEMO_QWEN_IMAGE)


def test_conditioning_of_another_text_encoder_is_refused(demo_models: Path, tmp_path: Path) -> None:
    from safetensors.torch import save_file

    from nodes.demo.zimage import DEMO_QWEN3, demo_zimage_modules, zimage_files

    save_file(
        zimage_files(demo_zimage_modules(vae=False))[DEMO_QWEN3],
        str(demo_models / "text_encoders" / DEMO_QWEN3),
    )
    prompt = workflow()
    prompt["38"]["inputs"] |= {"clip_name": DEMO_QWEN3, "type": "lumina2"}
    result = run(make_executor(demo_models, tmp_path), prompt)
    assert result.status != "success" and result.error["node_id"] == "3"
    message = result.error["exception_message"]
    assert "48-wide embeddings but this Qwen-Image model expects 32" in message and "qwen_image" in message


def test_sd_vae_with_qwen_image_is_refused(demo_models: Path, tmp_path: Path) -> None:
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
    prompt["39"]["inputs"]["vae_name"] = "sd_vae.safetensors"
    prompt["3"]["inputs"]["steps"] = 1
    result = run(make_executor(demo_models, tmp_path), prompt)
    assert result.status != "success" and result.error["node_id"] == "8"
    assert "4-channel" in result.error["exception_message"]


# no network: tests/nodes/families/test_dit_workflows_offline.py, for every DiT family's workflow
