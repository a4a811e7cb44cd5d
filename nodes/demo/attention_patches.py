"""Demo files for the attention patch loaders (random weights, sized for the SD1.5 demo UNet):

- ``hypernetworks/loom_demo_hypernetwork_sd15.safetensors``: a hypernetwork for context widths 32
  and 64 (the demo's text width and block widths), layer structure 1-2-1 with ReLU and layer norm,
  in Loom's flat safetensors form of A1111's file (``nodes.patches.hypernetwork``).
- ``gligen/loom_demo_gligen_sd15.safetensors``: a GLIGEN file for the SD1.5 demo UNet (one fuser
  per transformer block under ComfyUI's ``input_blocks.{i}.1.transformer_blocks.{t}.fuser.*`` names,
  ``position_net.*``), random weights with open gates so the boxes visibly act.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from nodes.demo.models import demo_modules
from nodes.encode.gligen import Fuser, PositionNet
from nodes.families.components.unet_patching import transformer_places

DEMO_HYPERNETWORK = "loom_demo_hypernetwork_sd15.safetensors"
DEMO_GLIGEN = "loom_demo_gligen_sd15.safetensors"
_LDM_PLACE = {"input": "input_blocks.{}.1", "middle": "middle_block.1", "output": "output_blocks.{}.1"}


def gligen_tensors(unet: Any, key_dim: int, seed: int = 5, gate: float = 0.5) -> dict[str, Any]:
    """A GLIGEN state dict for ``unet`` (a diffusers UNet2DConditionModel) with phrase width ``key_dim``."""

    torch.manual_seed(seed)
    out: dict[str, Any] = {}
    for (kind, ident), transformer in transformer_places(unet):
        for t, tb in enumerate(transformer.transformer_blocks):
            fuser = Fuser(int(tb.norm1.normalized_shape[0]), key_dim)
            with torch.no_grad():
                fuser.alpha_attn.fill_(gate)
                fuser.alpha_dense.fill_(gate)
            prefix = f"{_LDM_PLACE[kind].format(ident)}.transformer_blocks.{t}.fuser."
            out |= {prefix + k: v for k, v in fuser.state_dict().items()}
    net = PositionNet(key_dim, key_dim)
    with torch.no_grad():
        net.null_positive_feature.normal_()
        net.null_position_feature.normal_()
    out |= {f"position_net.{k}": v for k, v in net.state_dict().items()}
    return {k: v.detach().contiguous() for k, v in out.items()}


def hypernetwork_tensors(
    widths: tuple[int, ...] = (32, 64), *, layer_norm: bool = True, seed: int = 11, scale: float = 0.2
) -> dict[int, list[dict[str, Any]]]:
    """A1111's nested form: ``{width: [key MLP, value MLP]}``; each MLP width → 2·width → width,
    A1111's names (``linear.{i}``), a layer norm after each linear when ``layer_norm``."""

    gen = torch.Generator().manual_seed(seed)
    out: dict[int, list[dict[str, Any]]] = {}
    for width in widths:
        pair = []
        for _ in range(2):
            sd: dict[str, Any] = {}
            index = 0
            for n_in, n_out in ((width, 2 * width), (2 * width, width)):
                sd[f"linear.{index}.weight"] = torch.randn(n_out, n_in, generator=gen) * scale
                sd[f"linear.{index}.bias"] = torch.randn(n_out, generator=gen) * scale
                index += 2  # A1111 counts the activation as a layer
                if layer_norm:
                    sd[f"linear.{index - 1}.weight"] = 1 + torch.randn(n_out, generator=gen) * scale
                    sd[f"linear.{index - 1}.bias"] = torch.randn(n_out, generator=gen) * scale
            pair.append(sd)
        out[width] = pair
    return out


def write_hypernetwork(path: Path, nets: dict[int, list[dict[str, Any]]], options: dict[str, str]) -> Path:
    """``nets`` (A1111's nested form) as Loom's flat safetensors, ``options`` as metadata."""

    flat = {
        f"{w}.{i}.{k}": t.contiguous()
        for w, pair in nets.items()
        for i, sd in enumerate(pair)
        for k, t in sd.items()
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(flat, str(path), metadata=options)
    return path


def make_patch_demo(models_dir: Path) -> list[Path]:
    """Write the demo patch files under ``models_dir`` (existing ones are kept)."""
    path = Path(models_dir) / "hypernetworks" / DEMO_HYPERNETWORK
    if not path.is_file():
        write_hypernetwork(
            path,
            hypernetwork_tensors(),
            {"activation_func": "relu", "is_layer_norm": "true", "activate_output": "false"},
        )
    gligen = Path(models_dir) / "gligen" / DEMO_GLIGEN
    if not gligen.is_file():
        modules = demo_modules()
        gligen.parent.mkdir(parents=True, exist_ok=True)
        save_file(gligen_tensors(modules["unet"], int(modules["clip_l"].config.hidden_size)), str(gligen))
    return [path, gligen]


def write_demo(models_dir: Path) -> list[Path]:
    """The demo hypernetwork and GLIGEN files for ``make-demo-model`` (kept if present)."""
    return make_patch_demo(models_dir)
