"""Demo files of the Wan VAEs (random weights, noise), in the original layouts users have in
``models/vae``: the Wan 2.1 VAE is the Qwen-Image demo's (``wan_2.1_vae.safetensors``' layout, the same
kind; :data:`DEMO_WAN21_VAE`), and the Wan 2.2 VAE (``wan2.2_vae.safetensors``' layout: 48 channels,
1/16 in space, residual stages over 2×2 patches) is written here, once a family loads that kind
(``make-demo-model`` writes no file that VAELoader could not open)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from nodes.core.parts import Part
from nodes.demo.qwen_image import DEMO_QWEN_VAE
from nodes.families.build import original_state_dict
from nodes.families.catalog import families
from nodes.families.components.wan22_vae import Wan22Vae
from nodes.families.latent_format import WAN22_LATENT

DEMO_WAN21_VAE = DEMO_QWEN_VAE  # written by nodes.demo.qwen_image
DEMO_WAN22_VAE = "loom_demo_wan2.2_vae.safetensors"


def demo_wan22_vae(seed: int = 0) -> Any:
    """A tiny real Wan 2.2 VAE module (Loom's build of diffusers' ``AutoencoderKLWan``), seeded: the
    released structure (2×2 patches, four stages, time halved twice) at base width 8."""
    torch.manual_seed(seed)
    config = {
        "base_dim": 8,
        "decoder_base_dim": 12,
        "z_dim": WAN22_LATENT.channels,
        "dim_mult": [1, 2, 2, 2],
        "num_res_blocks": 1,
        "attn_scales": [],
        "temperal_downsample": [False, True, True],
        "is_residual": True,
        "in_channels": 12,
        "out_channels": 12,
        "patch_size": 2,
        "scale_factor_temporal": 4,
        "scale_factor_spatial": 16,
        "latents_mean": list(WAN22_LATENT.mean),
        "latents_std": list(WAN22_LATENT.std),
    }
    return Wan22Vae().empty(config).eval()


def wan22_vae_tensors(module: Any) -> dict[str, Any]:
    """``module``'s tensors in the original Wan 2.2 layout."""
    part = Part.make("vae", Wan22Vae(), "", "vae", dict(module.config))
    return {k: v.contiguous() for k, v in original_state_dict(part, module).items()}


def write_wan22_vae_demo(models_dir: Path) -> Path:
    """Write the Wan 2.2 demo VAE as ``models_dir/vae/DEMO_WAN22_VAE``; return its path."""
    path = Path(models_dir) / "vae" / DEMO_WAN22_VAE
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(
        wan22_vae_tensors(demo_wan22_vae()),
        str(path),
        metadata={"loom_note": "Loom demo model: random weights, produces noise."},
    )
    return path


def write_demo(models_dir: Path) -> list[Path]:
    """The Wan 2.2 demo VAE for ``make-demo-model``, when a family loads that kind (kept if present)."""
    if not any(isinstance(getattr(cls, "vae", None), Wan22Vae) for cls in families()):
        return []
    path = Path(models_dir) / "vae" / DEMO_WAN22_VAE
    return [path if path.is_file() else write_wan22_vae_demo(models_dir)]
