"""Tiny random SD3.5-medium-like models in the file layouts users have (random weights; they
produce noise): the MMDiT-X transformer with q/k norms (``models/diffusion_models``, SAI's layout),
the text encoders alone (``models/text_encoders``: CLIP-L with ``text_model.*`` names, CLIP-G with
32 layers — ComfyUI tells CLIP-G by its 32nd layer — and ``text_projection.weight``, T5 v1.1), the
16-channel VAE (``models/vae``), and two checkpoints (``models/checkpoints``): transformer + VAE as
SAI ships ``sd3.5_*.safetensors``, and an all-in-one one with ``text_encoders.*`` as ComfyUI saves."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from nodes.core.parts import Part
from nodes.families.build import original_state_dict
from nodes.families.components import KLVae
from nodes.families.components.sd3_dit import SD3Transformer
from nodes.families.components.sd3_text import NestedClipText
from nodes.families.components.t5_text import T5Text

DEMO_SD35 = "loom_demo_sd35_medium.safetensors"  # checkpoints: transformer + VAE (SAI's layout)
DEMO_SD35_AIO = "loom_demo_sd35_medium_incl_clips.safetensors"  # checkpoints: + text encoders
DEMO_SD3_MMDIT = "loom_demo_sd35_medium_mmdit.safetensors"  # diffusion_models: transformer only
DEMO_SD3_CLIP_L = "loom_demo_sd3_clip_l.safetensors"
DEMO_SD3_CLIP_G = "loom_demo_sd3_clip_g.safetensors"
DEMO_SD3_T5XXL = "loom_demo_sd3_t5xxl.safetensors"
DEMO_SD3_VAE = "loom_demo_sd3_vae.safetensors"
CLIP_WIDTH, T5_WIDTH = 32, 64  # CLIP-L ‖ CLIP-G (64) fits T5's width, as 2048 fits 4096


def demo_sd3_transformer(seed: int = 0, *, qk_norm: bool = True, dual: tuple[int, ...] = (0,)) -> Any:
    """A tiny ``SD3Transformer2DModel``: 3 joint blocks, 2 heads of 16 (with q/k norms) or 1 of 32."""
    from diffusers import SD3Transformer2DModel  # lazy: diffusers is heavy to import

    torch.manual_seed(seed)
    heads, head = (2, 16) if qk_norm else (1, 32)
    model: Any = SD3Transformer2DModel(
        sample_size=16,
        patch_size=2,
        in_channels=16,
        num_layers=3,
        attention_head_dim=head,
        num_attention_heads=heads,
        joint_attention_dim=T5_WIDTH,
        caption_projection_dim=32,
        pooled_projection_dim=2 * CLIP_WIDTH,
        out_channels=16,
        pos_embed_max_size=32,
        dual_attention_layers=dual,
        qk_norm="rms_norm" if qk_norm else None,
    )
    with torch.no_grad():  # diffusers zero-initialises the output layers; random ones make the demo move
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.05)
    return model.eval()


def demo_sd3_modules(seed: int = 0) -> dict[str, Any]:
    """The tiny transformer, CLIP-L, CLIP-G (with projection), T5 encoder and VAE."""
    from diffusers import AutoencoderKL  # lazy: diffusers is heavy to import
    from transformers import (  # lazy: transformers is heavy to import
        CLIPTextConfig,
        CLIPTextModel,
        CLIPTextModelWithProjection,
        T5Config,
        T5EncoderModel,
    )

    transformer = demo_sd3_transformer(seed)
    torch.manual_seed(seed + 1)
    common: dict[str, Any] = {
        "vocab_size": 49408,
        "hidden_size": CLIP_WIDTH,
        "intermediate_size": 64,
        "num_attention_heads": 1,
        "max_position_embeddings": 77,
        "bos_token_id": 49406,
        "eos_token_id": 49407,
        "pad_token_id": 1,
    }
    clip_l = CLIPTextModel(CLIPTextConfig(**common, num_hidden_layers=2, hidden_act="quick_gelu"))
    clip_g = CLIPTextModelWithProjection(
        CLIPTextConfig(**common, num_hidden_layers=32, hidden_act="gelu", projection_dim=CLIP_WIDTH)
    )
    t5 = T5EncoderModel(
        T5Config(
            vocab_size=32128,
            d_model=T5_WIDTH,
            d_kv=16,
            d_ff=128,
            num_layers=2,
            num_heads=4,
            relative_attention_num_buckets=32,
            relative_attention_max_distance=128,
            feed_forward_proj="gated-gelu",
            is_encoder_decoder=False,
            use_cache=False,
        )
    )
    vae: Any = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        latent_channels=16,
        block_out_channels=(32, 32, 32, 32),
        layers_per_block=1,
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        norm_num_groups=32,
        sample_size=256,
        use_quant_conv=False,
        use_post_quant_conv=False,
        scaling_factor=1.5305,
        shift_factor=0.0609,
    )
    return {
        "unet": transformer,
        "clip_l": clip_l.eval(),
        "clip_g": clip_g.eval(),
        "t5xxl": t5.eval(),
        "vae": vae.eval(),
    }


def sd3_files(modules: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The demo's separate files (name → tensors) in the users' layouts."""

    transformer = modules["unet"]
    return {
        DEMO_SD3_MMDIT: original_state_dict(
            Part.make("unet", SD3Transformer(), "", "", dict(transformer.config)), transformer
        ),
        DEMO_SD3_CLIP_L: {
            f"text_model.{k}": v
            for k, v in modules["clip_l"].state_dict().items()
            if not k.endswith("position_ids")
        },
        DEMO_SD3_CLIP_G: NestedClipText().to_original(modules["clip_g"].state_dict(), {}),
        DEMO_SD3_T5XXL: T5Text().to_original(modules["t5xxl"].state_dict(), {}),
        DEMO_SD3_VAE: original_state_dict(
            Part.make("vae", KLVae(), "", "vae", dict(modules["vae"].config)), modules["vae"]
        ),
    }


def checkpoint_tensors(files: dict[str, dict[str, Any]], *, text_encoders: bool) -> dict[str, Any]:
    """A single-file checkpoint from the separate files: ``model.diffusion_model.`` and
    ``first_stage_model.``, and with ``text_encoders`` ComfyUI's ``text_encoders.*.transformer.``."""
    out = {f"model.diffusion_model.{k}": v for k, v in files[DEMO_SD3_MMDIT].items()}
    out |= {f"first_stage_model.{k}": v for k, v in files[DEMO_SD3_VAE].items()}
    if text_encoders:
        for name, file in (
            ("clip_l", DEMO_SD3_CLIP_L),
            ("clip_g", DEMO_SD3_CLIP_G),
            ("t5xxl", DEMO_SD3_T5XXL),
        ):
            out |= {f"text_encoders.{name}.transformer.{k}": v for k, v in files[file].items()}
    return out


def make_sd3_demo(models_dir: Path) -> list[Path]:
    """Write the SD3 demo files under ``models_dir`` (kept if present); return their paths."""

    folders = {
        DEMO_SD3_MMDIT: "diffusion_models",
        DEMO_SD3_CLIP_L: "text_encoders",
        DEMO_SD3_CLIP_G: "text_encoders",
        DEMO_SD3_T5XXL: "text_encoders",
        DEMO_SD3_VAE: "vae",
        DEMO_SD35: "checkpoints",
        DEMO_SD35_AIO: "checkpoints",
    }
    paths = [Path(models_dir) / folder / name for name, folder in folders.items()]
    if all(p.is_file() for p in paths):
        return paths
    files = sd3_files(demo_sd3_modules())
    files[DEMO_SD35] = checkpoint_tensors(files, text_encoders=False)
    files[DEMO_SD35_AIO] = checkpoint_tensors(files, text_encoders=True)
    for name, folder in folders.items():
        path = Path(models_dir) / folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file(
            {k: v.contiguous() for k, v in files[name].items()},
            str(path),
            metadata={"loom_note": "Loom demo model: random weights, produces noise."},
        )
    return paths


def write_demo(models_dir: Path) -> list[Path]:
    """The SD3 demo files for ``make-demo-model`` (kept if present)."""
    return make_sd3_demo(models_dir)
