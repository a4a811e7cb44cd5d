"""Tiny random Flux.1 models in the file layouts users have (random weights; they produce noise):
the transformer alone in Black Forest Labs' layout (``models/diffusion_models``: dev with the
guidance embedder, schnell without), the text encoders alone (``models/text_encoders``: CLIP-L with
``text_model.*`` names, T5 v1.1 with ``encoder.*``/``shared`` names) and the 16-channel VAE in the
LDM layout without quant convs, like ``ae.safetensors`` (``models/vae``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from nodes.core.parts import Part
from nodes.families.build import original_state_dict
from nodes.families.components import KLVae
from nodes.families.components.flux_dit import FluxTransformer, rope_axes
from nodes.families.components.t5_text import T5Text

DEMO_FLUX_DEV = "loom_demo_flux_dev.safetensors"
DEMO_FLUX_SCHNELL = "loom_demo_flux_schnell.safetensors"
DEMO_CLIP_L = "loom_demo_clip_l.safetensors"
DEMO_T5XXL = "loom_demo_t5xxl.safetensors"
DEMO_FLUX_VAE = "loom_demo_flux_ae.safetensors"
DEMO_CHROMA = "loom_demo_chroma.safetensors"
DEMO_FLUX_KONTEXT = "loom_demo_flux_kontext_dev.safetensors"  # Kontext dev: a Flux dev transformer


def demo_chroma_transformer(seed: int = 2) -> Any:
    """A tiny Chroma transformer (diffusers' ChromaTransformer2DModel) for the demo's T5 width."""
    from diffusers import ChromaTransformer2DModel  # lazy: diffusers is heavy to import

    torch.manual_seed(seed)
    model: Any = ChromaTransformer2DModel(
        patch_size=1,
        in_channels=64,
        num_layers=1,
        num_single_layers=2,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=32,
        axes_dims_rope=rope_axes(16),
        approximator_num_channels=16,
        approximator_hidden_dim=32,
        approximator_layers=2,
    )
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.05)
    return model.eval()


def demo_flux_modules(seed: int = 0, guidance: bool = True) -> dict[str, Any]:
    """The tiny Flux transformer, CLIP-L, T5 encoder and VAE (diffusers/transformers modules)."""
    from diffusers import AutoencoderKL, FluxTransformer2DModel  # lazy: diffusers is heavy to import
    from transformers import (  # lazy: transformers is heavy to import
        CLIPTextConfig,
        CLIPTextModel,
        T5Config,
        T5EncoderModel,
    )

    torch.manual_seed(seed)
    transformer: Any = FluxTransformer2DModel(
        patch_size=1,
        in_channels=64,
        num_layers=1,
        num_single_layers=2,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=32,
        pooled_projection_dim=32,
        guidance_embeds=guidance,
        axes_dims_rope=rope_axes(16),
    )
    with torch.no_grad():  # diffusers zero-initialises the output layers; random ones make the demo move
        for p in transformer.parameters():
            p.copy_(torch.randn_like(p) * 0.05)
    clip_l = CLIPTextModel(
        CLIPTextConfig(
            vocab_size=49408,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=1,
            max_position_embeddings=77,
            hidden_act="quick_gelu",
            bos_token_id=49406,
            eos_token_id=49407,
            pad_token_id=1,
        )
    )
    t5 = T5EncoderModel(
        T5Config(
            vocab_size=32128,
            d_model=32,
            d_kv=8,
            d_ff=64,
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
        scaling_factor=0.3611,
        shift_factor=0.1159,
    )
    return {"unet": transformer.eval(), "clip_l": clip_l.eval(), "t5xxl": t5.eval(), "vae": vae.eval()}


def flux_files(modules: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The demo's separate files (name → tensors) in the users' layouts."""

    transformer = modules["unet"]
    name = DEMO_FLUX_DEV if transformer.config.guidance_embeds else DEMO_FLUX_SCHNELL
    return {
        name: original_state_dict(
            Part.make("unet", FluxTransformer(), "", "", dict(transformer.config)), transformer
        ),
        DEMO_CLIP_L: {
            f"text_model.{k}": v
            for k, v in modules["clip_l"].state_dict().items()
            if not k.endswith("position_ids")
        },
        DEMO_T5XXL: T5Text().to_original(modules["t5xxl"].state_dict(), {}),
        DEMO_FLUX_VAE: original_state_dict(
            Part.make("vae", KLVae(), "", "vae", dict(modules["vae"].config)), modules["vae"]
        ),
    }


def make_flux_demo(models_dir: Path) -> list[Path]:
    """Write the Flux demo files under ``models_dir`` (dev, schnell, Kontext dev and Chroma share the T5
    encoder and the VAE; the Flux ones also CLIP-L). Kontext dev has dev's architecture (its files are
    Flux dev checkpoints; reference images make it an editor), with its own random weights."""

    folders = {
        DEMO_FLUX_DEV: "diffusion_models",
        DEMO_FLUX_SCHNELL: "diffusion_models",
        DEMO_CHROMA: "diffusion_models",
        DEMO_FLUX_KONTEXT: "diffusion_models",
        DEMO_CLIP_L: "text_encoders",
        DEMO_T5XXL: "text_encoders",
        DEMO_FLUX_VAE: "vae",
    }
    files = flux_files(demo_flux_modules(guidance=True))
    files[DEMO_FLUX_SCHNELL] = flux_files(demo_flux_modules(seed=1, guidance=False))[DEMO_FLUX_SCHNELL]
    files[DEMO_FLUX_KONTEXT] = flux_files(demo_flux_modules(seed=3, guidance=True))[DEMO_FLUX_DEV]
    chroma = demo_chroma_transformer()
    files[DEMO_CHROMA] = original_state_dict(
        Part.make("unet", FluxTransformer(approximator=True), "", "", dict(chroma.config)), chroma
    )
    written = []
    for name, tensors in files.items():
        path = Path(models_dir) / folders[name] / name
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file(
            {k: v.contiguous() for k, v in tensors.items()},
            str(path),
            metadata={"loom_note": "Loom demo model: random weights, produces noise."},
        )
        written.append(path)
    return written


def write_demo(models_dir: Path) -> list[Path]:
    """The Flux demo files for ``make-demo-model`` (none when Kontext's transformer, the last one
    written, is there already)."""
    if (Path(models_dir) / "diffusion_models" / DEMO_FLUX_KONTEXT).is_file():
        return []
    return make_flux_demo(models_dir)
