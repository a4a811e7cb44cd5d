"""A tiny random-weight 4× ESRGAN (RRDBNet) upscaler in the layout of Real-ESRGAN's released files
(``conv_first``, ``body.{i}.rdb{1,2,3}.conv{1..5}``, ``conv_body``, ``conv_up1``, ``conv_up2``,
``conv_hr``, ``conv_last``), written as users have it:

- ``upscale_models/loom_demo_esrgan_4x.safetensors``: the state dict
- ``upscale_models/loom_demo_esrgan_4x.pth``: ``{"params_ema": state_dict}`` as Real-ESRGAN saves
  it, loadable with ``torch.load(weights_only=True)`` (the default; refused under ``--refuse-pickle``)

Built with plain torch (spandrel is needed to run it, not to write it). Its output is noise-like.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

DEMO_UPSCALER = "loom_demo_esrgan_4x.safetensors"
DEMO_UPSCALER_PTH = "loom_demo_esrgan_4x.pth"
GROWTH = 32  # RRDBNet's growth channels (fixed in the released models and in spandrel's detection)


def demo_esrgan_state_dict(num_feat: int = 8, num_blocks: int = 1, seed: int = 0) -> dict[str, Any]:
    """A random 4× RRDBNet state dict (Real-ESRGAN key names), convolutions initialised like
    ``torch.nn.Conv2d`` and the dense-block convolutions scaled down as ESRGAN does (×0.1)."""

    torch.manual_seed(seed)
    sd: dict[str, Any] = {}

    def conv(name: str, cin: int, cout: int, scale: float = 1.0) -> None:
        layer = torch.nn.Conv2d(cin, cout, 3, padding=1)
        sd[f"{name}.weight"] = (layer.weight.detach() * scale).contiguous()
        sd[f"{name}.bias"] = (layer.bias.detach() * scale).contiguous()  # type: ignore[union-attr]

    conv("conv_first", 3, num_feat)
    for i in range(num_blocks):
        for r in (1, 2, 3):
            for c in range(1, 6):
                cout = num_feat if c == 5 else GROWTH
                conv(f"body.{i}.rdb{r}.conv{c}", num_feat + (c - 1) * GROWTH, cout, 0.1)
    for name in ("conv_body", "conv_up1", "conv_up2", "conv_hr"):
        conv(name, num_feat, num_feat)
    conv("conv_last", num_feat, 3)
    return sd


def make_demo_upscale_models(models_dir: Path) -> list[Path]:
    """Write the demo upscaler (.safetensors and .pth) under ``models_dir`` (existing files are kept)."""

    folder = Path(models_dir) / "upscale_models"
    paths = [folder / DEMO_UPSCALER, folder / DEMO_UPSCALER_PTH]
    if all(p.is_file() for p in paths):
        return paths
    folder.mkdir(parents=True, exist_ok=True)
    sd = demo_esrgan_state_dict()
    for path in paths:
        if path.is_file():
            continue
        tmp = path.with_suffix(".tmp")
        if path.suffix == ".pth":
            torch.save({"params_ema": sd}, tmp)
        else:
            save_file(sd, str(tmp), metadata={"loom.note": "Loom demo upscaler: random weights"})
        tmp.replace(path)  # never leave a half-written model behind
    return paths
