"""Demo model patches in ``models/model_patches``, the folder and layout users have (random weights):
a DiffSynth block-wise ControlNet for the tiny Qwen-Image demo transformer (one control block per
transformer block, its width), like ``qwen_image_canny_diffsynth_controlnet.safetensors``, and the
inpainting variant (``img_in`` takes 4 mask inputs per patch more), like
``qwen_image_inpaint_diffsynth_controlnet.safetensors``; and an alibaba-pai Fun ControlNet for the
tiny Z-Image demo transformer (its width and heads, 2 control layers, 2 control refiner blocks), like
``Z-Image-Turbo-Fun-Controlnet-Union.safetensors``, and one in the 2.0/2.1 layout (inpainting inputs,
control refiner blocks, one per noise refiner block of the demo transformer), like
``Z-Image-Turbo-Fun-Controlnet-Union-2.1.safetensors``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from nodes.families.components.blockwise_control import LATENT_INPUTS, blockwise_module
from nodes.families.components.zimage_fun_control import INPAINT_EXTRA, fun_control_module

DEMO_BLOCKWISE = "loom_demo_qwen_image_diffsynth_controlnet.safetensors"
DEMO_BLOCKWISE_INPAINT = "loom_demo_qwen_image_inpaint_diffsynth_controlnet.safetensors"
DEMO_FUN_CONTROL = "loom_demo_z_image_fun_controlnet_union.safetensors"
DEMO_FUN_CONTROL_21 = "loom_demo_z_image_fun_controlnet_union_2.1.safetensors"


def demo_blockwise_tensors(
    blocks: int = 2, width: int = 64, inpaint: bool = False, seed: int = 0
) -> dict[str, Any]:
    """The tensors of a tiny block-wise ControlNet, named as in DiffSynth's files."""

    torch.manual_seed(seed)
    network = blockwise_module(blocks, LATENT_INPUTS + (4 if inpaint else 0), width)
    with torch.no_grad():  # norms' weights away from 1, so the file's values matter
        for name, p in network.named_parameters():
            if name.endswith("rms.weight"):
                p.copy_(1 + torch.randn_like(p) * 0.1)
    return {k: v.contiguous() for k, v in network.state_dict().items()}


def demo_fun_control_tensors(
    layers: int = 2, width: int = 64, heads: int = 2, seed: int = 2, *, v2: bool = False, refiners: int = 2
) -> dict[str, Any]:
    """The tensors of a tiny Z-Image Fun ControlNet, named as in alibaba-pai's files (``v2``: the
    2.0/2.1 layout: 17 more input channels, control refiner blocks)."""

    torch.manual_seed(seed)
    extra = INPAINT_EXTRA if v2 else 0
    network = fun_control_module(layers, refiners, 16, width, heads, extra, refiner_control=v2)
    with torch.no_grad():  # diffusers zero-initialises some layers; random ones make the control move
        for name, p in network.named_parameters():
            p.copy_(torch.randn_like(p) * 0.05 + (1.0 if "norm" in name else 0.0))
    return {k.replace(".block.", "."): v.contiguous() for k, v in network.state_dict().items()}


def make_model_patch_demo(models_dir: Path) -> list[Path]:
    """Write the demo model patches under ``models_dir/model_patches``; return their paths."""

    folder = Path(models_dir) / "model_patches"
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, inpaint in ((DEMO_BLOCKWISE, False), (DEMO_BLOCKWISE_INPAINT, True)):
        path = folder / name
        save_file(
            demo_blockwise_tensors(inpaint=inpaint, seed=int(inpaint)),
            str(path),
            metadata={"loom_note": "Loom demo model: random weights, produces noise."},
        )
        written.append(path)
    for name, tensors in (
        (DEMO_FUN_CONTROL, demo_fun_control_tensors()),
        (DEMO_FUN_CONTROL_21, demo_fun_control_tensors(seed=3, v2=True, refiners=1)),
    ):
        path = folder / name
        save_file(tensors, str(path), metadata={"loom_note": "Loom demo model: random weights."})
        written.append(path)
    return written


def write_demo(models_dir: Path) -> list[Path]:
    """The demo model patches for ``make-demo-model``."""
    return make_model_patch_demo(models_dir)
