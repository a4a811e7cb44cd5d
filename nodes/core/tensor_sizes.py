"""Declared output sizes for the nodes that make large tensors from their widget values.

A node's ``estimate_outputs`` (``engine.node.Node``) says, before anything runs, how large its
outputs will be, so the executor can refuse a job whose tensors cannot fit the process RAM budget
(``engine.memory.plan_memory``). These helpers build those :class:`~engine.node.TensorSize` values in
ComfyUI's layouts, all float32:

    IMAGE   [B, H, W, C]
    MASK    [B, H, W]
    LATENT  samples [B, C, h, w] (or [B, C, t, h, w]); h, w the image size over the VAE's factor

Every helper returns None when a value it needs is not known before the run (a widget fed by a
link arrives as None, a producer that declared nothing as None).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from engine.node import TensorSize


def _ints(*values: Any) -> bool:
    return all(isinstance(v, int) and not isinstance(v, bool) for v in values)


def image_size(batch: Any, height: Any, width: Any, channels: int = 3) -> TensorSize | None:
    return TensorSize((batch, height, width, channels)) if _ints(batch, height, width) else None


def mask_size(batch: Any, height: Any, width: Any) -> TensorSize | None:
    return TensorSize((batch, height, width)) if _ints(batch, height, width) else None


def latent_size(batch: Any, channels: int, height: Any, width: Any, factor: int = 8) -> TensorSize | None:
    """Latents of an image ``width`` x ``height`` pixels (each side over ``factor``)."""
    if not _ints(batch, height, width):
        return None
    return TensorSize((batch, channels, height // factor, width // factor))


def video_latent_size(
    batch: Any,
    channels: int,
    length: Any,
    height: Any,
    width: Any,
    factor: int = 8,
    frames_per_latent: int = 4,
) -> TensorSize | None:
    """Video latents [B, C, (length - 1) // frames_per_latent + 1, h, w] of ``length`` frames of
    ``width`` x ``height`` pixels (each side over ``factor``), as EmptyHunyuanLatentVideo makes them."""
    if not _ints(batch, length, height, width):
        return None
    return TensorSize(
        (batch, channels, (length - 1) // frames_per_latent + 1, height // factor, width // factor)
    )


def decoded_size(latent: TensorSize | None, factor: int = 8) -> TensorSize | None:
    """The RGB images a VAE decodes ``latent`` [B, C, h, w] into: [B, h * factor, w * factor, 3], with
    the usual factor of 8 (a VAE that scales more makes this an underestimate)."""
    if latent is None or len(latent.shape) != 4:
        return None
    b, _, h, w = latent.shape
    return TensorSize((b, h * factor, w * factor, 3))


def image_resized(size: TensorSize | None, to: Callable[[int, int], tuple[int, int]]) -> TensorSize | None:
    """``size`` (an IMAGE) with its width and height mapped by ``to(width, height)``."""
    if size is None or len(size.shape) != 4:
        return None
    b, h, w, c = size.shape
    width, height = to(w, h)
    return TensorSize((b, height, width, c), size.itemsize)


def latent_resized(size: TensorSize | None, to: Callable[[int, int], tuple[int, int]]) -> TensorSize | None:
    """``size`` (a LATENT) with its last two sides (width, height in latent pixels) mapped by ``to``."""
    if size is None or len(size.shape) < 3:
        return None
    width, height = to(size.shape[-1], size.shape[-2])
    return TensorSize((*size.shape[:-2], height, width), size.itemsize)


def scaled_by(factor: Any) -> Callable[[int, int], tuple[int, int]] | None:
    """Both sides times ``factor`` (rounded, at least 1), as the "scale by" nodes do."""
    if not isinstance(factor, int | float) or isinstance(factor, bool):
        return None
    return lambda w, h: (max(1, round(w * factor)), max(1, round(h * factor)))


def repeated(size: TensorSize | None, amount: Any) -> TensorSize | None:
    """The batch ``amount`` times over."""
    if size is None or not size.shape or not _ints(amount):
        return None
    return TensorSize((size.shape[0] * amount, *size.shape[1:]), size.itemsize)


def joined(sizes: Sequence[TensorSize | None]) -> TensorSize | None:
    """Batches one after the other, all at the first one's size (later ones are resized to it)."""
    if not sizes or any(s is None or not s.shape for s in sizes):
        return None
    first = sizes[0]
    assert first is not None
    return TensorSize((sum(s.shape[0] for s in sizes if s is not None), *first.shape[1:]), first.itemsize)
