"""Stand-in for ComfyUI's ``node_helpers``: conditioning edits, PIL retries and hashing helpers,
over Loom's conditioning (a list of :class:`nodes.core.cond.CondEntry`; ComfyUI's per-entry option
dict is the entry's ``extras``)."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Mapping
from typing import Any

import torch

from nodes.core.cond import CondEntry


def conditioning_set_values(
    conditioning: list[Any], values: Mapping[str, Any] | None = None, append: bool = False
) -> list[Any]:
    """A copy of ``conditioning`` with ``values`` set in each entry's options (``append``: added to
    the list already there). Entries in ComfyUI's ``[tensor, dict]`` form are handled too."""
    values = values or {}
    out: list[Any] = []
    for entry in conditioning:
        options = dict(entry.extras) if isinstance(entry, CondEntry) else dict(entry[1])
        for key, value in values.items():
            options[key] = [*options.get(key, []), *value] if append and key in options else value
        if isinstance(entry, CondEntry):
            out.append(dataclasses.replace(entry, extras=options))
        else:
            out.append([entry[0], options])
    return out


def pillow(fn: Callable[..., Any], arg: Any) -> Any:
    """``fn(arg)``, retried once with truncated images allowed (how ComfyUI opens images)."""
    from PIL import ImageFile  # lazy: PIL only when a pack opens an image

    try:
        return fn(arg)
    except (OSError, UnicodeDecodeError, ValueError):
        previous = ImageFile.LOAD_TRUNCATED_IMAGES
        ImageFile.LOAD_TRUNCATED_IMAGES = True
        try:
            return fn(arg)
        finally:
            ImageFile.LOAD_TRUNCATED_IMAGES = previous


def hasher() -> Callable[..., Any]:
    return hashlib.sha256


def string_to_torch_dtype(name: str) -> torch.dtype | None:
    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}.get(name)


def image_alpha_fix(destination: torch.Tensor, source: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``destination`` and ``source`` [B, H, W, C] with the same channel count (alpha added or dropped)."""
    if destination.shape[-1] < source.shape[-1]:
        source = source[..., : destination.shape[-1]]
    elif destination.shape[-1] > source.shape[-1]:
        pad = torch.ones((*source.shape[:-1], 1), dtype=source.dtype, device=source.device)
        source = torch.cat((source, pad), dim=-1)
    return destination, source
