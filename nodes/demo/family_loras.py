"""Demo LoRAs for the DiT families' demo models, in ``models/loras``, each in the layout people
publish for that family (random low-rank changes of a few of the demo denoiser's linear layers):

- Flux.1 (dev, schnell, Kontext): kohya's ``lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight``
  (most Flux LoRAs shared on model sites),
- Flux.2 (dev, Klein) and Z-Image: ComfyUI's ``diffusion_model.<name>.lora_A.weight`` /
  ``lora_B`` (``Flux_2-Turbo-LoRA_comfyui.safetensors``, Z-Image style LoRAs),
- Qwen-Image: bare ``transformer_blocks.0.attn.to_q.lora_A.weight`` (Qwen-Image-Lightning's).

The base files come first (their writers keep existing files); the LoRA takes its layer names and
shapes from them, so it matches the demo model it is for.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from nodes.demo.flux import DEMO_FLUX_DEV, make_flux_demo
from nodes.demo.flux2 import DEMO_FLUX2_DEV, DEMO_KLEIN, make_flux2_demo
from nodes.demo.models import write_demo_file
from nodes.demo.qwen_image import DEMO_QWEN_IMAGE, make_qwen_image_demo
from nodes.demo.zimage import DEMO_ZIMAGE, make_zimage_demo

RANK = 2
LAYERS = 4  # LoRA layers per file: enough to change the output, few enough to write in no time


def kohya(name: str, down: Any, up: Any) -> dict[str, Any]:
    flat = "lora_unet_" + name.replace(".", "_")
    return {
        f"{flat}.lora_down.weight": down,
        f"{flat}.lora_up.weight": up,
        f"{flat}.alpha": torch.tensor(float(RANK)),
    }


def comfy(name: str, down: Any, up: Any) -> dict[str, Any]:
    return {f"diffusion_model.{name}.lora_A.weight": down, f"diffusion_model.{name}.lora_B.weight": up}


def bare(name: str, down: Any, up: Any) -> dict[str, Any]:
    return {f"{name}.lora_A.weight": down, f"{name}.lora_B.weight": up}


# LoRA file, the demo denoiser it is for, the layer names it changes (prefixes), its key layout
FAMILY_LORAS: tuple[tuple[str, str, tuple[str, ...], Callable[[str, Any, Any], dict[str, Any]]], ...] = (
    ("loom_demo_lora_flux.safetensors", DEMO_FLUX_DEV, ("double_blocks.", "single_blocks."), kohya),
    ("loom_demo_lora_flux2_dev.safetensors", DEMO_FLUX2_DEV, ("double_blocks.", "single_blocks."), comfy),
    ("loom_demo_lora_flux2_klein.safetensors", DEMO_KLEIN, ("double_blocks.", "single_blocks."), comfy),
    ("loom_demo_lora_z_image.safetensors", DEMO_ZIMAGE, ("layers.",), comfy),
    ("loom_demo_lora_qwen_image.safetensors", DEMO_QWEN_IMAGE, ("transformer_blocks.",), bare),
)


def family_lora_tensors(
    base: Path, prefixes: tuple[str, ...], layout: Callable[..., dict[str, Any]]
) -> dict[str, Any]:
    """A rank-2 change of the first linear layers of ``base`` whose names start with ``prefixes``."""
    generator = torch.Generator().manual_seed(7)
    tensors: dict[str, Any] = {}
    with safe_open(str(base), "pt") as weights:
        names = [k for k in weights.keys() if k.startswith(prefixes) and k.endswith(".weight")]  # noqa: SIM118
        linear = [k for k in names if len(weights.get_slice(k).get_shape()) == 2][:LAYERS]
        for key in linear:
            out_features, in_features = weights.get_slice(key).get_shape()
            down = torch.randn(RANK, in_features, generator=generator) * 0.5
            up = torch.randn(out_features, RANK, generator=generator) * 0.5
            tensors.update(layout(key.removesuffix(".weight"), down, up))
    return tensors


def make_family_lora_demo(models_dir: Path) -> list[Path]:
    """Write the family demo LoRAs (and the demo denoisers they are for) under ``models_dir``."""
    models_dir = Path(models_dir)
    for writer in (make_flux_demo, make_flux2_demo, make_zimage_demo, make_qwen_image_demo):
        writer(models_dir)
    paths = []
    for file_name, base, prefixes, layout in FAMILY_LORAS:
        path = models_dir / "loras" / file_name
        if not path.is_file():
            write_demo_file(
                path, family_lora_tensors(models_dir / "diffusion_models" / base, prefixes, layout)
            )
        paths.append(path)
    return paths


def write_demo(models_dir: Path) -> list[Path]:
    """The family demo LoRAs for ``make-demo-model``."""
    return make_family_lora_demo(models_dir)
