"""Small random-weight unCLIP and InstructPix2Pix checkpoints, in the single-file layouts users have:

- ``checkpoints/loom_demo_sd21_unclip.safetensors``: SD2.1 unCLIP layout: an SD2.x UNet whose
  ``label_emb`` takes [image embeds, noise-level embedding] (2 × 32), an OpenCLIP-layout text
  encoder under ``cond_stage_model.model.``, the demo VAE, and an OpenCLIP image tower (width 32,
  projection 32, 224 px) under ``embedder.model.visual.``
- ``checkpoints/loom_demo_sd15_ip2p.safetensors``: the SD1.5 demo with an 8-channel UNet input
  (InstructPix2Pix: the noisy latent and the source image's latent)
- ``clip_vision/loom_demo_siglip.safetensors``: a SigLIP vision tower in transformers' layout
  (width 48, 64 px, patch 16, no pooling head), like ``sigclip_vision_patch14_384.safetensors``
- ``style_models/loom_demo_flux_redux.safetensors``: the Redux image embedder layout
  (``redux_up`` / ``redux_down``) from the demo SigLIP's width to the Flux demo's T5 width (32)

The builders are reused by tests.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from nodes.demo.models import demo_modules, write_demo_file
from nodes.demo.vision import tiny_clip_vision
from nodes.families.build import ldm_state_dict
from nodes.families.catalog import SD15, SD2Unclip

DEMO_UNCLIP = "loom_demo_sd21_unclip.safetensors"
DEMO_IP2P = "loom_demo_sd15_ip2p.safetensors"
DEMO_SIGLIP = "loom_demo_siglip.safetensors"
DEMO_REDUX = "loom_demo_flux_redux.safetensors"
UNCLIP_VISION_PREFIX = "embedder.model.visual."


def unclip_modules(seed: int = 0, embed: int = 32) -> dict[str, Any]:
    """A tiny SD2.1 unCLIP: UNet with a projection class embedding of width 2 × ``embed``, an
    OpenCLIP-style text encoder (width 32), the demo VAE and a CLIP vision tower projecting to ``embed``."""
    from diffusers import UNet2DConditionModel  # lazy: diffusers is heavy to import
    from transformers import CLIPTextConfig, CLIPTextModel  # lazy: transformers is heavy to import

    base = demo_modules(seed)
    torch.manual_seed(seed + 5)
    unet: Any = UNet2DConditionModel(
        sample_size=32,
        in_channels=4,
        out_channels=4,
        block_out_channels=(32, 64),
        layers_per_block=1,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=32,
        attention_head_dim=(1, 1),
        use_linear_projection=True,
        norm_num_groups=32,
        class_embed_type="projection",
        projection_class_embeddings_input_dim=2 * embed,
    )
    with torch.no_grad():  # a visible class embedding: the image changes the output
        for p in unet.class_embedding.parameters():
            p.normal_(0, 0.5)
    text = CLIPTextModel(
        CLIPTextConfig(
            vocab_size=49408,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=1,
            max_position_embeddings=77,
            hidden_act="gelu",
            bos_token_id=49406,
            eos_token_id=49407,
            pad_token_id=1,
        )
    )
    vision = tiny_clip_vision(seed + 6, projection=embed)
    return {"unet": unet.eval(), "clip_h": text.eval(), "vae": base["vae"], "vision": vision}


def vision_to_open_clip(sd: dict[str, Any]) -> dict[str, Any]:
    """``CLIPVisionModelWithProjection`` weights → an OpenCLIP ``visual.*`` tower (prefix removed)."""

    simple = {
        "embeddings.patch_embedding.weight": "conv1.weight",
        "embeddings.class_embedding": "class_embedding",
        "embeddings.position_embedding.weight": "positional_embedding",
        "pre_layrnorm.weight": "ln_pre.weight",
        "pre_layrnorm.bias": "ln_pre.bias",
        "post_layernorm.weight": "ln_post.weight",
        "post_layernorm.bias": "ln_post.bias",
    }
    block = {
        "layer_norm1": "ln_1",
        "layer_norm2": "ln_2",
        "self_attn.out_proj": "attn.out_proj",
        "mlp.fc1": "mlp.c_fc",
        "mlp.fc2": "mlp.c_proj",
    }
    out: dict[str, Any] = {}
    qkv: dict[tuple[str, str], dict[str, Any]] = {}
    for key, value in sd.items():
        name = key.removeprefix("vision_model.")
        if key == "visual_projection.weight":
            out["proj"] = value.t().contiguous()
        elif name in simple:
            out[simple[name]] = value
        elif m := re.fullmatch(r"encoder\.layers\.(\d+)\.(.+)\.(weight|bias)", name):
            layer, inner, kind = m.groups()
            if inner in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"):
                qkv.setdefault((layer, kind), {})[inner[10]] = value
            elif inner in block:
                out[f"transformer.resblocks.{layer}.{block[inner]}.{kind}"] = value
    for (layer, kind), parts in qkv.items():
        out[f"transformer.resblocks.{layer}.attn.in_proj_{kind}"] = torch.cat(
            [parts["q"], parts["k"], parts["v"]]
        )
    return out


def unclip_checkpoint(modules: dict[str, Any]) -> dict[str, Any]:
    """The single-file state dict of ``unclip_modules``' output."""

    sd = ldm_state_dict(SD2Unclip(), {k: v for k, v in modules.items() if k != "vision"})
    for key, value in vision_to_open_clip(modules["vision"].state_dict()).items():
        sd[UNCLIP_VISION_PREFIX + key] = value.detach().contiguous()
    return sd


def ip2p_modules(seed: int = 0) -> dict[str, Any]:
    """The SD1.5 demo with an InstructPix2Pix UNet (8 input channels)."""
    from diffusers import UNet2DConditionModel  # lazy: diffusers is heavy to import

    base = demo_modules(seed)
    torch.manual_seed(seed + 7)
    cfg = dict(base["unet"].config)
    cfg["in_channels"] = 8
    unet: Any = UNet2DConditionModel.from_config(cfg)
    return {**base, "unet": unet.eval()}


def tiny_siglip(seed: int = 0, width: int = 48, image_size: int = 64, patch: int = 16) -> Any:
    """A transformers ``SiglipVisionModel`` without the pooling head (as ComfyUI's SigLIP files)."""
    from transformers import SiglipVisionConfig, SiglipVisionModel  # lazy: transformers is heavy to import

    torch.manual_seed(seed)
    cfg = SiglipVisionConfig(
        hidden_size=width,
        intermediate_size=2 * width,
        num_hidden_layers=2,
        num_attention_heads=1,
        image_size=image_size,
        patch_size=patch,
        vision_use_head=False,
    )
    return SiglipVisionModel(cfg).eval()


def redux_state_dict(redux_dim: int = 48, text_dim: int = 32, seed: int = 0) -> dict[str, Any]:
    """Random weights in the Redux image embedder layout."""

    g = torch.Generator().manual_seed(seed)
    return {
        "redux_up.weight": torch.randn(3 * text_dim, redux_dim, generator=g) * redux_dim**-0.5,
        "redux_up.bias": torch.zeros(3 * text_dim),
        "redux_down.weight": torch.randn(text_dim, 3 * text_dim, generator=g) * (3 * text_dim) ** -0.5,
        "redux_down.bias": torch.zeros(text_dim),
    }


def make_unclip_demo_models(models_dir: Path) -> list[Path]:
    """Write the demo unCLIP and InstructPix2Pix checkpoints, SigLIP and Redux (kept if present)."""

    folder = Path(models_dir) / "checkpoints"
    unclip_path, ip2p_path = folder / DEMO_UNCLIP, folder / DEMO_IP2P
    if not unclip_path.is_file():
        write_demo_file(
            unclip_path, {k: v.to(torch.float16) for k, v in unclip_checkpoint(unclip_modules()).items()}
        )
    if not ip2p_path.is_file():
        sd = ldm_state_dict(SD15(), ip2p_modules())
        write_demo_file(ip2p_path, {k: v.to(torch.float16).contiguous() for k, v in sd.items()})
    siglip_path = Path(models_dir) / "clip_vision" / DEMO_SIGLIP
    redux_path = Path(models_dir) / "style_models" / DEMO_REDUX
    if not siglip_path.is_file():
        tower = tiny_siglip().state_dict()  # ComfyUI's SigLIP files name the tower vision_model.*
        write_demo_file(
            siglip_path,
            {"vision_model." + k.removeprefix("vision_model."): v.contiguous() for k, v in tower.items()},
        )
    if not redux_path.is_file():
        write_demo_file(redux_path, redux_state_dict())
    return [unclip_path, ip2p_path, siglip_path, redux_path]
