"""TextOverlay (nodes/image/text_overlay.py): where the text lands (top/bottom, left/right), its
colour and outline, wrapping, compositing over RGB and RGBA, and the errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import ImageFont

from nodes.image.text_overlay import TextOverlay, TextOverlayError, render_text_layer, wrap_text
from tests.nodes.image.image_ctx import image_ctx


@pytest.fixture()
def ctx(tmp_path: Path) -> Any:
    return image_ctx(tmp_path)


def _run(ctx: Any, images: torch.Tensor, text: str, **kw: Any) -> torch.Tensor:
    args = {
        "font_size": 20.0,
        "color": "#ff0000",
        "position": "top",
        "align": "left",
        "outline": False,
        "padding_x": 1.0,
        "padding_y": 1.0,
    } | kw
    return TextOverlay().run(ctx, images=images, text=text, **args)[0]


def test_schema_follows_comfyui() -> None:
    assert [(i.name, i.default) for i in TextOverlay.SCHEMA.inputs] == [
        ("images", None),
        ("text", ""),
        ("font_size", 5.0),
        ("color", "#ffffff"),
        ("position", "top"),
        ("align", "left"),
        ("outline", True),
        ("padding_x", 1.0),
        ("padding_y", 1.0),
    ]
    assert TextOverlay.SCHEMA.category == "text" and TextOverlay.SCHEMA.display_name == "Draw Text Overlay"


def _ink_rows_cols(image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    ink = image[0, ..., 0] > 0.5
    return ink.any(dim=1).nonzero()[:, 0], ink.any(dim=0).nonzero()[:, 0]


def test_text_lands_where_asked_in_its_colour(ctx: Any) -> None:
    black = torch.zeros(2, 100, 200, 3)
    top = _run(ctx, black, "Hi")
    rows, cols = _ink_rows_cols(top)
    assert rows.max() < 50 and cols.max() < 100  # top left
    assert torch.equal(top[0], top[1])  # one layer over every image
    assert top[..., 1:].max() == 0  # red text only
    bottom_right = _run(ctx, black, "Hi", position="bottom", align="right")
    rows, cols = _ink_rows_cols(bottom_right)
    assert rows.min() > 50 and cols.min() > 100 and cols.max() <= 199 - 1  # inside the 1 px margin


def test_empty_text_returns_the_images_and_escapes_become_lines(ctx: Any) -> None:
    images = torch.rand(1, 20, 20, 3)
    assert _run(ctx, images, "   ") is images
    one = _run(ctx, torch.zeros(1, 200, 200, 3), "A")
    two = _run(ctx, torch.zeros(1, 200, 200, 3), "A\\nA")  # the two characters \ and n
    assert _ink_rows_cols(two)[0].max() > _ink_rows_cols(one)[0].max() + 20


def test_wrapping_cuts_long_words() -> None:
    font = ImageFont.load_default(size=10)
    lines = wrap_text("a bb " + "c" * 40, font, 60)
    assert lines[0].startswith("a bb") and all(font.getlength(line) <= 60 for line in lines)
    assert (
        "".join(lines[1:]).replace(" ", "") == "c" * 40 or "".join(lines).replace(" ", "") == "abb" + "c" * 40
    )


def test_outline_and_rgba_compositing(ctx: Any) -> None:
    rgb, alpha = render_text_layer(
        120, 60, "Wo", "top", "left", 40.0, (255, 255, 255, 255), (0, 0, 0, 255), 1.0, 1.0
    )
    assert rgb.shape == (60, 120, 3) and alpha.shape == (60, 120, 1)
    opaque = alpha[..., 0] > 0.99
    assert (rgb[opaque].sum(dim=-1) < 0.1).any()  # black outline pixels
    transparent = torch.zeros(1, 60, 120, 4)
    out = _run(ctx, transparent, "Wo", font_size=40.0, color="#00ff00")
    assert out.shape == (1, 60, 120, 4)
    assert out[..., 3].max() == 1.0 and out[..., 3].min() == 0.0  # text opaque, the rest still clear
    text_px = out[0, ..., 3] > 0.99
    assert torch.allclose(out[0][text_px][:, :3], torch.tensor([0.0, 1.0, 0.0]).expand(int(text_px.sum()), 3))


def test_bad_colour_teaches(ctx: Any) -> None:
    with pytest.raises(TextOverlayError, match="color: expected a colour such as '#ffffff', found 'reddish'"):
        _run(ctx, torch.zeros(1, 20, 20, 3), "x", color="reddish")
