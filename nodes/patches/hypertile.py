"""HyperTile (https://github.com/tfernd/HyperTile), with ComfyUI's name, inputs and behaviour: the
self-attention queries of the highest-resolution UNet places (and ``max_depth`` levels below) are
split into tiles of about ``tile_size`` pixels, so each query attends to a same-sized run of keys
instead of all of them; faster at large sizes, at some cost in coherence.

As in ComfyUI, only the queries are tiled: the keys and values are viewed with the tiled batch
size, so tile ``i`` of an image attends to the ``i``-th contiguous run of its tokens. The number of
tiles per side is a divisor of the token grid's side, drawn among the ``swap_size`` largest-tile
choices; ComfyUI draws from torch's global generator, Loom from a generator seeded per sampling
run, so the same workflow gives the same image every time.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from engine.context import NodeContext
from engine.node import Node
from engine.schema import BOOLEAN, INT, MODEL, Input, NodeSchema, Output
from nodes.core.sampling_hooks import BlockPatch, RunInfo, SamplingHooks
from nodes.patches.unet_hooks import unet_patch


def random_divisor(value: int, min_value: int, max_options: int, generator: torch.Generator) -> int:
    """A number of tiles along a side of ``value`` tokens: ``value // d`` for one of the
    ``max_options`` smallest divisors ``d >= min_value`` of ``value``."""
    min_value = min(min_value, value)
    divisors = [i for i in range(min_value, value + 1) if value % i == 0]
    choices = [value // d for d in divisors[:max_options]]
    if len(choices) > 1:
        return choices[int(torch.randint(0, len(choices) - 1, (1,), generator=generator).item())]
    return choices[0]


def tiles(x: torch.Tensor, nh: int, nw: int, h: int, w: int) -> torch.Tensor:
    """[B, (nh h' nw w'), C] -> [(B nh nw), (h' w'), C] with h' = h / nh, w' = w / nw."""
    b, _, c = x.shape
    x = x.reshape(b, nh, h // nh, nw, w // nw, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(b * nh * nw, (h // nh) * (w // nw), c)


def untiles(x: torch.Tensor, nh: int, nw: int, h: int, w: int) -> torch.Tensor:
    """The inverse of :func:`tiles`."""
    c = x.shape[-1]
    x = x.reshape(-1, nh, nw, h // nh, w // nw, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, h * w, c)


def hypertile_hooks(
    module: Any, tile_size: int, swap_size: int, max_depth: int, scale_depth: bool
) -> SamplingHooks:
    latent_tile = max(32, tile_size) // 8
    generator = torch.Generator()
    pending: list[tuple[int, int, int, int]] = []

    def start(info: RunInfo) -> None:
        generator.manual_seed(0)

    def tile_in(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, extra: dict[str, Any]
    ) -> tuple[Any, Any, Any]:
        shape = extra["original_shape"]
        sizes = [(shape[-2] / 2**i) * (shape[-1] / 2**i) for i in range(max_depth + 1)]
        tokens = q.shape[-2]
        if tokens in sizes:
            aspect = shape[-1] / shape[-2]
            h, w = round(math.sqrt(tokens * aspect)), round(math.sqrt(tokens / aspect))
            factor = 2 ** sizes.index(tokens) if scale_depth else 1
            nh = random_divisor(h, latent_tile * factor, swap_size, generator)
            nw = random_divisor(w, latent_tile * factor, swap_size, generator)
            if nh * nw > 1:
                q = tiles(q, nh, nw, h, w)
                pending[:] = [(nh, nw, h, w)]
        return q, k, v

    def tile_out(out: torch.Tensor, extra: dict[str, Any]) -> torch.Tensor:
        if pending:
            out = untiles(out, *pending.pop())
        return out

    return SamplingHooks(
        run_start=(start,),
        block_patches=(BlockPatch("attn1_patch", tile_in), BlockPatch("attn1_output_patch", tile_out)),
    )


class HyperTile(Node):
    SCHEMA = NodeSchema(
        node_id="HyperTile",
        display_name="HyperTile",
        category="model_patches/unet",
        description="Tile the self-attention queries of the high-resolution UNet blocks (faster at large sizes).",
        inputs=(
            Input("model", MODEL, "The UNet model to patch."),
            Input("tile_size", INT, "Tile size in pixels.", default=256, min=1, max=2048),
            Input(
                "swap_size", INT, "How many tile counts to choose among at random.", default=2, min=1, max=128
            ),
            Input(
                "max_depth",
                INT,
                "How many resolution levels below the highest are tiled too.",
                default=0,
                min=0,
                max=10,
            ),
            Input("scale_depth", BOOLEAN, "Larger tiles at deeper levels.", default=False),
        ),
        outputs=(Output("MODEL", MODEL, "The patched model."),),
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        model: Any,
        tile_size: int,
        swap_size: int,
        max_depth: int,
        scale_depth: bool,
    ) -> tuple[Any]:
        return unet_patch(
            model,
            "HyperTile",
            ("attn1_patch", "attn1_output_patch"),
            hypertile_hooks,
            int(tile_size),
            int(swap_size),
            int(max_depth),
            bool(scale_depth),
        )


NODES: list[type[Node]] = [HyperTile]
