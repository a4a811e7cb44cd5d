"""A tiny random Wan 2.1 text-to-video model in the file layouts users have (random weights; it produces
noise): the transformer alone in the original Wan layout (``models/diffusion_models``, like ComfyUI's
``wan2.1_t2v_1.3B_fp16.safetensors``: ``patch_embedding``, ``blocks.N.self_attn.q``, ``head.head``...),
an image-to-video transformer beside it (like ``wan2.1_i2v_480p_14B_fp16.safetensors``: 36 input
channels, ``img_emb`` for the demo CLIP vision model's 32-wide tokens, ``cross_attn.k_img/v_img``),
the umT5 text encoder (``models/text_encoders``, like ``umt5_xxl_fp16.safetensors``, its tokenizer
inside; :mod:`nodes.demo.umt5`) and the Wan 2.1 VAE in Wan's own layout (``models/vae``, like
``wan_2.1_vae.safetensors``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from nodes.core.parts import Part
from nodes.demo.models import write_demo_file
from nodes.demo.umt5 import DEMO_UMT5, DEMO_UMT5_WIDTH, write_umt5
from nodes.families.build import original_state_dict
from nodes.families.components.wan_dit import WanTransformer
from nodes.families.components.wan_vae import WanVae

DEMO_WAN = "loom_demo_wan2.1_t2v_fp16.safetensors"
DEMO_WAN_VAE = "loom_demo_wan_2.1_vae.safetensors"
DEMO_WAN_I2V = "loom_demo_wan2.1_i2v_fp16.safetensors"
DEMO_CLIP_VISION_WIDTH = 32  # nodes.demo.vision's tiny CLIP vision model (its hidden size)


def demo_wan_transformer(seed: int = 0, text_width: int = DEMO_UMT5_WIDTH) -> Any:
    """A tiny ``WanTransformer3DModel``: one 128-wide head (Wan's head width), 2 blocks, FFN 256."""
    from diffusers import WanTransformer3DModel  # lazy: diffusers is heavy to import

    torch.manual_seed(seed)
    model: Any = WanTransformer3DModel(
        num_attention_heads=1, attention_head_dim=128, in_channels=16, out_channels=16, text_dim=text_width,
        freq_dim=256, ffn_dim=256, num_layers=2, cross_attn_norm=True,
    )  # fmt: skip
    with torch.no_grad():  # a little more randomness, so the model visibly moves the latent
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    return model.eval()


def demo_wan_i2v_transformer(
    seed: int = 0, text_width: int = DEMO_UMT5_WIDTH, image_width: int = DEMO_CLIP_VISION_WIDTH
) -> Any:
    """A tiny Wan 2.1 image-to-video ``WanTransformer3DModel``: the t2v shape with 36 input channels (the
    latent, the 4-channel mask, the start frames' latent), an image embedder for ``image_width``-wide
    CLIP vision tokens (the demo CLIP vision model's: 32) and image keys/values in every block."""
    from diffusers import WanTransformer3DModel  # lazy: diffusers is heavy to import

    torch.manual_seed(seed)
    model: Any = WanTransformer3DModel(
        num_attention_heads=1, attention_head_dim=128, in_channels=36, out_channels=16, text_dim=text_width,
        freq_dim=256, ffn_dim=256, num_layers=2, cross_attn_norm=True, image_dim=image_width,
        added_kv_proj_dim=128,
    )  # fmt: skip
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    return model.eval()


def demo_wan_vae(seed: int = 0) -> Any:
    """A tiny Wan 2.1 VAE (diffusers' ``AutoencoderKLWan``; 1/8 in space, 1/4 in time)."""
    from diffusers import AutoencoderKLWan  # lazy: diffusers is heavy to import

    torch.manual_seed(seed)
    model: Any = AutoencoderKLWan(base_dim=8, dim_mult=[1, 2, 2, 2], num_res_blocks=1)
    return model.eval()


def wan_transformer_file(model: Any, dtype: torch.dtype = torch.float16) -> dict[str, torch.Tensor]:
    """``model``'s weights in the original Wan layout, in ``dtype``."""
    sd = WanTransformer().to_original(model.state_dict(), model.config)
    return {k: v.detach().to(dtype).contiguous() for k, v in sd.items()}


def make_wan_demo(models_dir: Path, seed: int = 0) -> list[Path]:
    """Write the four Wan demo files under ``models_dir`` (each in its folder); return their paths."""
    models_dir = Path(models_dir)
    unet = models_dir / "diffusion_models" / DEMO_WAN
    write_demo_file(unet, wan_transformer_file(demo_wan_transformer(seed)))
    i2v = models_dir / "diffusion_models" / DEMO_WAN_I2V
    write_demo_file(i2v, wan_transformer_file(demo_wan_i2v_transformer(seed)))
    text = write_umt5(models_dir / "text_encoders" / DEMO_UMT5, seed)
    vae_model = demo_wan_vae(seed)
    part = Part.make("vae", WanVae(), "", "vae", dict(vae_model.config))
    vae = models_dir / "vae" / DEMO_WAN_VAE
    write_demo_file(vae, {k: v.contiguous() for k, v in original_state_dict(part, vae_model).items()})
    return [unet, i2v, text, vae]


def write_demo(models_dir: Path) -> list[Path]:
    """The Wan demo files for ``make-demo-model`` (kept when they exist)."""
    models_dir = Path(models_dir)
    paths = (
        models_dir / "diffusion_models" / DEMO_WAN,
        models_dir / "diffusion_models" / DEMO_WAN_I2V,
        models_dir / "text_encoders" / DEMO_UMT5,
        models_dir / "vae" / DEMO_WAN_VAE,
    )
    return [] if all(p.is_file() for p in paths) else make_wan_demo(models_dir)
