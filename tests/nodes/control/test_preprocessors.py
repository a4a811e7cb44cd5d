"""Canny: edges where a synthetic image has them and nowhere else, batched like one by one, the
ComfyUI output layout, and clear errors for bad thresholds and non-images."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.context import Folders, NodeContext
from nodes.control.preprocessors import Canny


def _ctx(tmp_path: Path) -> NodeContext:
    return NodeContext(node_id="3", prompt_id="t", folders=Folders(tmp_path, tmp_path, tmp_path))


def _square(size: int = 64, top: int = 16, left: int = 20, side: int = 24) -> torch.Tensor:
    """A white square on black: its outline is the only edge."""
    image = torch.zeros(1, size, size, 3)
    image[:, top : top + side, left : left + side] = 1.0
    return image


def _outline(size: int, top: int, left: int, side: int, width: int) -> torch.Tensor:
    """Pixels within ``width`` of the square's border."""
    ys, xs = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")

    def inside(pad: int) -> torch.Tensor:
        return (ys >= top - pad) & (ys < top + side + pad) & (xs >= left - pad) & (xs < left + side + pad)

    return inside(width) & ~inside(-width)


def test_edges_are_found_on_the_square_outline_and_nowhere_else(tmp_path: Path) -> None:
    (edges,) = Canny().run(_ctx(tmp_path), image=_square(), low_threshold=0.4, high_threshold=0.8)
    assert edges.shape == (1, 64, 64, 3) and edges.dtype == torch.float32
    assert set(edges.unique().tolist()) <= {0.0, 1.0}
    assert torch.equal(edges[..., 0], edges[..., 1]) and torch.equal(edges[..., 0], edges[..., 2])
    found = edges[0, ..., 0].bool()
    assert not (found & ~_outline(64, 16, 20, 24, width=2)).any()  # no edge off the outline
    for row in (28, 30, 34):  # every side is crossed: left and right edges on middle rows
        cols = found[row].nonzero().flatten().tolist()
        assert any(abs(c - 20) <= 1 for c in cols) and any(abs(c - 43) <= 1 for c in cols), cols
    for col in (28, 32, 36):  # top and bottom edges on middle columns
        rows = found[:, col].nonzero().flatten().tolist()
        assert any(abs(r - 16) <= 1 for r in rows) and any(abs(r - 39) <= 1 for r in rows), rows


def test_a_flat_image_has_no_edges_and_a_weak_step_needs_a_low_threshold(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path)
    (flat,) = Canny().run(ctx, image=torch.full((1, 32, 32, 3), 0.5), low_threshold=0.1, high_threshold=0.2)
    assert flat.sum() == 0
    weak = _square(side=16) * 0.15
    (strict,) = Canny().run(ctx, image=weak, low_threshold=0.4, high_threshold=0.8)
    (loose,) = Canny().run(ctx, image=weak, low_threshold=0.05, high_threshold=0.1)
    assert strict.sum() == 0 and loose.sum() > 0


def test_a_batch_gives_what_each_image_gives_alone(tmp_path: Path) -> None:
    # Textured images: on a perfectly symmetric synthetic edge the gradient directions tie exactly, and
    # batched and single convolutions round differently (~1e-7), which breaks such ties either way.
    ctx = _ctx(tmp_path)
    g = torch.Generator().manual_seed(0)
    textured = torch.nn.functional.avg_pool2d(torch.rand(3, 3, 66, 66, generator=g), 3, stride=1).movedim(
        1, -1
    )
    batch = (textured + 0.5 * torch.cat([_square(), _square(top=8, left=8, side=30), _square(side=4)])).clamp(
        0, 1
    )
    (together,) = Canny().run(ctx, image=batch, low_threshold=0.3, high_threshold=0.6)
    for i in range(3):
        (alone,) = Canny().run(ctx, image=batch[i : i + 1], low_threshold=0.3, high_threshold=0.6)
        assert torch.equal(together[i : i + 1], alone)


def test_rgba_images_use_their_colour_channels(tmp_path: Path) -> None:
    rgba = torch.cat([_square(), torch.rand(1, 64, 64, 1)], dim=-1)
    ctx = _ctx(tmp_path)
    (from_rgba,) = Canny().run(ctx, image=rgba, low_threshold=0.4, high_threshold=0.8)
    (from_rgb,) = Canny().run(ctx, image=_square(), low_threshold=0.4, high_threshold=0.8)
    assert torch.equal(from_rgba, from_rgb)


def test_bad_inputs_get_clear_errors(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path)
    with pytest.raises(ValueError, match="low_threshold .* must not be above high_threshold"):
        Canny().run(ctx, image=_square(), low_threshold=0.9, high_threshold=0.2)
    with pytest.raises(TypeError, match="must be an IMAGE"):
        Canny().run(ctx, image=torch.zeros(1, 4, 8, 8), low_threshold=0.4, high_threshold=0.8)


def test_schema_is_comfyuis() -> None:
    schema = Canny.SCHEMA
    assert (schema.node_id, schema.category) == ("Canny", "image/preprocessors")
    assert [(i.name, i.type, i.default, i.min, i.max, i.step) for i in schema.inputs] == [
        ("image", "IMAGE", None, None, None, None),
        ("low_threshold", "FLOAT", 0.4, 0.01, 0.99, 0.01),
        ("high_threshold", "FLOAT", 0.8, 0.01, 0.99, 0.01),
    ]
    assert [o.type for o in schema.outputs] == ["IMAGE"]
