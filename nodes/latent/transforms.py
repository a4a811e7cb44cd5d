"""ComfyUI's everyday latent nodes: arithmetic, compositing and transforms.

Every node keeps ComfyUI's LATENT conventions (see :mod:`nodes.latent.vae`): the output is a shallow
copy of the first latent with new ``samples``, so ``noise_mask``, ``batch_index`` and Loom's
``latent_space`` tag travel on unchanged unless the node's meaning changes them. Batch rules are
ComfyUI's: a second latent of another size is resized (bilinear, centre crop) to the first one's
size and repeated or cut to its batch size. Batch nodes are in :mod:`nodes.latent.batch`,
``.latent`` files in :mod:`nodes.latent.files` and latent operations in :mod:`nodes.latent.operations`.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from engine.context import NodeContext
from engine.node import Node
from engine.schema import BOOLEAN, COMBO, FLOAT, INT, LATENT, MASK, Input, NodeSchema, Output
from nodes.core.resize import resize
from nodes.latent.vae import MAX_RESOLUTION, LatentError


# --- shared helpers ---------------------------------------------------------------------------
def samples_of(latent: Any, input_name: str) -> torch.Tensor:
    """The ``samples`` tensor of a LATENT input, or a clear error naming the input."""
    samples = latent.get("samples") if isinstance(latent, dict) else None
    if not isinstance(samples, torch.Tensor) or samples.ndim < 3:
        raise LatentError(
            f"{input_name}: expected a LATENT (a dict with a 'samples' tensor [B, C, H, W]); "
            f"connect a LATENT output such as EmptyLatentImage or VAEEncode"
        )
    return samples


def with_samples(latent: dict, samples: torch.Tensor) -> dict:
    """A shallow copy of ``latent`` with new ``samples`` (what ComfyUI's ``samples.copy()`` does)."""
    return {**latent, "samples": samples}


def repeat_to_batch(tensor: torch.Tensor, batch: int) -> torch.Tensor:
    """Cut or cyclically repeat ``tensor`` along dim 0 to ``batch`` items."""
    if tensor.shape[0] > batch:
        return tensor[:batch]
    if tensor.shape[0] < batch:
        reps = math.ceil(batch / tensor.shape[0])
        return tensor.repeat(reps, *([1] * (tensor.ndim - 1)))[:batch]
    return tensor


def center_crop_resize(x: torch.Tensor, width: int, height: int, mode: str) -> torch.Tensor:
    """``x`` [..., H, W] (4-D latents, 5-D video latents) cut to the aspect ratio of width x height
    around its centre, then resized (:func:`nodes.core.resize.resize`, each channel and frame alone)."""
    planes = x.reshape(-1, 1, x.shape[-2], x.shape[-1]).float()
    return resize(planes, width, height, mode, "center").reshape(*x.shape[:-2], height, width)


def match_to(
    target: torch.Tensor, other: torch.Tensor, name: str, *, repeat_batch: bool = True
) -> torch.Tensor:
    """``other`` resized (bilinear, centre crop) to ``target``'s size and, unless told otherwise,
    repeated or cut to its batch size; channels must already agree."""
    if other.shape[1] != target.shape[1] or other.ndim != target.ndim:
        raise LatentError(
            f"{name} has shape {list(other.shape)} but the first latent has {list(target.shape)}: "
            "latents of different models (channel counts) cannot be combined"
        )
    if other.shape[2:] != target.shape[2:]:
        other = center_crop_resize(other, target.shape[-1], target.shape[-2], "bilinear").to(other.dtype)
    return repeat_to_batch(other, target.shape[0]) if repeat_batch else other


def check_same_space(first: dict, other: dict, name: str) -> None:
    """Latents tagged with different latent spaces (Loom's tag, see :mod:`nodes.latent.vae`) cannot be
    combined: same channel count, different models' scales and meanings."""
    a, b = first.get("latent_space"), other.get("latent_space")
    if a is not None and b is not None and a != b:
        raise LatentError(
            f"{name} comes from a {other.get('latent_family', 'different')} model (latent space {b}) "
            f"but the first latent from a {first.get('latent_family', 'different')} model ({a}); "
            "combine latents of one model family"
        )


def _two(samples1: dict, samples2: dict) -> tuple[torch.Tensor, torch.Tensor]:
    s1 = samples_of(samples1, "samples1")
    s2 = samples_of(samples2, "samples2")
    check_same_space(samples1, samples2, "samples2")
    return s1, match_to(s1, s2, "samples2")


def _in(name: str, description: str = "") -> Input:
    return Input(name, LATENT, description or "A latent.")


_OUT = (Output("LATENT", LATENT, "The resulting latent."),)


# --- arithmetic -------------------------------------------------------------------------------
class LatentAdd(Node):
    SCHEMA = NodeSchema(
        node_id="LatentAdd",
        display_name="LatentAdd",
        category="latent/advanced",
        description="samples1 + samples2 (samples2 resized and repeated to samples1's shape).",
        inputs=(_in("samples1"), _in("samples2")),
        outputs=_OUT,
    )

    def run(self, ctx: NodeContext, *, samples1: dict, samples2: dict) -> tuple[dict]:
        s1, s2 = _two(samples1, samples2)
        return (with_samples(samples1, s1 + s2),)


class LatentSubtract(Node):
    SCHEMA = NodeSchema(
        node_id="LatentSubtract",
        display_name="LatentSubtract",
        category="latent/advanced",
        description="samples1 - samples2 (samples2 resized and repeated to samples1's shape).",
        inputs=(_in("samples1"), _in("samples2")),
        outputs=_OUT,
    )

    def run(self, ctx: NodeContext, *, samples1: dict, samples2: dict) -> tuple[dict]:
        s1, s2 = _two(samples1, samples2)
        return (with_samples(samples1, s1 - s2),)


class LatentMultiply(Node):
    SCHEMA = NodeSchema(
        node_id="LatentMultiply",
        display_name="LatentMultiply",
        category="latent/advanced",
        description="Multiply a latent by a constant.",
        inputs=(
            _in("samples"),
            Input("multiplier", FLOAT, "The factor.", default=1.0, min=-10.0, max=10.0, step=0.01),
        ),
        outputs=_OUT,
    )

    def run(self, ctx: NodeContext, *, samples: dict, multiplier: float) -> tuple[dict]:
        return (with_samples(samples, samples_of(samples, "samples") * multiplier),)


class LatentInterpolate(Node):
    SCHEMA = NodeSchema(
        node_id="LatentInterpolate",
        display_name="LatentInterpolate",
        category="latent/advanced",
        description="Blend two latents direction and magnitude separately (per-pixel vector norms over channels); "
        "ratio 1 gives samples1.",
        inputs=(
            _in("samples1"),
            _in("samples2"),
            Input("ratio", FLOAT, "Weight of samples1.", default=1.0, min=0.0, max=1.0, step=0.01),
        ),
        outputs=_OUT,
    )

    def run(self, ctx: NodeContext, *, samples1: dict, samples2: dict, ratio: float) -> tuple[dict]:
        s1, s2 = _two(samples1, samples2)
        m1 = torch.linalg.vector_norm(s1, dim=1, keepdim=True)
        m2 = torch.linalg.vector_norm(s2, dim=1, keepdim=True)
        mixed = torch.nan_to_num(s1 / m1) * ratio + torch.nan_to_num(s2 / m2) * (1.0 - ratio)
        direction = torch.nan_to_num(mixed / torch.linalg.vector_norm(mixed, dim=1, keepdim=True))
        return (with_samples(samples1, direction * (m1 * ratio + m2 * (1.0 - ratio))),)


class LatentBlend(Node):
    SCHEMA = NodeSchema(
        node_id="LatentBlend",
        display_name="Latent Blend",
        category="_for_testing",
        description="samples1 * blend_factor + samples2 * (1 - blend_factor); samples2 is resized (bicubic, "
        "centre crop) to samples1's size first.",
        inputs=(
            _in("samples1"),
            _in("samples2"),
            Input("blend_factor", FLOAT, "Weight of samples1.", default=0.5, min=0, max=1, step=0.01),
        ),
        outputs=_OUT,
    )

    def run(self, ctx: NodeContext, *, samples1: dict, samples2: dict, blend_factor: float) -> tuple[dict]:
        s1, s2 = samples_of(samples1, "samples1"), samples_of(samples2, "samples2")
        check_same_space(samples1, samples2, "samples2")
        if s1.shape != s2.shape:
            if s1.shape[1] != s2.shape[1]:
                raise LatentError(
                    f"samples2 has {s2.shape[1]} channels but samples1 has {s1.shape[1]}: "
                    "latents of different models cannot be blended"
                )
            s2 = center_crop_resize(s2, s1.shape[-1], s1.shape[-2], "bicubic").to(s1.dtype)
        _check_batches(s1, s2, "samples2")
        return (with_samples(samples1, s1 * blend_factor + s2 * (1 - blend_factor)),)


def _check_batches(first: torch.Tensor, other: torch.Tensor, name: str) -> None:
    if other.shape[0] not in (1, first.shape[0]) and first.shape[0] != 1:
        raise LatentError(
            f"{name} has a batch of {other.shape[0]} but the first latent has {first.shape[0]}; "
            "use batches of the same size or of 1 (RepeatLatentBatch / LatentFromBatch)"
        )


# --- compositing ------------------------------------------------------------------------------
class LatentComposite(Node):
    SCHEMA = NodeSchema(
        node_id="LatentComposite",
        display_name="Latent Composite",
        category="latent",
        description="Paste samples_from into samples_to at (x, y) pixels, optionally feathering the pasted edges.",
        inputs=(
            _in("samples_to", "The latent pasted into."),
            _in("samples_from", "The latent pasted."),
            Input(
                "x",
                INT,
                "Left edge in pixels (a multiple of 8).",
                default=0,
                min=0,
                max=MAX_RESOLUTION,
                step=8,
            ),
            Input(
                "y",
                INT,
                "Top edge in pixels (a multiple of 8).",
                default=0,
                min=0,
                max=MAX_RESOLUTION,
                step=8,
            ),
            Input(
                "feather",
                INT,
                "Feather width in pixels (a multiple of 8); inner edges only.",
                default=0,
                min=0,
                max=MAX_RESOLUTION,
                step=8,
            ),
        ),
        outputs=_OUT,
    )

    def run(
        self, ctx: NodeContext, *, samples_to: dict, samples_from: dict, x: int, y: int, feather: int
    ) -> tuple[dict]:
        dest = samples_of(samples_to, "samples_to").clone()
        src = samples_of(samples_from, "samples_from")
        check_same_space(samples_to, samples_from, "samples_from")
        if src.shape[1] != dest.shape[1]:
            raise LatentError(f"samples_from has {src.shape[1]} channels but samples_to has {dest.shape[1]}")
        _check_batches(dest, src, "samples_from")
        x, y, feather = x // 8, y // 8, feather // 8
        height, width = dest.shape[-2], dest.shape[-1]
        if x >= width or y >= height:
            return (with_samples(samples_to, dest),)  # pasted entirely outside: nothing changes
        src = src[..., : height - y, : width - x]
        h, w = src.shape[-2], src.shape[-1]
        region = dest[..., y : y + h, x : x + w]
        if feather == 0:
            dest[..., y : y + h, x : x + w] = src.to(dest.dtype).expand_as(region)
            return (with_samples(samples_to, dest),)
        mask = torch.ones(1, 1, h, w, dtype=dest.dtype)
        for t in range(feather):
            ramp = (t + 1) / feather
            if y != 0:
                mask[:, :, t : t + 1, :] *= ramp
            if y + h < height:
                mask[:, :, h - 1 - t : h - t, :] *= ramp
            if x != 0:
                mask[:, :, :, t : t + 1] *= ramp
            if x + w < width:
                mask[:, :, :, w - 1 - t : w - t] *= ramp
        dest[..., y : y + h, x : x + w] = src * mask + region * (1 - mask)
        return (with_samples(samples_to, dest),)


def composite(
    destination: torch.Tensor,
    source: torch.Tensor,
    x: int,
    y: int,
    mask: torch.Tensor | None,
    multiplier: int,
    resize_source: bool,
) -> torch.Tensor:
    """Paste ``source`` [B, C, h, w] into a copy of ``destination`` at pixel (x, y) (``multiplier``
    pixels per element), weighted by ``mask`` (resized to the source, 1 = source)."""
    destination = destination.clone()
    if resize_source:
        source = F.interpolate(source.float(), size=destination.shape[-2:], mode="bilinear").to(
            destination.dtype
        )
    source = repeat_to_batch(source, destination.shape[0])
    x = max(-source.shape[-1] * multiplier, min(x, destination.shape[-1] * multiplier))
    y = max(-source.shape[-2] * multiplier, min(y, destination.shape[-2] * multiplier))
    left, top = x // multiplier, y // multiplier
    if mask is None:
        weight = torch.ones_like(source)
    else:
        weight = F.interpolate(
            mask.reshape(-1, 1, mask.shape[-2], mask.shape[-1]).float(),
            size=source.shape[-2:],
            mode="bilinear",
        )
        weight = repeat_to_batch(weight, source.shape[0]).to(destination.dtype)
    # the part of the source that lands inside the destination
    src_top, src_left = max(0, -top), max(0, -left)
    dst_top, dst_left = max(0, top), max(0, left)
    h = min(source.shape[-2] - src_top, destination.shape[-2] - dst_top)
    w = min(source.shape[-1] - src_left, destination.shape[-1] - dst_left)
    if h <= 0 or w <= 0:
        return destination
    src = source[..., src_top : src_top + h, src_left : src_left + w]
    m = weight[..., src_top : src_top + h, src_left : src_left + w]
    region = destination[..., dst_top : dst_top + h, dst_left : dst_left + w]
    destination[..., dst_top : dst_top + h, dst_left : dst_left + w] = src * m + region * (1 - m)
    return destination


class LatentCompositeMasked(Node):
    SCHEMA = NodeSchema(
        node_id="LatentCompositeMasked",
        display_name="Latent Composite Masked",
        category="latent",
        description="Paste source into destination at (x, y) pixels where the mask is 1 (the mask is resized to "
        "the source).",
        inputs=(
            _in("destination", "The latent pasted into."),
            _in("source", "The latent pasted."),
            Input("x", INT, "Left edge in pixels.", default=0, min=0, max=MAX_RESOLUTION, step=8),
            Input("y", INT, "Top edge in pixels.", default=0, min=0, max=MAX_RESOLUTION, step=8),
            Input(
                "resize_source", BOOLEAN, "Resize the source to the destination's size first.", default=False
            ),
            Input(
                "mask", MASK, "Where the source shows (1), [B, H, W]; all of it when absent.", optional=True
            ),
        ),
        outputs=_OUT,
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        destination: dict,
        source: dict,
        x: int,
        y: int,
        resize_source: bool,
        mask: torch.Tensor | None = None,
    ) -> tuple[dict]:
        dest = samples_of(destination, "destination")
        src = samples_of(source, "source")
        check_same_space(destination, source, "source")
        if src.shape[1] != dest.shape[1]:
            raise LatentError(f"source has {src.shape[1]} channels but destination has {dest.shape[1]}")
        if mask is not None and (not isinstance(mask, torch.Tensor) or mask.ndim not in (2, 3)):
            raise LatentError(
                f"mask: expected a MASK [B, H, W], found shape "
                f"{list(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__}"
            )
        return (with_samples(destination, composite(dest, src, x, y, mask, 8, resize_source)),)


# --- transforms -------------------------------------------------------------------------------
class LatentRotate(Node):
    SCHEMA = NodeSchema(
        node_id="LatentRotate",
        display_name="Rotate Latent",
        category="latent/transform",
        description="Rotate a latent clockwise by a multiple of 90 degrees.",
        inputs=(
            _in("samples"),
            Input(
                "rotation",
                COMBO,
                "Clockwise rotation.",
                options=("none", "90 degrees", "180 degrees", "270 degrees"),
            ),
        ),
        outputs=_OUT,
    )

    def run(self, ctx: NodeContext, *, samples: dict, rotation: str) -> tuple[dict]:
        turns = {"90": 1, "180": 2, "270": 3}.get(rotation.split(" ")[0], 0)
        return (with_samples(samples, torch.rot90(samples_of(samples, "samples"), k=turns, dims=[3, 2])),)


class LatentFlip(Node):
    SCHEMA = NodeSchema(
        node_id="LatentFlip",
        display_name="Flip Latent",
        category="latent/transform",
        description="Mirror a latent vertically (x-axis) or horizontally (y-axis).",
        inputs=(
            _in("samples"),
            Input(
                "flip_method",
                COMBO,
                "The mirror axis.",
                options=("x-axis: vertically", "y-axis: horizontally"),
            ),
        ),
        outputs=_OUT,
    )

    def run(self, ctx: NodeContext, *, samples: dict, flip_method: str) -> tuple[dict]:
        s = samples_of(samples, "samples")
        if flip_method.startswith("x"):
            s = torch.flip(s, dims=[2])
        elif flip_method.startswith("y"):
            s = torch.flip(s, dims=[3])
        return (with_samples(samples, s),)


class LatentCrop(Node):
    SCHEMA = NodeSchema(
        node_id="LatentCrop",
        display_name="Crop Latent",
        category="latent/transform",
        description="Crop a latent to width x height pixels from (x, y); a start past the edge is moved back so "
        "at least 64 pixels remain.",
        inputs=(
            _in("samples"),
            Input("width", INT, "Width in pixels.", default=512, min=64, max=MAX_RESOLUTION, step=8),
            Input("height", INT, "Height in pixels.", default=512, min=64, max=MAX_RESOLUTION, step=8),
            Input("x", INT, "Left edge in pixels.", default=0, min=0, max=MAX_RESOLUTION, step=8),
            Input("y", INT, "Top edge in pixels.", default=0, min=0, max=MAX_RESOLUTION, step=8),
        ),
        outputs=_OUT,
    )

    def run(self, ctx: NodeContext, *, samples: dict, width: int, height: int, x: int, y: int) -> tuple[dict]:
        s = samples_of(samples, "samples")
        x, y = min(x // 8, s.shape[3] - 8), min(y // 8, s.shape[2] - 8)
        x, y = max(x, 0), max(y, 0)
        return (with_samples(samples, s[:, :, y : y + height // 8, x : x + width // 8]),)


NODES: list[type[Node]] = [
    LatentAdd,
    LatentSubtract,
    LatentMultiply,
    LatentInterpolate,
    LatentBlend,
    LatentComposite,
    LatentCompositeMasked,
    LatentRotate,
    LatentFlip,
    LatentCrop,
]
