"""Stand-in for ComfyUI's ``comfy.utils`` (installed as ``comfy.utils`` while plugin packs load and run).

Answered by Loom's own code: resizing is ``nodes.core.resize`` (the same methods ComfyUI's scale
nodes offer), files load through ``nodes.core.weights`` (safetensors, or pickles with torch's
weights-only loader: no code from a file ever runs), and :class:`ProgressBar` reports to the
running node's progress events through the bound shim. Loom loads a fresh copy of this file per
:class:`nodes.compat.shim.ComfyShim`; ``_binding`` is that copy's one piece of state.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from nodes.core import resize as loom_resize
from nodes.core import weights

if TYPE_CHECKING:
    from nodes.compat.shim import ComfyShim

_binding: ComfyShim | None = None
PROGRESS_BAR_ENABLED = True


def _bind(shim: ComfyShim) -> None:
    global _binding
    _binding = shim


# --- resizing ------------------------------------------------------------------------------------
def common_upscale(
    samples: torch.Tensor, width: int, height: int, upscale_method: str, crop: str
) -> torch.Tensor:
    """``samples`` [B, C, H, W] resized to ``height`` x ``width`` (ComfyUI's methods and crops)."""
    if samples.ndim == 5:  # video latents [B, C, T, H, W]: resize frame by frame
        b, c, t, h, w = samples.shape
        flat = samples.permute(0, 2, 1, 3, 4).reshape(b * t, c, h, w)
        out = loom_resize.resize(flat, width, height, upscale_method, crop)
        return out.reshape(b, t, c, height, width).permute(0, 2, 1, 3, 4)
    return loom_resize.resize(samples, width, height, upscale_method, crop)


def lanczos(samples: torch.Tensor, width: int, height: int) -> torch.Tensor:
    return loom_resize.lanczos(samples, width, height)


def bislerp(samples: torch.Tensor, width: int, height: int) -> torch.Tensor:
    return loom_resize.bislerp(samples, width, height)


def get_tiled_scale_steps(width: int, height: int, tile_x: int, tile_y: int, overlap: int) -> int:
    rows = 1 if height <= tile_y else math.ceil((height - overlap) / (tile_y - overlap))
    cols = 1 if width <= tile_x else math.ceil((width - overlap) / (tile_x - overlap))
    return rows * cols


def _tile_starts(size: int, tile: int, overlap: int) -> list[int]:
    if size <= tile:
        return [0]
    stride = tile - overlap
    starts = list(range(0, size - overlap, stride))
    return [min(s, size - tile) for s in starts]


def tiled_scale(
    samples: torch.Tensor,
    function: Callable[[torch.Tensor], torch.Tensor],
    tile_x: int = 64,
    tile_y: int = 64,
    overlap: int = 8,
    upscale_amount: float = 4,
    out_channels: int = 3,
    output_device: str | torch.device = "cpu",
    pbar: ProgressBar | None = None,
) -> torch.Tensor:
    """``function`` applied tile by tile over ``samples`` [B, C, H, W]; tiles are blended with a
    linear feather over ``overlap`` so seams do not show (ComfyUI's 2-D ``tiled_scale``)."""
    b, _, h, w = samples.shape
    out_h, out_w = round(h * upscale_amount), round(w * upscale_amount)
    results = []
    for index in range(b):
        total = torch.zeros((1, out_channels, out_h, out_w), device=output_device)
        weight = torch.zeros_like(total)
        for y in _tile_starts(h, tile_y, overlap):
            for x in _tile_starts(w, tile_x, overlap):
                piece = samples[index : index + 1, :, y : y + tile_y, x : x + tile_x]
                scaled = function(piece).to(output_device)
                th, tw = scaled.shape[-2], scaled.shape[-1]
                mask = torch.ones((1, 1, th, tw), device=output_device)
                feather = round(overlap * upscale_amount)
                for t in range(feather):
                    ramp = (t + 1) / feather
                    if y > 0:
                        mask[:, :, t, :] *= ramp
                    if y + tile_y < h:
                        mask[:, :, th - 1 - t, :] *= ramp
                    if x > 0:
                        mask[:, :, :, t] *= ramp
                    if x + tile_x < w:
                        mask[:, :, :, tw - 1 - t] *= ramp
                oy, ox = round(y * upscale_amount), round(x * upscale_amount)
                total[:, :, oy : oy + th, ox : ox + tw] += scaled * mask
                weight[:, :, oy : oy + th, ox : ox + tw] += mask
                if pbar is not None:
                    pbar.update(1)
        results.append(total / weight.clamp(min=1e-8))
    return torch.cat(results)


# --- files and state dicts -----------------------------------------------------------------------
def load_torch_file(
    ckpt: str | Path, safe_load: bool = True, device: Any = None, return_metadata: bool = False
) -> Any:
    """The tensors in ``ckpt`` as Loom loads files: safetensors, or a pickle read weights-only."""
    path = Path(ckpt)
    if path.suffix.lower() in (".safetensors", ".sft"):
        from safetensors import safe_open  # lazy: only when a pack loads a file

        with safe_open(str(path), framework="pt", device="cpu") as handle:
            state = {key: handle.get_tensor(key) for key in handle.keys()}
            metadata = handle.metadata()
    else:
        loaded = weights.load_weights_only(path)
        if isinstance(loaded, Mapping) and "state_dict" in loaded and len(loaded) <= 4:
            loaded = loaded["state_dict"]
        state, metadata = loaded, None
    if device is not None:
        state = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in state.items()}
    return (state, metadata) if return_metadata else state


def save_torch_file(sd: Mapping[str, torch.Tensor], ckpt: str | Path, metadata: Any = None) -> None:
    """``sd`` written as safetensors (ComfyUI's format for every file it saves)."""
    from safetensors.torch import save_file  # lazy: only when a pack saves a file

    tensors = {k: v.contiguous() for k, v in sd.items()}
    save_file(tensors, str(ckpt), metadata={str(k): str(v) for k, v in (metadata or {}).items()} or None)


def repeat_to_batch_size(tensor: torch.Tensor, batch_size: int, dim: int = 0) -> torch.Tensor:
    """``tensor`` cut or tiled along ``dim`` to ``batch_size`` entries."""
    size = tensor.shape[dim]
    if size > batch_size:
        return tensor.narrow(dim, 0, batch_size)
    if size < batch_size:
        reps = [1] * tensor.ndim
        reps[dim] = math.ceil(batch_size / size)
        return tensor.repeat(reps).narrow(dim, 0, batch_size)
    return tensor


def state_dict_prefix_replace(
    state_dict: dict[str, Any], replace_prefix: Mapping[str, str], filter_keys: bool = False
) -> dict[str, Any]:
    """Keys starting with each old prefix renamed to the new one (in place unless ``filter_keys``,
    which returns only the renamed entries)."""
    out: dict[str, Any] = {} if filter_keys else state_dict
    for old, new in replace_prefix.items():
        for key in [k for k in state_dict if k.startswith(old)]:
            out[new + key[len(old) :]] = state_dict.pop(key)
    return out


def state_dict_key_replace(state_dict: dict[str, Any], keys_to_replace: Mapping[str, str]) -> dict[str, Any]:
    for old, new in keys_to_replace.items():
        if old in state_dict:
            state_dict[new] = state_dict.pop(old)
    return state_dict


def get_attr(obj: Any, attr: str) -> Any:
    """``obj.a.b.c`` for ``attr="a.b.c"``."""
    for name in attr.split("."):
        obj = getattr(obj, name)
    return obj


def set_attr(obj: Any, attr: str, value: Any) -> Any:
    """Set ``obj.a.b.c = value``; returns the previous value."""
    *parents, last = attr.split(".")
    for name in parents:
        obj = getattr(obj, name)
    previous = getattr(obj, last)
    setattr(obj, last, value)
    return previous


def set_attr_param(obj: Any, attr: str, value: torch.Tensor) -> Any:
    return set_attr(obj, attr, torch.nn.Parameter(value, requires_grad=False))


def copy_to_param(obj: Any, attr: str, value: torch.Tensor) -> None:
    get_attr(obj, attr).data.copy_(value)


# --- progress ------------------------------------------------------------------------------------
class ProgressBar:
    """ComfyUI's progress bar: ``update(n)`` / ``update_absolute(value, total, preview)`` report to
    the progress events of the node running on this thread (nothing when no node runs)."""

    def __init__(self, total: int, node_id: str | None = None) -> None:
        self.total = total
        self.current = 0
        self.node_id = node_id

    def update_absolute(self, value: int, total: int | None = None, preview: Any = None) -> None:
        if total is not None:
            self.total = total
        self.current = min(value, self.total)
        if _binding is not None:
            _binding.report_progress(self.current, self.total)

    def update(self, value: int) -> None:
        self.update_absolute(self.current + value)
