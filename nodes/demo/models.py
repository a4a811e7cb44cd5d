"""Small random-weight demo models, written in the layouts users download, so Loom runs out of the
box. Their images are noise: real checkpoints go in ``models/checkpoints``.

- ``checkpoints/loom_demo_sd15.safetensors``: SD1.5 architecture (original single-file layout,
  fp16), tiny: UNet channels (32, 64), CLIP text encoder width 32 with the real 49,408-token
  vocabulary, 4-level VAE so latents are 1/8 of the image size like real SD (~7 MB in all)
- ``vae/loom_demo_vae.safetensors``: the same VAE architecture, standalone original layout
- ``loras/loom_demo_lora.safetensors``: a kohya-format LoRA for the demo UNet and text encoder
- ``checkpoints/loom_demo_sdxl.safetensors``: SDXL architecture (two text encoders, pooled output,
  size/crop conditioning), equally tiny

The demo ControlNet for SD1.5 and the other control models are ``nodes.demo.control``'s. Every module
here that declares ``write_demo(models_dir)`` writes its files when ``make-demo-model`` runs
(:func:`make_demo_models` finds them).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from nodes.families.build import ldm_state_dict
from nodes.families.sd15 import SD15
from nodes.families.sdxl import SDXL

DEMO_CHECKPOINT = "loom_demo_sd15.safetensors"
DEMO_VAE = "loom_demo_vae.safetensors"
DEMO_LORA = "loom_demo_lora.safetensors"
DEMO_SDXL = "loom_demo_sdxl.safetensors"
DEMO_CONTROLNET = "loom_demo_controlnet_sd15.safetensors"
NOTE = "Loom demo model: random weights, produces noise. Put real checkpoints in models/checkpoints."


def demo_modules(seed: int = 0) -> dict[str, Any]:
    """The demo's UNet, text encoder and VAE (diffusers/transformers modules, seeded)."""
    from diffusers import AutoencoderKL, UNet2DConditionModel  # lazy: diffusers is heavy to import
    from transformers import CLIPTextConfig, CLIPTextModel  # lazy: transformers is heavy to import

    torch.manual_seed(seed)
    unet: Any = UNet2DConditionModel(
        sample_size=32,
        in_channels=4,
        out_channels=4,
        block_out_channels=(32, 64),
        layers_per_block=1,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=32,
        attention_head_dim=8,
        norm_num_groups=32,
    )
    text = CLIPTextModel(
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
    vae: Any = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        latent_channels=4,
        block_out_channels=(32, 32, 32, 32),
        layers_per_block=1,
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        norm_num_groups=32,
        sample_size=256,
    )
    return {"unet": unet.eval(), "clip_l": text.eval(), "vae": vae.eval()}


def demo_sdxl_modules(seed: int = 0) -> dict[str, Any]:
    """A tiny SDXL: UNet with text_time embedding, CLIP-L and CLIP-G (with projection), 4-level VAE."""
    from diffusers import UNet2DConditionModel  # lazy: diffusers is heavy to import
    from transformers import (  # lazy: transformers is heavy to import
        CLIPTextConfig,
        CLIPTextModel,
        CLIPTextModelWithProjection,
    )

    base = demo_modules(seed)
    torch.manual_seed(seed + 1)
    unet: Any = UNet2DConditionModel(
        sample_size=32,
        in_channels=4,
        out_channels=4,
        block_out_channels=(32, 64),
        layers_per_block=1,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=64,
        attention_head_dim=(1, 1),
        use_linear_projection=True,
        norm_num_groups=32,
        transformer_layers_per_block=(1, 2),
        addition_embed_type="text_time",
        addition_time_embed_dim=8,
        projection_class_embeddings_input_dim=32 + 6 * 8,
    )
    clip_g = CLIPTextModelWithProjection(
        CLIPTextConfig(
            vocab_size=49408,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=3,
            num_attention_heads=1,
            max_position_embeddings=77,
            hidden_act="gelu",
            bos_token_id=49406,
            eos_token_id=49407,
            pad_token_id=1,
            projection_dim=32,
        )
    )
    clip_l: Any = CLIPTextModel(base["clip_l"].config)
    clip_l.load_state_dict(base["clip_l"].state_dict())
    return {"unet": unet.eval(), "clip_l": clip_l.eval(), "clip_g": clip_g.eval(), "vae": base["vae"]}


def demo_lora(modules: dict[str, Any], rank: int = 4, seed: int = 1) -> dict[str, Any]:
    """A kohya-format LoRA (``lora_unet_*`` / ``lora_te_*``) for the attention projections."""

    gen = torch.Generator().manual_seed(seed)
    out: dict[str, Any] = {}
    targets = [
        ("lora_unet_", modules["unet"], (".to_q", ".to_k", ".to_v", ".to_out.0")),
        ("lora_te_text_model_", modules["clip_l"], ("q_proj", "k_proj", "v_proj", "out_proj")),
    ]
    for prefix, module, suffixes in targets:
        for name, sub in module.named_modules():
            if isinstance(sub, torch.nn.Linear) and name.endswith(suffixes):
                key = prefix + name.replace(".", "_")
                out[f"{key}.lora_down.weight"] = torch.randn(rank, sub.in_features, generator=gen) * 0.1
                out[f"{key}.lora_up.weight"] = torch.randn(sub.out_features, rank, generator=gen) * 0.1
                out[f"{key}.alpha"] = torch.tensor(float(rank))
    return {k: v.to(torch.float16) if k.endswith("weight") else v for k, v in out.items()}


def demo_controlnet(unet: Any, seed: int = 3) -> Any:
    """A ControlNetModel for ``unet``: its encoder copied, a small hint encoder, random output convs
    (a real ControlNet's start at zero; random ones make the demo's control visible)."""
    from diffusers import ControlNetModel  # lazy: diffusers is heavy to import

    torch.manual_seed(seed)
    cn: Any = ControlNetModel.from_unet(unet, conditioning_embedding_out_channels=(8, 8, 16, 16))
    with torch.no_grad():
        for name, p in cn.named_parameters():
            if name.startswith(
                ("controlnet_down_blocks", "controlnet_mid_block", "controlnet_cond_embedding.conv_out")
            ):
                p.normal_(0, 0.1)
    return cn.eval()


def write_demo_file(path: Path, tensors: dict[str, Any]) -> None:
    """``tensors`` as a safetensors file at ``path`` with the demo note, written whole or not at all."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    save_file(tensors, str(tmp), metadata={"format": "pt", "loom.note": NOTE})
    tmp.replace(path)  # never leave a half-written model behind


def write_demo(models_dir: Path) -> list[Path]:
    """Write the SD1.5 and SDXL demo checkpoints, the standalone VAE and the LoRA under ``models_dir``
    (existing ones are kept); return their paths."""
    models_dir = Path(models_dir)
    paths = [
        models_dir / "checkpoints" / DEMO_CHECKPOINT,
        models_dir / "vae" / DEMO_VAE,
        models_dir / "loras" / DEMO_LORA,
        models_dir / "checkpoints" / DEMO_SDXL,
    ]
    if all(p.is_file() for p in paths):
        return paths
    modules = demo_modules()
    full = ldm_state_dict(SD15(), modules)
    half = {k: v.to(torch.float16).contiguous() for k, v in full.items()}
    vae = {
        k.removeprefix("first_stage_model."): v for k, v in half.items() if k.startswith("first_stage_model.")
    }
    sdxl = {
        k: v.to(torch.float16).contiguous() for k, v in ldm_state_dict(SDXL(), demo_sdxl_modules()).items()
    }
    for path, tensors in zip(paths, (half, vae, demo_lora(modules), sdxl), strict=True):
        if not path.is_file():
            write_demo_file(path, tensors)
    return paths


def demo_writers() -> list[Callable[[Path], list[Path]]]:
    """Every demo module's ``write_demo`` (a module that declares one writes its files when
    ``make-demo-model`` runs): this module's first, then the others by name. The writers are found, not
    listed: a family's demo is a module here with a ``write_demo``."""
    package = importlib.import_module("nodes.demo")
    writers: list[Callable[[Path], list[Path]]] = [write_demo]
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda info: info.name):
        module = importlib.import_module(f"nodes.demo.{info.name}")
        writer = getattr(module, "write_demo", None)
        if writer is not None and writer is not write_demo:
            writers.append(writer)
    return writers


def make_demo_models(models_dir: Path) -> list[Path]:
    """Write every demo module's files under ``models_dir`` (existing ones are kept); return their paths."""
    return [path for writer in demo_writers() for path in writer(Path(models_dir))]
