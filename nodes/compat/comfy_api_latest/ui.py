"""A small stand-in for ComfyUI's ``comfy_api.latest.ui``: UI outputs a V3 node returns.

``NodeOutput(..., ui=ui.PreviewText("hello"))`` shows text on the node; ``ui.PreviewImage(images)``
writes the images to the temp folder (through the bound ``folder_paths`` shim, installed while
plugin nodes run) and shows them. Each object's ``as_dict()`` is ComfyUI's UI payload.
"""

from __future__ import annotations

import importlib
import io
import uuid
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from engine.atomic import write_atomic


class _UIOutput:
    def as_dict(self) -> dict[str, Any]:
        raise NotImplementedError


class PreviewText(_UIOutput):
    def __init__(self, value: str, **kwargs: Any) -> None:
        self.value = value

    def as_dict(self) -> dict[str, Any]:
        return {"text": [self.value]}


class PreviewImage(_UIOutput):
    """Images as a ``[B, H, W, C]`` float tensor or array in 0..1, saved as temp PNGs."""

    def __init__(self, image: Any, animated: bool = False, cls: Any = None, **kwargs: Any) -> None:
        self.values = _save_temp_images(image)
        self.animated = animated

    def as_dict(self) -> dict[str, Any]:
        return {"images": self.values, "animated": (self.animated,)}


class PreviewMask(PreviewImage):
    """A ``[B, H, W]`` mask shown as grey images."""

    def __init__(self, mask: Any, animated: bool = False, cls: Any = None, **kwargs: Any) -> None:
        array = _as_array(mask)
        super().__init__(
            array.reshape((-1, array.shape[-2], array.shape[-1], 1)).repeat(3, axis=-1), animated
        )


def _as_array(data: Any) -> Any:
    if hasattr(data, "detach"):
        data = data.detach().cpu().float().numpy()
    return np.asarray(data, dtype=np.float32)


def _save_temp_images(image: Any) -> list[dict[str, str]]:
    folder_paths = importlib.import_module("folder_paths")  # the shim bound to this run's folders
    temp = folder_paths.get_temp_directory()
    batch = _as_array(image)
    if batch.ndim == 3:  # (H, W, C) → (1, H, W, C)
        batch = batch[None]
    results = []
    for item in batch:
        pixels = np.clip(item * 255.0, 0, 255).astype(np.uint8)
        if pixels.shape[-1] == 1:
            pixels = pixels[..., 0]
        name = f"loom_preview_{uuid.uuid4().hex[:12]}.png"
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format="PNG", compress_level=1)
        write_atomic(Path(temp) / name, buffer.getvalue())  # a full disk leaves no truncated preview
        results.append({"filename": name, "subfolder": "", "type": "temp"})
    return results


__all__ = ["PreviewImage", "PreviewMask", "PreviewText"]
