"""ComfyUI's dataset image nodes (nodes/image/dataset_images.py): sizes, crops and colour formulas
checked against values computed by hand from ComfyUI's code, the schemas against its names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from nodes.image.dataset_images import (
    AdjustBrightness,
    AdjustContrast,
    CenterCropImages,
    DatasetImageError,
    ImageDeduplication,
    ImageGrid,
    NormalizeImages,
    RandomCropImages,
    ResizeImagesByLongerEdge,
    ResizeImagesByShorterEdge,
)
from tests.nodes.image.image_ctx import image_ctx


@pytest.fixture()
def ctx(tmp_path: Path) -> Any:
    return image_ctx(tmp_path)


def _ramp(b: int, h: int, w: int, c: int = 3) -> torch.Tensor:
    """Values on the 8-bit grid, so a Pillow round trip is exact."""
    values = torch.arange(b * h * w * c).reshape(b, h, w, c) % 256
    return values.float() / 255.0


def _names(node: Any) -> list[tuple[str, Any, Any, Any]]:
    return [(i.name, i.default, i.min, i.max) for i in node.SCHEMA.inputs]


def test_schemas_follow_comfyui() -> None:
    assert _names(ResizeImagesByLongerEdge) == [("images", None, None, None), ("longer_edge", 1024, 1, 8192)]
    assert _names(ResizeImagesByShorterEdge) == [("images", None, None, None), ("shorter_edge", 512, 1, 8192)]
    assert _names(CenterCropImages)[1:] == [("width", 512, 1, 8192), ("height", 512, 1, 8192)]
    assert _names(RandomCropImages)[1:] == [
        ("width", 512, 1, 8192),
        ("height", 512, 1, 8192),
        ("seed", 0, 0, 0xFFFFFFFFFFFFFFFF),
    ]
    assert _names(NormalizeImages)[1:] == [("mean", 0.5, 0.0, 1.0), ("std", 0.5, 0.001, 1.0)]
    assert _names(AdjustBrightness)[1:] == [("factor", 1.0, 0.0, 2.0)]
    assert _names(AdjustContrast)[1:] == [("factor", 1.0, 0.0, 2.0)]
    assert _names(ImageGrid)[1:] == [
        ("columns", 4, 1, 20),
        ("cell_width", 256, 32, 2048),
        ("cell_height", 256, 32, 2048),
        ("padding", 4, 0, 50),
    ]
    assert _names(ImageDeduplication)[1:] == [("similarity_threshold", 0.95, 0.0, 1.0)]
    assert ImageGrid.SCHEMA.input_is_list and not ImageGrid.SCHEMA.outputs[0].is_list
    assert ImageDeduplication.SCHEMA.input_is_list and ImageDeduplication.SCHEMA.outputs[0].is_list
    for node in (ResizeImagesByLongerEdge, NormalizeImages, ImageGrid):
        assert node.SCHEMA.category == "dataset/image" and node.SCHEMA.outputs[0].name == "images"


def test_resize_by_edges_keep_the_aspect_with_int_truncation(ctx: Any) -> None:
    image = _ramp(2, 30, 40)
    longer = ResizeImagesByLongerEdge().run(ctx, images=image, longer_edge=16)[0]
    assert longer.shape == (2, 12, 16, 3)  # w > h: h = int(30 * 16 / 40)
    shorter = ResizeImagesByShorterEdge().run(ctx, images=image, shorter_edge=7)[0]
    assert shorter.shape == (2, 7, 9, 3)  # h is shorter: w = int(40 * 7 / 30) = 9
    tall = ResizeImagesByLongerEdge().run(ctx, images=_ramp(1, 40, 30), longer_edge=10)[0]
    assert tall.shape == (1, 10, 7, 3)
    # the pixels are Pillow's Lanczos resize of the 8-bit image
    pil = Image.fromarray((image[0].numpy() * 255).astype(np.uint8)).resize(
        (16, 12), Image.Resampling.LANCZOS
    )
    assert torch.equal(longer[0], torch.from_numpy(np.array(pil).astype(np.float32) / 255.0))


def test_resize_to_nothing_teaches(ctx: Any) -> None:
    with pytest.raises(DatasetImageError, match="longer_edge: 1 would make a 40x2 image 1x0"):
        ResizeImagesByLongerEdge().run(ctx, images=_ramp(1, 2, 40), longer_edge=1)
    with pytest.raises(DatasetImageError, match=r"images: expected an IMAGE batch \[B, H, W, C\]"):
        ResizeImagesByLongerEdge().run(ctx, images=torch.zeros(4, 4), longer_edge=2)


def test_center_crop_and_its_limits(ctx: Any) -> None:
    image = _ramp(1, 9, 10)
    out = CenterCropImages().run(ctx, images=image, width=4, height=3)[0]
    assert torch.equal(out, image[:, 3:6, 3:7])  # left (10-4)//2 = 3, top (9-3)//2 = 3
    wide = CenterCropImages().run(ctx, images=image, width=20, height=5)[0]
    assert torch.equal(wide, image[:, 2:7, :])  # left 0, cut at the right edge


def test_random_crop_uses_comfyuis_numpy_draws(ctx: Any) -> None:
    image = _ramp(1, 12, 16)
    out = RandomCropImages().run(ctx, images=image, width=5, height=4, seed=7)[0]
    np.random.seed(7)
    left = np.random.randint(0, 16 - 5 + 1)
    top = np.random.randint(0, 12 - 4 + 1)
    assert torch.equal(out, image[:, top : top + 4, left : left + 5])
    same = RandomCropImages().run(ctx, images=image, width=5, height=4, seed=7)[0]
    assert torch.equal(out, same)
    whole = RandomCropImages().run(ctx, images=image, width=99, height=99, seed=3)[0]
    assert torch.equal(whole, image)


def test_colour_formulas_clamp_and_keep_alpha(ctx: Any) -> None:
    image = torch.tensor([[[[0.2, 0.6, 1.0, 0.3]]]])
    norm = NormalizeImages().run(ctx, images=image, mean=0.5, std=0.25)[0]
    assert torch.allclose(norm, torch.tensor([[[[-1.2, 0.4, 2.0, 0.3]]]]))  # (v - 0.5) / 0.25, alpha kept
    bright = AdjustBrightness().run(ctx, images=image, factor=1.5)[0]
    assert torch.allclose(bright, torch.tensor([[[[0.3, 0.9, 1.0, 0.3]]]]))  # v * 1.5 clamped
    contrast = AdjustContrast().run(ctx, images=image[..., :3], factor=2.0)[0]
    assert torch.allclose(contrast, torch.tensor([[[[0.0, 0.7, 1.0]]]]))  # (v - .5) * 2 + .5 clamped


def test_image_grid_places_resized_cells_on_black(ctx: Any) -> None:
    red = torch.zeros(1, 8, 8, 3)
    red[..., 0] = 1.0
    white = torch.ones(2, 8, 8, 3)
    grid = ImageGrid().run(
        ctx, images=[red, white], columns=[2], cell_width=[32], cell_height=[40], padding=[3]
    )[0]
    assert grid.shape == (1, 2 * 40 + 3, 2 * 32 + 3, 3)  # 3 images, 2 columns: 2 rows
    assert torch.equal(grid[0, 0, 0], torch.tensor([1.0, 0.0, 0.0]))
    assert torch.all(grid[0, :40, 32:35] == 0)  # the padding stays black
    assert torch.all(grid[0, :40, 35:] == 1) and torch.all(grid[0, 43:, :32] == 1)
    assert torch.all(grid[0, 43:, 35:] == 0)  # the empty cell
    with pytest.raises(DatasetImageError, match="images: cannot make a grid of an empty list"):
        ImageGrid().run(ctx, images=[], columns=[2], cell_width=[32], cell_height=[32], padding=[0])


def test_deduplication_drops_images_whose_hash_matches(ctx: Any) -> None:
    left = torch.zeros(1, 16, 16, 3)
    left[:, :, :8] = 1.0
    top = torch.zeros(1, 16, 16, 3)
    top[:, :8] = 1.0
    near_left = left.clone()
    near_left[0, 0, 15] = 0.1  # a speck does not change the 8x8 hash
    kept = ImageDeduplication().run(ctx, images=[left, top, near_left], similarity_threshold=[0.95])[0]
    assert len(kept) == 2 and kept[0] is left and kept[1] is top
    # left and top halves differ in 32 of 64 bits: similarity 0.5
    assert len(ImageDeduplication().run(ctx, images=[left, top], similarity_threshold=[0.5])[0]) == 1
    assert len(ImageDeduplication().run(ctx, images=[left, top], similarity_threshold=[0.51])[0]) == 2
