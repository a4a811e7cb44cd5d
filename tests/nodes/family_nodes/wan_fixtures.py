"""What the Wan node tests share: a tiny random Wan 2.1 VAE (diffusers' ``AutoencoderKLQwenImage``, the
causal 3-D VAE) saved in Wan's layout and opened with Loom's loader, the expected encodings written
out from ComfyUI's code, and small pictures and conditionings."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from nodes.core.cond import CondEntry
from nodes.core.resize import resize_image
from nodes.encode.clip_vision import ClipVisionOutput

W = H = 32  # latents 4 × 4
SIZE = dict(width=W, height=H)


def tiny_vae_module() -> Any:
    from nodes.families.components.wan_vae_module import QwenImageVae2D

    torch.set_num_threads(1)
    torch.manual_seed(0)
    return QwenImageVae2D(base_dim=8).eval()


def saved_vae(vae_module: Any, folder: Path) -> Any:
    from safetensors.torch import save_file

    from nodes.core.parts import Part
    from nodes.families.build import original_state_dict
    from nodes.families.components.wan_vae import WanVae
    from nodes.load.handles import open_vae

    path = folder / "tiny_wan_vae.safetensors"
    part = Part.make("vae", WanVae(), "", "vae", dict(vae_module.config))
    save_file({k: v.contiguous() for k, v in original_state_dict(part, vae_module).items()}, str(path))
    return open_vae(path)


def encoded(module: Any, clip: torch.Tensor) -> torch.Tensor:
    """The expected latents of frames [T, H, W, 3]: the VAE on [1, 3, T, H, W] in -1..1, its mode."""
    with torch.no_grad():
        pixels = clip.permute(3, 0, 1, 2).unsqueeze(0) * 2 - 1
        return module.encode(pixels, return_dict=False)[0].mode()


def fitted(image: torch.Tensor) -> torch.Tensor:
    return resize_image(image, W, H, "bilinear", "center")


def picture(seed: int, frames: int = 1, h: int = 40, w: int = 48, c: int = 3) -> torch.Tensor:
    return torch.rand(frames, h, w, c, generator=torch.Generator().manual_seed(seed))


def cond(**extras: Any) -> list[CondEntry]:
    return [CondEntry(embeds=torch.zeros(1, 4, 8), extras=extras)]


def vision(seed: int, tokens: int = 3) -> ClipVisionOutput:
    g = torch.Generator().manual_seed(seed)
    return ClipVisionOutput(
        torch.rand(1, 8, generator=g),
        torch.rand(1, tokens, 8, generator=g),
        torch.rand(1, tokens, 8, generator=g),
    )


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.allclose(a, b, atol=1e-5)


def input_names(node: type) -> list[str]:
    return [i.name for i in node.SCHEMA.inputs]


class OneModule:
    """A ModelAccess that hands out one module (Wan 2.2's VAE, which Loom's loader does not build)."""

    def __init__(self, module: Any) -> None:
        self.module = module

    @contextmanager
    def use(self, handle: Any) -> Iterator[Any]:
        yield self.module

    def plan_run(self, handle: Any, run: Any) -> None:
        pass


def module_ctx(module: Any, folder: Path) -> Any:
    """A NodeContext whose models are :class:`OneModule` of ``module``."""
    from engine.context import Folders, NodeContext

    return NodeContext("1", "t", Folders(folder, folder, folder), models=OneModule(module))


def tiny_wan22_module() -> Any:
    """A tiny Wan 2.2 VAE (48-channel latents, 2×2 patches: 16 pixels per cell)."""
    from diffusers import AutoencoderKLWan

    torch.manual_seed(1)
    return AutoencoderKLWan(
        base_dim=8,
        z_dim=48,
        is_residual=True,
        patch_size=2,
        in_channels=12,
        out_channels=12,
        scale_factor_spatial=16,
    ).eval()
