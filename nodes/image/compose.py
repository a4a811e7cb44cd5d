"""Compositing IMAGE with masks and alpha: ImageCompositeMasked, PorterDuffImageComposite,
JoinImageWithAlpha, SplitImageWithAlpha (ComfyUI's names, inputs and semantics;
``comfy_extras/nodes_mask.py`` and ``nodes_compositing.py``).

A MASK is "1 = masked / transparent" where it stands for alpha (LoadImage's mask, these nodes'
alpha inputs and outputs): alpha = 1 - mask. :func:`composite` is shared with the latent nodes
(``LatentCompositeMasked`` pastes with ``multiplier=8``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from engine.context import NodeContext
from engine.node import Node
from engine.schema import BOOLEAN, COMBO, IMAGE, INT, MASK, Input, NodeSchema, Output
from nodes.core.resize import resize_image
from nodes.image.filters import match_alpha
from nodes.image.load_save import MAX_RESOLUTION, ImageError


def repeat_to_batch(tensor: torch.Tensor, batch: int) -> torch.Tensor:
    """Cut or cycle ``tensor`` along dim 0 to ``batch`` items (ComfyUI's repeat_to_batch_size)."""
    if tensor.shape[0] > batch:
        return tensor[:batch]
    if tensor.shape[0] < batch:
        reps = [math.ceil(batch / tensor.shape[0])] + [1] * (tensor.ndim - 1)
        return tensor.repeat(reps)[:batch]
    return tensor


def composite(
    destination: torch.Tensor,
    source: torch.Tensor,
    x: int,
    y: int,
    mask: torch.Tensor | None = None,
    multiplier: int = 1,
    resize_source: bool = False,
) -> torch.Tensor:
    """Paste ``source`` [b, C, h, w] onto a copy of ``destination`` [B, C, H, W] with its top-left
    corner at (x, y) // multiplier, blended by ``mask`` (any [..., mh, mw], resized bilinearly to
    the source; 1 = source). The source (and mask) batch is cycled or cut to B; the part falling
    outside the destination is dropped. ``resize_source`` first stretches the source to H x W."""
    if resize_source:
        source = F.interpolate(source, size=destination.shape[-2:], mode="bilinear")
    source = repeat_to_batch(source.to(destination), destination.shape[0])
    h, w = source.shape[-2:]
    if mask is None:
        weights = torch.ones_like(source[:, :1])
    else:
        flat = mask.to(destination).reshape(-1, 1, mask.shape[-2], mask.shape[-1])
        weights = repeat_to_batch(F.interpolate(flat, size=(h, w), mode="bilinear"), source.shape[0])
    left, top = x // multiplier, y // multiplier
    x0, y0 = max(left, 0), max(top, 0)
    x1, y1 = min(left + w, destination.shape[-1]), min(top + h, destination.shape[-2])
    out = destination.clone()
    if x1 <= x0 or y1 <= y0:
        return out  # nothing overlaps
    region = (..., slice(y0 - top, y1 - top), slice(x0 - left, x1 - left))
    m = weights[region]
    out[..., y0:y1, x0:x1] = m * source[region] + (1 - m) * out[..., y0:y1, x0:x1]
    return out


class ImageCompositeMasked(Node):
    SCHEMA = NodeSchema(
        node_id="ImageCompositeMasked",
        display_name="ImageCompositeMasked",
        category="image",
        description="Paste source onto destination at (x, y), through an optional mask (1 = source).",
        inputs=(
            Input("destination", IMAGE, "The background images."),
            Input("source", IMAGE, "The images to paste (batch cycled to the destination's)."),
            Input("x", INT, "Left edge of the paste.", default=0, min=0, max=MAX_RESOLUTION, step=1),
            Input("y", INT, "Top edge of the paste.", default=0, min=0, max=MAX_RESOLUTION, step=1),
            Input(
                "resize_source", BOOLEAN, "Stretch the source to the destination's size first.", default=False
            ),
            Input("mask", MASK, "Where the source shows (resized to the source).", optional=True),
        ),
        outputs=(Output("IMAGE", IMAGE, "The composited images."),),
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        destination: torch.Tensor,
        source: torch.Tensor,
        x: int,
        y: int,
        resize_source: bool,
        mask: torch.Tensor | None = None,
    ) -> tuple:
        source = match_alpha(destination, source)
        out = composite(destination.movedim(-1, 1), source.movedim(-1, 1), x, y, mask, 1, resize_source)
        return (out.movedim(1, -1),)


PORTER_DUFF_MODES = (
    "ADD",
    "CLEAR",
    "DARKEN",
    "DST",
    "DST_ATOP",
    "DST_IN",
    "DST_OUT",
    "DST_OVER",
    "LIGHTEN",
    "MULTIPLY",
    "OVERLAY",
    "SCREEN",
    "SRC",
    "SRC_ATOP",
    "SRC_IN",
    "SRC_OUT",
    "SRC_OVER",
    "XOR",
)
Pair = tuple[torch.Tensor, torch.Tensor]


def _porter_duff_ops() -> dict[str, Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], Pair]]:
    """Each mode: (src colour, src alpha, dst colour, dst alpha), colours premultiplied ->
    (out colour premultiplied, out alpha)."""

    def union(sa: torch.Tensor, da: torch.Tensor) -> torch.Tensor:
        return sa + da - sa * da

    return {
        "ADD": lambda s, sa, d, da: ((s + d).clamp(0, 1), (sa + da).clamp(0, 1)),
        "CLEAR": lambda s, sa, d, da: (torch.zeros_like(d), torch.zeros_like(da)),
        "DARKEN": lambda s, sa, d, da: ((1 - da) * s + (1 - sa) * d + torch.minimum(s, d), union(sa, da)),
        "DST": lambda s, sa, d, da: (d, da),
        "DST_ATOP": lambda s, sa, d, da: (sa * d + (1 - da) * s, sa),
        "DST_IN": lambda s, sa, d, da: (d * sa, sa * da),
        "DST_OUT": lambda s, sa, d, da: ((1 - sa) * d, (1 - sa) * da),
        "DST_OVER": lambda s, sa, d, da: (d + (1 - da) * s, da + (1 - da) * sa),
        "LIGHTEN": lambda s, sa, d, da: ((1 - da) * s + (1 - sa) * d + torch.maximum(s, d), union(sa, da)),
        "MULTIPLY": lambda s, sa, d, da: (s * d, sa * da),
        "OVERLAY": lambda s, sa, d, da: (
            torch.where(2 * d < da, 2 * s * d, sa * da - 2 * (da - s) * (sa - d)),
            union(sa, da),
        ),
        "SCREEN": lambda s, sa, d, da: (s + d - s * d, union(sa, da)),
        "SRC": lambda s, sa, d, da: (s, sa),
        "SRC_ATOP": lambda s, sa, d, da: (da * s + (1 - sa) * d, da),
        "SRC_IN": lambda s, sa, d, da: (s * da, sa * da),
        "SRC_OUT": lambda s, sa, d, da: ((1 - da) * s, (1 - da) * sa),
        "SRC_OVER": lambda s, sa, d, da: (s + (1 - sa) * d, sa + (1 - sa) * da),
        "XOR": lambda s, sa, d, da: ((1 - da) * s + (1 - sa) * d, (1 - da) * sa + (1 - sa) * da),
    }


def porter_duff(
    source: torch.Tensor,
    source_mask: torch.Tensor,
    destination: torch.Tensor,
    destination_mask: torch.Tensor,
    mode: str,
) -> Pair:
    """Porter-Duff compositing of [B, H, W, C] colours with [B, H, W, 1] masks (1 = transparent);
    returns the straight (not premultiplied) colour clamped to 0..1 and the result as a mask."""
    ops = _porter_duff_ops()
    if mode not in ops:
        raise ImageError(f"unknown mode {mode!r}; expected one of {', '.join(PORTER_DUFF_MODES)}")
    sa, da = 1 - source_mask, 1 - destination_mask
    colour, alpha = ops[mode](source * sa, sa, destination * da, da)
    straight = torch.where(alpha > 1e-5, colour / alpha, torch.zeros_like(colour)).clamp(0, 1)
    return straight, 1 - alpha


def _fit(t: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """[B, H, W, C] resized bicubically (centre crop) to height x width, unless already that size."""
    return t if t.shape[1:3] == (height, width) else resize_image(t, width, height, "bicubic", "center")


class PorterDuffImageComposite(Node):
    SCHEMA = NodeSchema(
        node_id="PorterDuffImageComposite",
        display_name="Porter-Duff Image Composite",
        category="mask/compositing",
        description="Combine two images with their alpha masks by a Porter-Duff operator.",
        inputs=(
            Input("source", IMAGE, "The source images."),
            Input("source_alpha", MASK, "The source's mask (1 = transparent)."),
            Input("destination", IMAGE, "The destination images."),
            Input("destination_alpha", MASK, "The destination's mask (1 = transparent)."),
            Input("mode", COMBO, "The operator.", options=PORTER_DUFF_MODES, default="DST"),
        ),
        outputs=(Output("IMAGE", IMAGE, "The result's colour."), Output("MASK", MASK, "The result's mask.")),
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        source: torch.Tensor,
        source_alpha: torch.Tensor,
        destination: torch.Tensor,
        destination_alpha: torch.Tensor,
        mode: str,
    ) -> tuple:
        if source.shape[-1] != destination.shape[-1]:
            raise ImageError(
                f"source has {source.shape[-1]} channels and destination {destination.shape[-1]}; give both RGB "
                "(split off alpha with SplitImageWithAlpha)"
            )
        n = min(len(source), len(source_alpha), len(destination), len(destination_alpha))
        h, w = destination.shape[1:3]
        dst_mask = _fit(destination_alpha[:n, ..., None], h, w)
        src = _fit(source[:n], h, w)
        src_mask = _fit(source_alpha[:n, ..., None], h, w)
        image, mask = porter_duff(src, src_mask, destination[:n], dst_mask, mode)
        return image, mask[..., 0]


class SplitImageWithAlpha(Node):
    SCHEMA = NodeSchema(
        node_id="SplitImageWithAlpha",
        display_name="Split Image with Alpha",
        category="mask/compositing",
        description="Separate RGB from alpha; the alpha comes out as a mask (1 = transparent).",
        inputs=(Input("image", IMAGE, "RGB or RGBA images."),),
        outputs=(
            Output("IMAGE", IMAGE, "The RGB channels."),
            Output("MASK", MASK, "1 - alpha (zeros without alpha)."),
        ),
    )

    def run(self, ctx: NodeContext, *, image: torch.Tensor) -> tuple:
        alpha = image[..., 3] if image.shape[-1] > 3 else torch.ones_like(image[..., 0])
        return image[..., :3], 1.0 - alpha


class JoinImageWithAlpha(Node):
    SCHEMA = NodeSchema(
        node_id="JoinImageWithAlpha",
        display_name="Join Image with Alpha",
        category="mask/compositing",
        description="Make RGBA images from RGB and a mask (alpha = 1 - mask, mask resized to the image).",
        inputs=(
            Input("image", IMAGE, "The RGB images."),
            Input("alpha", MASK, "The mask (1 = transparent)."),
        ),
        outputs=(Output("IMAGE", IMAGE, "RGBA images."),),
    )

    def run(self, ctx: NodeContext, *, image: torch.Tensor, alpha: torch.Tensor) -> tuple:
        if alpha.ndim == 2:
            alpha = alpha[None]
        n = min(len(image), len(alpha))
        flat = alpha.reshape(-1, 1, alpha.shape[-2], alpha.shape[-1]).to(image)
        opacity = 1.0 - F.interpolate(flat, size=image.shape[1:3], mode="bilinear")[:, 0]
        return (torch.cat([image[:n, ..., :3], opacity[:n, ..., None]], dim=-1),)


NODES: list[type[Node]] = [
    ImageCompositeMasked,
    PorterDuffImageComposite,
    SplitImageWithAlpha,
    JoinImageWithAlpha,
]
