"""PadImageNode (ComfyUI's "Pad Image"): pad by exact amounts, by a size multiplier or to the next
multiple, with a colour (optionally feathered into the image) or a mirror of the image.

Both ``padding_type`` and ``padding_style`` are ComfyUI V3 DynamicCombos: their own widgets travel in
API-format prompts as ``"padding_type.left"``, ``"padding_style.color"`` and so on. Loom declares
each dotted name as an optional input with ComfyUI's default (as ResizeImageMaskNode does,
``nodes/image/scale.py``); only the chosen option's inputs are read. The colour is the frontend's
COLOR widget ('#RRGGBB', alpha ignored), checked by the node itself.
"""

from __future__ import annotations

from typing import Any

import torch

from engine.context import NodeContext
from engine.node import NativeNodeDef, Node, OutputSizes
from engine.schema import COMBO, FLOAT, IMAGE, INT, Input, NodeSchema, Output
from nodes.core.tensor_sizes import image_resized
from nodes.image.load_save import MAX_RESOLUTION
from nodes.text.values import COLOR, ColorError, parse_color

PADDING_TYPES = ("pad dimensions", "pad by multiplier", "pad to multiple")
PADDING_STYLES = ("color", "mirror image")
Sides = tuple[int, int, int, int]  # left, top, right, bottom


class PadError(ValueError):
    """A padding choice or amount the node cannot use; the message names the input."""


def _sub(combo: str, name: str, type_: str, description: str, shown_for: tuple[str, ...], **kw: Any) -> Input:
    revealed = {"revealed_by": {"input": combo, "choices": list(shown_for)}}
    return Input(f"{combo}.{name}", type_, description, optional=True, extra=revealed, **kw)


def _split(extra: int) -> tuple[int, int]:
    """Padding split between opposite sides, the odd pixel after the image (right, bottom)."""
    return extra // 2, extra - extra // 2


def padding_amounts(padding_type: str, width: int, height: int, get: Any) -> Sides:
    """(left, top, right, bottom) for a width x height image; ``get(name)`` reads the type's inputs."""
    if padding_type == "pad dimensions":
        return tuple(int(get(side) or 0) for side in ("left", "top", "right", "bottom"))  # type: ignore[return-value]
    if padding_type == "pad by multiplier":
        factor = float(get("multiplier") or 1.0)
        (left, right), (top, bottom) = (
            _split(round(width * factor) - width),
            _split(round(height * factor) - height),
        )
        return left, top, right, bottom
    if padding_type == "pad to multiple":
        multiple = int(get("multiple") or 1)
        if multiple < 1:
            raise PadError(f"padding_type.multiple: expected 1 or more, found {multiple}")
        (left, right), (top, bottom) = _split(-width % multiple), _split(-height % multiple)
        return left, top, right, bottom
    raise PadError(
        f"padding_type: unknown choice {padding_type!r}; expected one of {', '.join(PADDING_TYPES)}"
    )


def mirror_indices(size: int, before: int, after: int) -> torch.Tensor:
    """Source indices for ``before + size + after`` positions, reflecting at the edges without
    repeating the edge pixel, and repeating the reflection when the padding exceeds the image."""
    positions = torch.arange(-before, size + after)
    if size == 1:
        return torch.zeros_like(positions)
    period = 2 * (size - 1)
    folded = positions % period
    return torch.where(folded >= size, period - folded, folded)


def feather_weights(height: int, width: int, sides: Sides, feathering: int) -> torch.Tensor:
    """[H, W] share of the fill colour inside the image: ((f - d) / f)² within f pixels of a padded
    side (d = 0 on the outermost row or column), 0 elsewhere, as ImagePadForOutpaint feathers."""
    left, top, right, bottom = sides
    far = max(height, width) + feathering
    rows, cols = torch.arange(height), torch.arange(width)
    d_top = rows if top else torch.full_like(rows, far)
    d_bottom = height - 1 - rows if bottom else torch.full_like(rows, far)
    d_left = cols if left else torch.full_like(cols, far)
    d_right = width - 1 - cols if right else torch.full_like(cols, far)
    dist = torch.minimum(torch.minimum(d_top, d_bottom)[:, None], torch.minimum(d_left, d_right)[None, :])
    return ((feathering - dist).clamp(min=0).float() / feathering) ** 2


def pad_with_color(
    image: torch.Tensor, sides: Sides, rgb: tuple[float, float, float], feathering: int
) -> torch.Tensor:
    left, top, right, bottom = sides
    b, h, w, c = image.shape
    fill = torch.ones(c, dtype=image.dtype, device=image.device)  # channels past RGB (alpha): opaque
    fill[: min(3, c)] = torch.tensor(rgb[: min(3, c)], dtype=image.dtype)
    out = fill.expand(b, h + top + bottom, w + left + right, c).clone()
    inner = image
    if feathering > 0:
        weight = feather_weights(h, w, sides, feathering).to(image)[None, :, :, None]
        inner = image * (1 - weight) + fill * weight
    out[:, top : top + h, left : left + w] = inner
    return out


class PadImageNode(Node):
    SCHEMA = NodeSchema(
        node_id="PadImageNode",
        display_name="Pad Image",
        category="image/transform",
        description="Pad an image with a solid color or a mirrored copy of its edges: exact pixels per side, "
        "a size multiplier, or up to a multiple of a number.",
        inputs=(
            Input("image", IMAGE, "The image to pad."),
            Input(
                "padding_type",
                COMBO,
                "How much padding to add.",
                options=PADDING_TYPES,
                default=PADDING_TYPES[0],
            ),
            *(
                _sub(
                    "padding_type",
                    side,
                    INT,
                    f"Pixels to add on the {side}.",
                    ("pad dimensions",),
                    default=0,
                    min=0,
                    max=MAX_RESOLUTION,
                )
                for side in ("left", "top", "right", "bottom")
            ),
            _sub(
                "padding_type",
                "multiplier",
                FLOAT,
                "Output size relative to the input (1.5 adds 25% on each side); split evenly between opposite sides.",
                ("pad by multiplier",),
                default=1.0,
                min=1.0,
                max=8.0,
                step=0.01,
            ),
            _sub(
                "padding_type",
                "multiple",
                INT,
                "Pad so that the width and height are divisible by this; the odd pixel goes right and bottom.",
                ("pad to multiple",),
                default=32,
                min=1,
                max=MAX_RESOLUTION,
            ),
            Input(
                "padding_style",
                COMBO,
                "What to fill the padded area with.",
                options=PADDING_STYLES,
                default=PADDING_STYLES[0],
            ),
            _sub(
                "padding_style",
                "color",
                COLOR,
                "Fill color ('#RRGGBB'; alpha is ignored).",
                ("color",),
                default="#000000",
            ),
            _sub(
                "padding_style",
                "feathering",
                INT,
                "Blend this many pixels of the image edge into the fill color on the padded sides (0: a hard edge).",
                ("color",),
                default=0,
                min=0,
                max=MAX_RESOLUTION,
            ),
        ),
        outputs=(Output("IMAGE", IMAGE, "The padded image, with the input's batch and channels."),),
    )

    @classmethod
    def estimate_outputs(cls, *, image: Any = None, padding_type: Any = None, **option: Any) -> OutputSizes:
        known = {
            k.removeprefix("padding_type."): v for k, v in option.items() if k.startswith("padding_type.")
        }
        if padding_type not in PADDING_TYPES or any(v is None for v in known.values()):
            return (None,)

        def to(width: int, height: int) -> tuple[int, int]:
            left, top, right, bottom = padding_amounts(padding_type, width, height, known.get)
            return width + left + right, height + top + bottom

        return (image_resized(image, to),)

    def run(
        self, ctx: NodeContext, *, image: torch.Tensor, padding_type: str, padding_style: str, **option: Any
    ) -> tuple[torch.Tensor]:
        h, w = image.shape[1], image.shape[2]
        sides = padding_amounts(padding_type, w, h, lambda name: option.get(f"padding_type.{name}"))
        if not any(sides):
            return (image,)
        left, top, right, bottom = sides
        if padding_style == "mirror image":
            rows, cols = mirror_indices(h, top, bottom), mirror_indices(w, left, right)
            return (image[:, rows][:, :, cols],)
        if padding_style != "color":
            raise PadError(
                f"padding_style: unknown choice {padding_style!r}; expected one of {', '.join(PADDING_STYLES)}"
            )
        try:
            packed, _, _ = parse_color(option.get("padding_style.color", "#000000"))
        except ColorError as exc:
            raise PadError(f"padding_style.{exc}") from None
        rgb = ((packed >> 16) / 255.0, ((packed >> 8) & 255) / 255.0, (packed & 255) / 255.0)
        feathering = int(option.get("padding_style.feathering") or 0)
        return (pad_with_color(image, sides, rgb, feathering),)


class PadImageDef(NativeNodeDef):
    """The COLOR widget's text is checked by the node itself (COLOR is not one of Loom's widget types)."""

    self_validated = frozenset({"padding_style.color"})


NODES = [PadImageDef(PadImageNode)]
