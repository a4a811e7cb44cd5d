"""Tiling an image into a list and merging the list back: SplitImageToTileList and
ImageMergeTileList (ComfyUI's names, inputs and semantics; ``comfy_extras/nodes_images.py``).

Both walk the same grid (:func:`tile_grid`): tiles step by the tile size less the overlap (but at
least a quarter tile), and the last tile of a row or column is pulled back to end at the image's
edge. The merge blends overlapping tiles with a sine window (1e-5 at the tile's border, 1 at its
centre), or plain averaging when the overlap is 0.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from engine.context import NodeContext
from engine.node import Node
from engine.schema import IMAGE, INT, Input, NodeSchema, Output
from nodes.image.load_save import MAX_RESOLUTION

Box = tuple[int, int, int, int]  # x_start, y_start, x_end, y_end


class TileError(ValueError):
    """A tile list or size the tile nodes cannot use; the message names the input."""


def tile_grid(width: int, height: int, tile_width: int, tile_height: int, overlap: int) -> list[Box]:
    """The tiles covering a width x height image, row by row (ComfyUI's get_grid_coords)."""
    stride_x = round(max(tile_width * 0.25, tile_width - overlap))
    stride_y = round(max(tile_height * 0.25, tile_height - overlap))
    boxes: list[Box] = []
    y = 0
    while y < height:
        y_end = min(y + tile_height, height)
        y_start = max(0, y_end - tile_height)
        x = 0
        while x < width:
            x_end = min(x + tile_width, width)
            boxes.append((max(0, x_end - tile_width), y_start, x_end, y_end))
            if x_end >= width:
                break
            x += stride_x
        if y_end >= height:
            break
        y += stride_y
    return boxes


class SplitImageToTileList(Node):
    SCHEMA = NodeSchema(
        node_id="SplitImageToTileList",
        display_name="Split Image into List of Tiles",
        category="image/batch",
        description="Splits an image into a batched list of tiles with a specified overlap.",
        inputs=(
            Input("image", IMAGE, "The images to split (the whole batch goes into each tile)."),
            Input("tile_width", INT, "Width of a tile.", default=1024, min=64, max=MAX_RESOLUTION),
            Input("tile_height", INT, "Height of a tile.", default=1024, min=64, max=MAX_RESOLUTION),
            Input("overlap", INT, "Pixels shared by neighbouring tiles.", default=128, min=0, max=4096),
        ),
        outputs=(Output("IMAGE", IMAGE, "The tiles, row by row (a list).", is_list=True),),
    )

    def run(
        self, ctx: NodeContext, *, image: torch.Tensor, tile_width: int, tile_height: int, overlap: int
    ) -> tuple[list[torch.Tensor]]:
        boxes = tile_grid(image.shape[2], image.shape[1], tile_width, tile_height, overlap)
        return ([image[:, y0:y1, x0:x1, :] for x0, y0, x1, y1 in boxes],)


def _first(value: Any) -> Any:
    return value[0] if isinstance(value, list | tuple) and value else value


def blend_window(tile_height: int, tile_width: int, overlap: int, like: torch.Tensor) -> torch.Tensor:
    """[1, h, w, 1] weights of one tile: a sine window (at least 1e-5) with overlap, else ones."""
    if overlap <= 0:
        return torch.ones((1, tile_height, tile_width, 1), device=like.device, dtype=like.dtype)

    def ramp(n: int) -> torch.Tensor:
        line = torch.linspace(0, 1, n, device=like.device, dtype=like.dtype)
        return torch.sin(math.pi * line).clamp(min=1e-5)

    return (ramp(tile_height)[:, None] * ramp(tile_width)[None, :])[None, :, :, None]


class ImageMergeTileList(Node):
    SCHEMA = NodeSchema(
        node_id="ImageMergeTileList",
        display_name="Merge List of Tiles to Image",
        category="image/batch",
        description="Merge a list of tiles (from Split Image into List of Tiles) back into one image.",
        inputs=(
            Input("image_list", IMAGE, "The tiles, row by row."),
            Input("final_width", INT, "Width of the merged image.", default=1024, min=64, max=32768),
            Input("final_height", INT, "Height of the merged image.", default=1024, min=64, max=32768),
            Input("overlap", INT, "The overlap the tiles were split with.", default=128, min=0, max=4096),
        ),
        outputs=(Output("IMAGE", IMAGE, "The merged image."),),
        input_is_list=True,
    )

    def run(
        self, ctx: NodeContext, *, image_list: Any, final_width: Any, final_height: Any, overlap: Any
    ) -> tuple[torch.Tensor]:
        tiles = list(image_list) if isinstance(image_list, list | tuple) else [image_list]
        width, height, ovlp = int(_first(final_width)), int(_first(final_height)), int(_first(overlap))
        if not tiles or not all(isinstance(t, torch.Tensor) and t.ndim == 4 for t in tiles):
            raise TileError("image_list: expected a list of IMAGE tiles [B, H, W, C]; connect a tile list")
        first = tiles[0]
        batch, tile_h, tile_w, channels = first.shape
        for i, tile in enumerate(tiles):
            if tile.shape[0] != batch or tile.shape[3] != channels:
                raise TileError(
                    f"image_list: tile {i} has batch {tile.shape[0]} and {tile.shape[3]} channels, the first "
                    f"tile {batch} and {channels}; every tile must come from the same split"
                )
        canvas = torch.zeros((batch, height, width, channels), device=first.device, dtype=first.dtype)
        weights = torch.zeros((batch, height, width, 1), device=first.device, dtype=first.dtype)
        window = blend_window(tile_h, tile_w, ovlp, first)
        for tile, (x0, y0, x1, y1) in zip(
            tiles, tile_grid(width, height, tile_w, tile_h, ovlp), strict=False
        ):
            h, w = min(y1 - y0, tile.shape[1]), min(x1 - x0, tile.shape[2])
            part = window[:, :h, :w, :]
            canvas[:, y0 : y0 + h, x0 : x0 + w] += tile[:, :h, :w].to(canvas) * part
            weights[:, y0 : y0 + h, x0 : x0 + w] += part
        weights[weights == 0] = 1.0
        return (canvas / weights,)


NODES: list[type[Node]] = [SplitImageToTileList, ImageMergeTileList]
