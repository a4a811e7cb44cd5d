"""A tiny random Qwen-Image model in the file layouts users have (random weights; it produces noise):
the transformer alone with diffusers' names (``models/diffusion_models``, like
``qwen_image_fp8_e4m3fn.safetensors``), the Qwen2.5-VL text encoder alone with ComfyUI's names (the
language model under ``model.``, an ``lm_head`` the loader skips, and a tiny Qwen2.5-VL vision tower
under ``visual.`` that Qwen-Image-Edit's nodes read pictures with) and the real 152,064-token
vocabulary (``models/text_encoders``, like ``qwen_2.5_vl_7b.safetensors``), and the Wan 2.1 VAE in
Wan's own layout (``models/vae``, like ``qwen_image_vae.safetensors``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from nodes.core.parts import Part
from nodes.core.weights import read_index
from nodes.families.build import original_state_dict
from nodes.families.components import qwen25_vision
from nodes.families.components.qwen25_text import QWEN25_CONSTANTS, TEST_HEAD_DIM
from nodes.families.components.qwen25_vision import (
    WINDOW_SIZE,
    Qwen25Vision,
    full_attention_blocks,
)
from nodes.families.components.qwen_image_dit import rope_axes
from nodes.families.components.wan_vae import WanVae
from nodes.families.components.wan_vae_module import QwenImageVae2D

DEMO_QWEN_IMAGE = "loom_demo_qwen_image.safetensors"
DEMO_QWEN25 = "loom_demo_qwen_2.5_vl_7b.safetensors"
DEMO_QWEN_VAE = "loom_demo_qwen_image_vae.safetensors"
QWEN25_VOCAB = 152064  # Qwen2.5-VL's embedding rows (the tokenizer uses ids up to 151668)
TEXT_WIDTH = 32  # narrower than the Z-Image demo's Qwen3 (48), so mixing the two is caught
VISION_WIDTH = 16  # one 16-wide head; two blocks (the first windowed, the last with full attention)


def demo_qwen_image_modules(seed: int = 0) -> dict[str, Any]:
    """The tiny transformer (diffusers, ComfyUI's positions), Qwen2.5 text model and vision tower
    (transformers) and VAE."""
    from diffusers import QwenImageTransformer2DModel  # lazy: diffusers is heavy to import
    from transformers import Qwen2Config, Qwen2Model  # lazy: transformers is heavy to import

    torch.manual_seed(seed)
    transformer: Any = QwenImageTransformer2DModel(
        patch_size=2,
        in_channels=64,
        out_channels=16,
        num_layers=2,
        attention_head_dim=32,
        num_attention_heads=2,
        joint_attention_dim=TEXT_WIDTH,
        axes_dims_rope=tuple(rope_axes(32)),
    )
    with torch.no_grad():  # diffusers zero-initialises some layers; random ones make the model move
        for p in transformer.parameters():
            p.copy_(torch.randn_like(p) * 0.05)
    constants: dict[str, Any] = {
        "head_dim": TEST_HEAD_DIM,
        **QWEN25_CONSTANTS,
    }  # heads narrower than width/heads
    qwen = Qwen2Model(
        Qwen2Config(
            vocab_size=QWEN25_VOCAB,
            hidden_size=TEXT_WIDTH,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=TEXT_WIDTH // TEST_HEAD_DIM,
            num_key_value_heads=1,
            tie_word_embeddings=False,
            use_cache=False,
            use_sliding_window=False,
            **constants,
        )
    )
    vae: Any = QwenImageVae2D(base_dim=8)
    return {
        "unet": transformer.eval(),
        "qwen25_7b": qwen.eval(),
        "visual": demo_vision_tower(),
        "vae": vae.eval(),
    }


def demo_vision_tower(depth: int = 2) -> Any:
    """A tiny Qwen2.5-VL vision tower (real patch and merge sizes) whose tokens are the demo text
    model's width; its constants are the ones Loom reads such a file with."""
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import (
        Qwen2_5_VLVisionConfig,  # lazy: transformers is heavy to import
    )
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import (
        Qwen2_5_VisionTransformerPretrainedModel,  # lazy: transformers is heavy to import
    )

    config = Qwen2_5_VLVisionConfig(
        depth=depth,
        hidden_size=VISION_WIDTH,
        intermediate_size=32,
        num_heads=VISION_WIDTH // qwen25_vision.TEST_HEAD_DIM,
        out_hidden_size=TEXT_WIDTH,
        window_size=WINDOW_SIZE,
        fullatt_block_indexes=full_attention_blocks(depth),
    )
    return Qwen2_5_VisionTransformerPretrainedModel(config).eval()


def qwen_image_files(modules: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The demo's three files (name → tensors) in the users' layouts."""

    generator = torch.Generator().manual_seed(1)
    text = {f"model.{k}": v for k, v in modules["qwen25_7b"].state_dict().items()}
    text["lm_head.weight"] = (torch.randn(QWEN25_VOCAB, TEXT_WIDTH, generator=generator) * 0.02).to(
        torch.bfloat16
    )
    text |= {f"visual.{k}": v for k, v in modules["visual"].state_dict().items()}
    vae = modules["vae"]
    return {
        DEMO_QWEN_IMAGE: dict(modules["unet"].state_dict()),
        DEMO_QWEN25: text,
        DEMO_QWEN_VAE: original_state_dict(Part.make("vae", WanVae(), "", "vae", dict(vae.config)), vae),
    }


FOLDERS = {DEMO_QWEN_IMAGE: "diffusion_models", DEMO_QWEN25: "text_encoders", DEMO_QWEN_VAE: "vae"}


def qwen_image_demo_is_current(models_dir: Path) -> bool:
    """Whether ``models_dir`` holds this version's demo files (older demo text encoders lack the
    vision tower that the Qwen-Image-Edit example needs)."""

    folder = Path(models_dir)
    text = folder / FOLDERS[DEMO_QWEN25] / DEMO_QWEN25
    return (folder / FOLDERS[DEMO_QWEN_IMAGE] / DEMO_QWEN_IMAGE).is_file() and (
        text.is_file() and Qwen25Vision.present(read_index(text))
    )


def make_qwen_image_demo(models_dir: Path) -> list[Path]:
    """Write the Qwen-Image demo files under ``models_dir``; return their paths."""
    return write_qwen_image_files(models_dir, demo_qwen_image_modules())


def write_qwen_image_files(models_dir: Path, modules: dict[str, Any]) -> list[Path]:
    """Write ``modules`` (as :func:`demo_qwen_image_modules` makes them) as the three files, each in
    its ``models_dir`` folder."""

    written = []
    for name, tensors in qwen_image_files(modules).items():
        path = Path(models_dir) / FOLDERS[name] / name
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file(
            {k: v.contiguous() for k, v in tensors.items()},
            str(path),
            metadata={"loom_note": "Loom demo model: random weights, produces noise."},
        )
        written.append(path)
    return written


def write_demo(models_dir: Path) -> list[Path]:
    """The Qwen-Image demo files for ``make-demo-model`` (rewritten when they are an older version's)."""
    return [] if qwen_image_demo_is_current(models_dir) else make_qwen_image_demo(models_dir)
