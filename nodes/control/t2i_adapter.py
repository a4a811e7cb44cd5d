"""T2I-Adapters, loaded by ``ControlNetLoader`` from ``models/controlnet`` as ComfyUI does (a file
without ControlNet tensors is tried as an adapter), built as diffusers' ``T2IAdapter``.

Layouts: TencentARC's original files (``conv_in``, ``body.{k}.block1`` …, two resnet blocks per
level; the "light" ones ``body.{i}.in_conv``/``body.{i}.body.{j}``/``body.{i}.out_conv``) and
diffusers' (``adapter.conv_in``, ``adapter.body.{i}.resnets.{j}`` …; ``config.json`` beside a
``diffusion_pytorch_model`` file is used). SDXL adapters are told by their 16× pixel unshuffle (the
first convolution takes 256 or 768 channels: ComfyUI's rule).

Semantics (ComfyUI's ``T2IAdapter`` control): the control image is resized to the latent ×8,
rounded up to the adapter's unshuffle factor (``common_upscale``, nearest-exact, center crop),
averaged to one channel for one-channel adapters, batched to the rows; the features, times the
strength, are added inside the UNet's down path after each level (ComfyUI's ``input`` controls,
diffusers' ``down_intrablock_additional_residuals``); an SDXL adapter's last feature goes after
the middle block. The levels line up with ComfyUI's fixed input-block positions on the real
SD1.x/SD2.x/SDXL UNets.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from nodes.core.control_base import ControlResiduals, fit_hint
from nodes.core.handles import WeightsHandle, WeightsSource
from nodes.core.tensors import ModelLoadError
from nodes.core.weights import fingerprint, load_tensors, read_index
from nodes.families.control import adapter_families

PER_LEVEL = 2  # resnet blocks per level in the original full adapters (ComfyUI's nums_rb=2)


def is_adapter(shapes: Mapping[str, Sequence[int]]) -> bool:
    """Whether tensors with these names are a T2I-Adapter (either layout, full or light)."""
    return any(
        k in shapes
        for k in (
            "conv_in.weight",
            "body.0.in_conv.weight",
            "adapter.conv_in.weight",
            "adapter.body.0.in_conv.weight",
        )
    )


def _levels(shapes: Mapping[str, Sequence[int]], prefix: str) -> int:
    at = prefix.count(".") + 1
    return 1 + max(
        int(k.split(".")[at]) for k in shapes if k.startswith(prefix + ".") and k.split(".")[at].isdigit()
    )


def original_to_diffusers(sd: Mapping[str, Any]) -> dict[str, Any]:
    """TencentARC's key names → diffusers' ``T2IAdapter`` names (values unchanged)."""
    out: dict[str, Any] = {}
    light = "body.0.out_conv.weight" in sd
    for key, value in sd.items():
        parts = key.split(".")
        if parts[0] == "conv_in":
            out["adapter." + key] = value
            continue
        if parts[0] != "body":
            raise ModelLoadError(f"unexpected tensor {key!r} in a T2I-Adapter")
        k, rest = int(parts[1]), parts[2:]
        if light:  # body.{i}.body.{j}.blockN → body.{i}.resnets.{j}.blockN
            name = ".".join(["resnets", *rest[1:]]) if rest[0] == "body" else ".".join(rest)
            out[f"adapter.body.{k}.{name}"] = value
        elif rest[0] == "in_conv":  # the first block of a level widens the channels
            out[f"adapter.body.{k // PER_LEVEL}.in_conv.{rest[-1]}"] = value
        elif rest[0] in ("block1", "block2"):
            out[f"adapter.body.{k // PER_LEVEL}.resnets.{k % PER_LEVEL}.{'.'.join(rest)}"] = value
        else:
            raise ModelLoadError(
                f"the T2I-Adapter has {'.'.join(parts[:3])!r} tensors (a skip or strided-convolution variant) "
                "that diffusers' T2IAdapter cannot hold; use the diffusers version of this adapter"
            )
    return out


def adapter_config(shapes: Mapping[str, Sequence[int]], name: str) -> dict[str, Any]:
    """A diffusers ``T2IAdapter`` config read from its tensors' shapes (diffusers names)."""
    if "adapter.body.0.out_conv.weight" in shapes:  # light: the last level repeats the channels
        levels = _levels(shapes, "adapter.body")
        cin = int(shapes["adapter.body.0.in_conv.weight"][1])
        channels = [int(shapes[f"adapter.body.{i}.out_conv.weight"][0]) for i in range(levels - 1)]
        blocks = 1 + max(int(k.split(".")[4]) for k in shapes if k.startswith("adapter.body.0.resnets."))
        return {
            "in_channels": cin // 64,
            "channels": channels,
            "num_res_blocks": blocks,
            "downscale_factor": 8,
            "adapter_type": "light_adapter",
        }
    if "adapter.conv_in.weight" not in shapes:
        raise ModelLoadError(
            f"{name}: not a ControlNet or T2I-Adapter; put ControlNet/T2I-Adapter files in models/controlnet"
        )
    if shapes.get("adapter.body.0.resnets.0.block2.weight", (0, 0, 1))[-1] != 1:
        raise ModelLoadError(
            f"{name}: a T2I-Adapter with {shapes['adapter.body.0.resnets.0.block2.weight'][-1]}-wide "
            "second convolutions, which diffusers' T2IAdapter cannot hold"
        )
    cin = int(shapes["adapter.conv_in.weight"][1])
    levels = _levels(shapes, "adapter.body")
    channels = [int(shapes[f"adapter.body.{i}.resnets.0.block1.weight"][0]) for i in range(levels)]
    blocks = 1 + max(int(k.split(".")[4]) for k in shapes if k.startswith("adapter.body.0.resnets."))
    xl = cin in (256, 768)  # a 16× unshuffle of 1 or 3 channels (ComfyUI's test)
    factor = 16 if xl else 8
    return {
        "in_channels": cin // factor**2,
        "channels": channels,
        "num_res_blocks": blocks,
        "downscale_factor": factor,
        "adapter_type": "full_adapter_xl" if xl else "full_adapter",
    }


@dataclass(frozen=True, kw_only=True)
class AdapterHandle(WeightsHandle):
    """A T2I-Adapter file; ``config``: its diffusers T2IAdapter config; ``original``: TencentARC names."""

    kind = "t2i_adapter"
    config: Mapping[str, Any]
    original: bool = False

    def recipe(self) -> Any:
        return dict(self.config)

    @property
    def xl(self) -> bool:
        return self.config.get("adapter_type") == "full_adapter_xl"

    @property
    def family(self) -> str:
        return "/".join(adapter_families(self.xl))

    def fits(self, family: str) -> bool:
        return family in adapter_families(self.xl)

    @property
    def unshuffle(self) -> int:
        return int(self.config.get("downscale_factor", 8))

    def build(self) -> Any:
        from diffusers import T2IAdapter  # lazy: diffusers (seconds); only a load needs it

        module = T2IAdapter.from_config(dict(self.config))
        sd = load_tensors(read_index(self.path, allow_pickle=self.source.allow_pickle))
        if self.original:
            sd = original_to_diffusers(sd)
        missing, unexpected = module.load_state_dict(sd, strict=False)
        if missing or unexpected:
            raise ModelLoadError(
                f"{self.path.name}: T2I-Adapter tensors do not match its config "
                f"(missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]})"
            )
        return module.eval()

    def hint(self, image: torch.Tensor, rows: int, latent: tuple[int, int]) -> torch.Tensor:
        """The adapter's input: ComfyUI's ``T2IAdapter.scale_image_to`` size, one channel if it takes one."""
        f = self.unshuffle
        size = (math.ceil(latent[0] * 8 / f) * f, math.ceil(latent[1] * 8 / f) * f)
        x = fit_hint(image, rows, size)
        if int(self.config.get("in_channels", 3)) == 1 and x.shape[1] > 1:
            x = x.mean(dim=1, keepdim=True)
        return x

    def residuals(
        self,
        module: Any,
        x_in: torch.Tensor,
        timestep: torch.Tensor,
        image: torch.Tensor,
        rows: int,
        strength: float,
        extra: Mapping[str, Any],
    ) -> ControlResiduals:
        hint = self.hint(image, rows, (x_in.shape[-2], x_in.shape[-1]))
        groups = x_in.shape[0] // rows
        dtype = next(module.parameters()).dtype
        features = module(hint.repeat(groups, 1, 1, 1).to(device=x_in.device, dtype=dtype))
        return ControlResiduals(intrablock=[f.to(x_in.dtype) * strength for f in features])


def open_adapter(
    path: Path, shapes: Mapping[str, Sequence[int]], *, allow_pickle: bool = False
) -> AdapterHandle:
    """The handle of a T2I-Adapter file whose tensor ``shapes`` were read (either layout)."""
    original = not any(k.startswith("adapter.") for k in shapes)
    named = original_to_diffusers(dict(shapes)) if original else shapes
    config = adapter_config(named, path.name)
    beside = path.parent / "config.json"
    if path.name.startswith("diffusion_pytorch_model") and beside.is_file():
        config = {k: v for k, v in json.loads(beside.read_text()).items() if not k.startswith("_")}
    return AdapterHandle(
        source=WeightsSource(path, fingerprint(path), allow_pickle=allow_pickle),
        nbytes=path.stat().st_size,
        config=config,
        original=original,
    )
