"""A tiny random Z-Image model in the file layouts users have (random weights; it produces noise):
the transformer alone in the original layout (``models/diffusion_models``, like
``z_image_turbo_bf16.safetensors``), the Qwen3 text encoder alone with ComfyUI's ``model.`` names and
the real 151,936-token vocabulary (``models/text_encoders``, like ``qwen_3_4b.safetensors``), and the
16-channel Flux VAE, shared with the Flux demo (``models/vae``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from nodes.core.parts import Part
from nodes.demo.flux import DEMO_FLUX_VAE, demo_flux_modules
from nodes.families.build import original_state_dict
from nodes.families.components import KLVae
from nodes.families.components.qwen_text import QWEN3_CONSTANTS
from nodes.families.components.zimage_dit import ZImageTransformer, rope_axes

DEMO_ZIMAGE = "loom_demo_z_image_turbo.safetensors"
DEMO_QWEN3 = "loom_demo_qwen_3_4b.safetensors"
QWEN3_VOCAB = 151936  # Qwen3's embedding rows (the tokenizer uses ids up to 151668)


def demo_zimage_modules(seed: int = 0, vae: bool = True) -> dict[str, Any]:
    """The tiny Z-Image transformer (diffusers), Qwen3 encoder (transformers) and (``vae``) the Flux demo VAE."""
    from diffusers import ZImageTransformer2DModel  # lazy: diffusers is heavy to import
    from transformers import Qwen3Config, Qwen3Model  # lazy: transformers is heavy to import

    torch.manual_seed(seed)
    transformer: Any = ZImageTransformer2DModel(
        all_patch_size=(2,),
        all_f_patch_size=(1,),
        in_channels=16,
        dim=64,
        n_layers=2,
        n_refiner_layers=1,
        n_heads=2,
        n_kv_heads=2,
        cap_feat_dim=48,
        axes_dims=rope_axes(32),
        axes_lens=[1536, 512, 512],
    )
    with (
        torch.no_grad()
    ):  # diffusers zero-initialises the pad tokens and some layers; random ones make it move
        for p in transformer.parameters():
            p.copy_(torch.randn_like(p) * 0.05)
    qwen = Qwen3Model(
        Qwen3Config(
            vocab_size=QWEN3_VOCAB,
            hidden_size=48,
            intermediate_size=64,
            num_hidden_layers=3,
            num_attention_heads=6,
            num_key_value_heads=2,
            head_dim=8,
            tie_word_embeddings=True,
            use_cache=False,
            **QWEN3_CONSTANTS,
        )
    )
    modules = {"unet": transformer.eval(), "qwen3_4b": qwen.eval()}
    return modules | ({"vae": demo_flux_modules()["vae"]} if vae else {})


def zimage_files(modules: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The demo's transformer and text-encoder files (name → tensors) in the users' layouts."""

    transformer = modules["unet"]
    return {
        DEMO_ZIMAGE: original_state_dict(
            Part.make("unet", ZImageTransformer(), "", "", dict(transformer.config)), transformer
        ),
        DEMO_QWEN3: {f"model.{k}": v for k, v in modules["qwen3_4b"].state_dict().items()},
    }


def make_zimage_demo(models_dir: Path) -> list[Path]:
    """Write the Z-Image demo files under ``models_dir`` (the VAE only if the Flux demo has not); return
    the paths written."""

    vae_path = Path(models_dir) / "vae" / DEMO_FLUX_VAE
    modules = demo_zimage_modules(vae=not vae_path.is_file())
    files = {
        ("diffusion_models", name) if name == DEMO_ZIMAGE else ("text_encoders", name): tensors
        for name, tensors in zimage_files(modules).items()
    }
    if "vae" in modules:
        vae = modules["vae"]
        files[("vae", DEMO_FLUX_VAE)] = original_state_dict(
            Part.make("vae", KLVae(), "", "vae", dict(vae.config)), vae
        )
    written = []
    for (folder, name), tensors in files.items():
        path = Path(models_dir) / folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file(
            {k: v.contiguous() for k, v in tensors.items()},
            str(path),
            metadata={"loom_note": "Loom demo model: random weights, produces noise."},
        )
        written.append(path)
    return written


def write_demo(models_dir: Path) -> list[Path]:
    """The Z-Image demo files for ``make-demo-model`` (none when its transformer is there already)."""
    if (Path(models_dir) / "diffusion_models" / DEMO_ZIMAGE).is_file():
        return []
    return make_zimage_demo(models_dir)
