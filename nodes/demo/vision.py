"""Small random-weight CLIP vision, IP-Adapter and safety checker files for the demo checkpoint.

- ``clip_vision/loom_demo_clip_vision/model.safetensors`` (+ ``config.json``): transformers'
  ``CLIPVisionModelWithProjection`` layout, 224 px input, patch 32, width 32, projection 32
- ``ipadapter/loom_demo_ip-adapter_sd15.safetensors``: the ip-adapter_sd15 layout
  (``image_proj.proj/norm``, ``ip_adapter.{1,3,...}.to_k_ip/to_v_ip``) for the demo UNet
  (cross-attention width 32, see ``nodes/demo/models.py``) and the demo CLIP vision model
- ``safety/loom_demo_safety/model.safetensors`` (+ ``config.json``): diffusers'
  ``StableDiffusionSafetyChecker`` layout; thresholds set so random images pass (nothing is flagged)

The builders are reused by tests with tiny models of their own.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from nodes.demo.models import demo_modules

DEMO_CLIP_VISION = "loom_demo_clip_vision/model.safetensors"
DEMO_IPADAPTER = "loom_demo_ip-adapter_sd15.safetensors"
DEMO_SAFETY = "loom_demo_safety/model.safetensors"
_NOTE = (
    "Loom demo model: random weights. Put real models in models/clip_vision, models/ipadapter, models/safety."
)


def tiny_vision_config(
    width: int = 32, layers: int = 2, projection: int = 32, image_size: int = 224, patch: int = 32
) -> dict[str, Any]:
    """A CLIPVisionConfig dict. One head per 64 channels (at least one), like the inferred configs."""
    return {
        "hidden_size": width,
        "intermediate_size": 2 * width,
        "num_hidden_layers": layers,
        "num_attention_heads": max(1, width // 64),
        "image_size": image_size,
        "patch_size": patch,
        "projection_dim": projection,
        "hidden_act": "gelu",
        "layer_norm_eps": 1e-5,
        "num_channels": 3,
    }


def tiny_clip_vision(seed: int = 0, **config: Any) -> Any:
    from transformers import (  # lazy: transformers is heavy to import
        CLIPVisionConfig,
        CLIPVisionModelWithProjection,
    )

    torch.manual_seed(seed)
    return CLIPVisionModelWithProjection(CLIPVisionConfig(**tiny_vision_config(**config))).eval()


def ip_adapter_state_dict(
    unet: Any, clip_embed_dim: int, tokens: int = 4, seed: int = 0, scale: float = 0.2
) -> dict[str, Any]:
    """Random weights in the ip-adapter_sd15 layout for ``unet`` (a diffusers UNet2DConditionModel)."""

    gen = torch.Generator().manual_seed(seed)
    cross = int(unet.config.cross_attention_dim)
    sd: dict[str, Any] = {
        "image_proj.proj.weight": torch.randn(tokens * cross, clip_embed_dim, generator=gen) * scale,
        "image_proj.proj.bias": torch.randn(tokens * cross, generator=gen) * scale,
        "image_proj.norm.weight": 1 + torch.randn(cross, generator=gen) * scale,
        "image_proj.norm.bias": torch.randn(cross, generator=gen) * scale,
    }
    for key_id, name in enumerate(unet.attn_processors):
        if name.endswith("attn2.processor"):
            attn = unet.get_submodule(name.removesuffix(".processor"))
            out = attn.to_k.out_features
            sd[f"ip_adapter.{key_id}.to_k_ip.weight"] = torch.randn(out, cross, generator=gen) * scale
            sd[f"ip_adapter.{key_id}.to_v_ip.weight"] = torch.randn(out, cross, generator=gen) * scale
    return sd


def tiny_safety_checker(seed: int = 0, width: int = 32, projection: int = 32, flag: bool = False) -> Any:
    """A diffusers StableDiffusionSafetyChecker; ``flag`` sets thresholds so every image is flagged
    (thresholds -1: any cosine passes) or none is (thresholds 2: no cosine reaches them)."""
    from diffusers.pipelines.stable_diffusion.safety_checker import (
        StableDiffusionSafetyChecker,  # lazy: diffusers is heavy to import
    )
    from transformers import CLIPConfig  # lazy: transformers is heavy to import

    torch.manual_seed(seed)
    vision = tiny_vision_config(width=width, projection=projection)
    vision.pop("projection_dim")
    cfg = CLIPConfig(
        vision_config=vision,
        text_config={
            "hidden_size": width,
            "num_hidden_layers": 1,
            "num_attention_heads": 1,
            "intermediate_size": width,
        },
        projection_dim=projection,
    )
    checker = StableDiffusionSafetyChecker(cfg).eval()
    set_thresholds(checker, -1.0 if flag else 2.0)
    return checker


def set_thresholds(checker: Any, value: float) -> None:
    with torch.no_grad():
        checker.concept_embeds_weights.fill_(value)
        checker.special_care_embeds_weights.fill_(value)


def make_demo_vision_models(models_dir: Path) -> list[Path]:
    """Write the demo vision files under ``models_dir`` (existing ones are kept); return their paths."""

    models_dir = Path(models_dir)
    clip_path = models_dir / "clip_vision" / DEMO_CLIP_VISION
    ip_path = models_dir / "ipadapter" / DEMO_IPADAPTER
    safety_path = models_dir / "safety" / DEMO_SAFETY
    paths = [clip_path, ip_path, safety_path]
    meta = {"format": "pt", "loom.note": _NOTE}
    if not clip_path.is_file():
        vision = tiny_clip_vision()
        _save_folder(vision.state_dict(), tiny_vision_config(), clip_path, meta)
    if not ip_path.is_file():
        sd = ip_adapter_state_dict(demo_modules()["unet"], tiny_vision_config()["projection_dim"])
        ip_path.parent.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in sd.items()}, str(ip_path.with_suffix(".tmp")), metadata=meta)
        ip_path.with_suffix(".tmp").replace(ip_path)
    if not safety_path.is_file():
        tiny_safety_checker().save_pretrained(safety_path.parent)  # config.json + model.safetensors
    return paths


def _save_folder(state: dict[str, Any], config: dict[str, Any], path: Path, meta: dict[str, str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    (path.parent / "config.json").write_text(json.dumps(config, indent=1, default=str), encoding="utf-8")
    tmp = path.with_suffix(".tmp")
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp), metadata=meta)
    tmp.replace(path)
