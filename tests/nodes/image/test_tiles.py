"""Splitting an image into tiles and merging them back (nodes/image/tiles.py), on ComfyUI's grid."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from nodes.image.tiles import ImageMergeTileList, SplitImageToTileList, TileError, blend_window, tile_grid
from tests.nodes.image.image_ctx import image_ctx


@pytest.fixture()
def ctx(tmp_path: Path) -> Any:
    return image_ctx(tmp_path)


def test_schemas_follow_comfyui() -> None:
    split = SplitImageToTileList.SCHEMA
    assert [(i.name, i.default, i.min, i.max) for i in split.inputs] == [
        ("image", None, None, None),
        ("tile_width", 1024, 64, 16384),
        ("tile_height", 1024, 64, 16384),
        ("overlap", 128, 0, 4096),
    ]
    assert split.outputs[0].is_list and not split.input_is_list
    merge = ImageMergeTileList.SCHEMA
    assert [(i.name, i.default, i.min, i.max) for i in merge.inputs] == [
        ("image_list", None, None, None),
        ("final_width", 1024, 64, 32768),
        ("final_height", 1024, 64, 32768),
        ("overlap", 128, 0, 4096),
    ]
    assert merge.input_is_list and not merge.outputs[0].is_list


def test_grid_steps_by_tile_less_overlap_and_ends_at_the_edge() -> None:
    # stride 100 - 30 = 70: x starts 0, 70, then the last tile pulled back to end at 200
    assert tile_grid(200, 100, 100, 100, 30) == [(0, 0, 100, 100), (70, 0, 170, 100), (100, 0, 200, 100)]
    # an overlap past 3/4 of the tile still steps a quarter tile (round(max(25, 10)) = 25)
    assert [b[0] for b in tile_grid(150, 100, 100, 100, 90)] == [0, 25, 50]
    # a tile larger than the image: one tile, the image itself
    assert tile_grid(50, 40, 100, 100, 0) == [(0, 0, 50, 40)]


def test_split_then_merge_gives_the_image_back(ctx: Any) -> None:
    torch.manual_seed(0)
    image = torch.rand(2, 100, 150, 3)
    tiles = SplitImageToTileList().run(ctx, image=image, tile_width=64, tile_height=64, overlap=16)[0]
    assert len(tiles) == len(tile_grid(150, 100, 64, 64, 16)) and all(
        t.shape == (2, 64, 64, 3) for t in tiles
    )
    assert torch.equal(tiles[1], image[:, :64, 48:112])
    merged = ImageMergeTileList().run(
        ctx, image_list=tiles, final_width=[150], final_height=[100], overlap=[16]
    )[0]
    assert merged.shape == image.shape and torch.allclose(merged, image, atol=1e-5)
    flat = SplitImageToTileList().run(ctx, image=image, tile_width=64, tile_height=64, overlap=0)[0]
    back = ImageMergeTileList().run(ctx, image_list=flat, final_width=[150], final_height=[100], overlap=[0])[
        0
    ]
    assert torch.allclose(back, image)


def test_overlaps_blend_with_the_sine_window(ctx: Any) -> None:
    window = blend_window(5, 3, 8, torch.zeros(1))
    rows = torch.sin(math.pi * torch.linspace(0, 1, 5)).clamp(min=1e-5)
    cols = torch.sin(math.pi * torch.linspace(0, 1, 3)).clamp(min=1e-5)
    assert torch.allclose(window[0, :, :, 0], rows[:, None] * cols[None, :])
    # two constant tiles 0 and 1 over a 96-wide image, tiles 64 wide, overlap 32: columns 32..63 shared
    zero, one = torch.zeros(1, 64, 64, 3), torch.ones(1, 64, 64, 3)
    merged = ImageMergeTileList().run(
        ctx, image_list=[zero, one], final_width=[96], final_height=[64], overlap=[32]
    )[0]
    w = blend_window(64, 64, 32, zero)[0, 10, :, 0]
    expected = w[:32] / (w[32:] + w[:32])  # column 32 + k: tile 1's weight at k over the sum
    assert torch.allclose(merged[0, 10, 32:64, 0], expected, atol=1e-6)
    assert torch.all(merged[0, :, :32] == 0) and torch.all(merged[0, :, 64:] == 1)


def test_merge_of_mismatched_tiles_teaches(ctx: Any) -> None:
    with pytest.raises(TileError, match="image_list: expected a list of IMAGE tiles"):
        ImageMergeTileList().run(ctx, image_list=[], final_width=[64], final_height=[64], overlap=[0])
    tiles = [torch.zeros(1, 64, 64, 3), torch.zeros(2, 64, 64, 3)]
    with pytest.raises(
        TileError, match="image_list: tile 1 has batch 2 and 3 channels, the first tile 1 and 3"
    ):
        ImageMergeTileList().run(ctx, image_list=tiles, final_width=[128], final_height=[64], overlap=[0])
