"""TextOverlay (ComfyUI's "Draw Text Overlay", ``comfy_extras/nodes_text_overlay.py``): text drawn
with Pillow's own scalable default font over every image of a batch.

The text layer is rendered once per batch on a transparent canvas: the font size is a percentage of
the image height, shrunk by 10 % steps (not below 2 % of the height or 10 px) until the wrapped
block fits between the margins; lines are 1.2 font sizes apart; an optional black outline is 4 % of
the font size. The layer goes over RGB images by its alpha, and over RGBA images source-over with
premultiplied colours.
"""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image, ImageColor, ImageDraw, ImageFont

from engine.context import NodeContext
from engine.node import NativeNodeDef, Node
from engine.schema import BOOLEAN, COMBO, FLOAT, IMAGE, STRING, Input, NodeSchema, Output
from nodes.text.values import COLOR

LINE_SPACING = 1.2
MIN_FONT_PERCENT = 2.0
MIN_FONT_PIXELS = 10
OUTLINE_FACTOR = 0.04
RGBA = tuple[int, int, int, int]


class TextOverlayError(ValueError):
    """A colour Pillow cannot read; the message names the input."""


def parse_rgba(color: str) -> RGBA:
    try:
        parsed = ImageColor.getrgb(color)
    except (ValueError, AttributeError):
        raise TextOverlayError(f"color: expected a colour such as '#ffffff', found {color!r}") from None
    return (*parsed, 255) if len(parsed) == 3 else parsed  # type: ignore[return-value]


def wrap_text(text: str, font: ImageFont.FreeTypeFont, max_width: int) -> list[str]:
    """Lines no wider than ``max_width``: words wrapped, a word too long for a line cut into pieces."""
    lines: list[str] = []
    for raw in text.split("\n"):
        words = raw.split()
        if not words:
            lines.append("")
            continue
        current = ""
        for word in words:
            while font.getlength(word) > max_width and len(word) > 1:
                cut = 1
                while cut < len(word) and font.getlength(word[: cut + 1]) <= max_width:
                    cut += 1
                if current:
                    lines.append(current)
                    current = ""
                lines.append(word[:cut])
                word = word[cut:]
            candidate = current + " " + word if current else word
            if not current or font.getlength(candidate) <= max_width:
                current = candidate
            else:
                lines.append(current)
                current = word
        if current:
            lines.append(current)
    return lines


def render_text_layer(
    width: int,
    height: int,
    text: str,
    position: str,
    align: str,
    font_size: float,
    fill: RGBA,
    outline: RGBA,
    padding_x: float,
    padding_y: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The text as ([H, W, 3] colour, [H, W, 1] alpha) in 0..1."""
    layer = Image.new("RGBA", (width, height), (0, 0, 0, 0))
    draw = ImageDraw.Draw(layer)
    margin_x = int(round(padding_x / 100.0 * min(width, height)))
    margin_y = int(round(padding_y / 100.0 * min(width, height)))
    max_width, max_height = max(1, width - 2 * margin_x), max(1, height - 2 * margin_y)
    size = max(1, int(round(font_size / 100.0 * height)))
    floor = min(size, max(MIN_FONT_PIXELS, int(round(MIN_FONT_PERCENT / 100.0 * height))))
    while True:
        font = ImageFont.load_default(size=size)
        stroke = max(1, int(round(size * OUTLINE_FACTOR))) if outline[3] > 0 else 0
        block = "\n".join(wrap_text(text, font, max_width))  # type: ignore[arg-type]
        single = draw.textbbox((0, 0), "Ay", font=font, stroke_width=stroke)
        double = draw.multiline_textbbox((0, 0), "Ay\nAy", font=font, spacing=0, stroke_width=stroke)
        advance = (double[3] - double[1]) - (single[3] - single[1])
        spacing = int(round(size * LINE_SPACING - advance))
        box = draw.multiline_textbbox((0, 0), block, font=font, spacing=spacing, stroke_width=stroke)
        if box[3] - box[1] <= max_height or size <= floor:
            break
        size = max(floor, int(size * 0.9))
    anchor, x = {"left": ("l", margin_x), "center": ("m", width / 2), "right": ("r", width - margin_x)}[align]
    y = height - margin_y - box[3] if position == "bottom" else margin_y - box[1]
    draw.multiline_text(
        (x, y),
        block,
        font=font,
        fill=fill,
        anchor=anchor + "a",
        align=align,
        spacing=spacing,
        stroke_width=stroke,
        stroke_fill=outline,
    )
    pixels = torch.from_numpy(np.array(layer).astype(np.float32) / 255.0)
    return pixels[..., :3], pixels[..., 3:4]


class TextOverlay(Node):
    SCHEMA = NodeSchema(
        node_id="TextOverlay",
        display_name="Draw Text Overlay",
        category="text",
        description="Draw text overlay on an image or batch of images.",
        inputs=(
            Input("images", IMAGE, "The images to draw on."),
            Input(
                "text",
                STRING,
                "The text ('\\n' and '\\t' are turned into new lines and tabs).",
                default="",
                multiline=True,
            ),
            Input(
                "font_size",
                FLOAT,
                "Font size as a percentage of the image height.",
                default=5.0,
                min=0.5,
                max=50.0,
                step=0.5,
            ),
            Input("color", COLOR, "Color of the text.", default="#ffffff"),
            Input("position", COMBO, "Where the text sits.", options=("top", "bottom"), default="top"),
            Input(
                "align", COMBO, "How lines are aligned.", options=("left", "center", "right"), default="left"
            ),
            Input("outline", BOOLEAN, "Draw a black outline around the text.", default=True),
            Input(
                "padding_x",
                FLOAT,
                "Left and right padding as a percentage of the shorter image side.",
                default=1.0,
                min=0.0,
                max=25.0,
                step=0.5,
            ),
            Input(
                "padding_y",
                FLOAT,
                "Top and bottom padding as a percentage of the shorter image side.",
                default=1.0,
                min=0.0,
                max=25.0,
                step=0.5,
            ),
        ),
        outputs=(Output("images", IMAGE, "The images with the text on top."),),
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        images: torch.Tensor,
        text: str,
        font_size: float,
        color: str,
        position: str,
        align: str,
        outline: bool,
        padding_x: float = 1.0,
        padding_y: float = 1.0,
    ) -> tuple[torch.Tensor]:
        if text.strip() == "":
            return (images,)
        text = text.replace("\\n", "\n").replace("\\t", "\t")
        rgb, alpha = render_text_layer(
            images.shape[2],
            images.shape[1],
            text,
            position,
            align,
            font_size,
            parse_rgba(color),
            (0, 0, 0, 255) if outline else (0, 0, 0, 0),
            padding_x,
            padding_y,
        )
        rgb, alpha = rgb.to(images), alpha.to(images)
        if images.shape[-1] == 4:
            base, base_alpha = images[..., :3], images[..., 3:]
            out_alpha = alpha + (1.0 - alpha) * base_alpha
            out_rgb = rgb * alpha + (1.0 - alpha) * base * base_alpha
            out_rgb = torch.where(out_alpha > 1e-5, out_rgb / out_alpha, torch.zeros_like(out_rgb))
            return (torch.cat((out_rgb.clamp(0, 1), out_alpha), dim=-1),)
        return (images * (1.0 - alpha) + rgb * alpha,)


class TextOverlayDef(NativeNodeDef):
    """The COLOR widget's text is checked by the node itself (COLOR is not one of Loom's widget types)."""

    self_validated = frozenset({"color"})


NODES = [TextOverlayDef(TextOverlay)]
