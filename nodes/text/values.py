"""ComfyUI's small value nodes: a seed widget and a colour split into its RGB integer, hex and alpha."""

from __future__ import annotations

import re

from engine.context import NodeContext
from engine.node import NativeNodeDef, Node
from engine.schema import FLOAT, INT, Input, NodeSchema, Output

COLOR = "COLOR"  # the frontend's colour-picker widget; its value is '#RRGGBB' or '#RRGGBBAA'
SEED_MAX = 0x7FFF_FFFF_FFFF_FFFF
_HEX_COLOR = re.compile(r"#([0-9a-fA-F]{6})([0-9a-fA-F]{2})?")


class ColorError(ValueError):
    """A colour that is not '#RRGGBB' or '#RRGGBBAA'; the message names the input."""


class SeedNode(Node):
    SCHEMA = NodeSchema(
        node_id="SeedNode",
        display_name="Seed",
        category="utils/primitive",
        description="One seed value to feed several samplers.",
        inputs=(
            Input(
                "seed",
                INT,
                "The seed value.",
                default=0,
                min=0,
                max=SEED_MAX,
                control_after_generate=True,
                extra={"control_after_generate": "fixed"},
            ),
        ),
        outputs=(Output("seed", INT, "The seed value."),),
    )

    def run(self, ctx: NodeContext, *, seed: int) -> tuple[int]:
        return (seed,)


def parse_color(color: str) -> tuple[int, str, float]:
    """(R*65536 + G*256 + B, '#rrggbb', alpha 0..1) of a '#RRGGBB' or '#RRGGBBAA' colour."""
    match = _HEX_COLOR.fullmatch(color.strip()) if isinstance(color, str) else None
    if match is None:
        raise ColorError(f"color: expected '#RRGGBB' or '#RRGGBBAA' (hex digits), found {color!r}")
    rgb, alpha = match.group(1), match.group(2)
    return int(rgb, 16), f"#{rgb}", (int(alpha, 16) / 255.0 if alpha else 1.0)


class ColorToRGBInt(Node):
    SCHEMA = NodeSchema(
        node_id="ColorToRGBInt",
        display_name="Color to RGB Int",
        category="utils",
        description="A colour as the integer R*65536 + G*256 + B, its '#RRGGBB' hex and its alpha.",
        inputs=(Input("color", COLOR, "A colour, '#RRGGBB' or '#RRGGBBAA'.", default="#ffffff"),),
        outputs=(
            Output("rgb_int", INT, "R*65536 + G*256 + B."),
            Output("hex", COLOR, "The colour as '#RRGGBB' (alpha removed)."),
            Output("alpha", FLOAT, "The alpha, 0.0-1.0 (1.0 without an alpha channel)."),
        ),
    )

    def run(self, ctx: NodeContext, *, color: str) -> tuple[int, str, float]:
        return parse_color(color)


class _ColorWidgetDef(NativeNodeDef):
    """The colour widget's text is checked by the node itself (COLOR is not one of Loom's widget types)."""

    self_validated = frozenset({"color"})


NODES = [SeedNode, _ColorWidgetDef(ColorToRGBInt)]
