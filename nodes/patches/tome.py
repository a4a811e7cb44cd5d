"""Token merging (ToMe for Stable Diffusion) as a MODEL patch: ``TomePatchModel`` (ComfyUI's name,
inputs and behaviour).

Bolya & Hoffman 2023, "Token Merging for Fast Stable Diffusion" (https://arxiv.org/abs/2303.17604).
As in ComfyUI, at the highest-resolution self-attentions only the queries are merged: the tokens
are split into destinations (one per 2x2 cell, chosen at random) and sources; the ``ratio`` share of
sources most similar (cosine) to a destination are averaged into it before the attention, and the
attention output is copied back to every merged token after it (keys and values stay whole). Fewer
queries make the attention cheaper, at a small cost in detail.

The patch acts only through the UNet's attention patch points (``attn1_patch`` /
``attn1_output_patch``, ``nodes.core.sampling_hooks``): the loaded UNet is shared with the unpatched MODEL and
never changed. ComfyUI draws the destinations from torch's global generator; Loom draws them from a
generator seeded per sampling run, so the same workflow gives the same image every time.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from engine.context import NodeContext
from engine.node import Node
from engine.schema import FLOAT, MODEL, Input, NodeSchema, Output
from nodes.core.sampling_hooks import BlockPatch, RunInfo, SamplingHooks
from nodes.patches.unet_hooks import unet_patch

Fn = Callable[[torch.Tensor], torch.Tensor]


def _same(x: torch.Tensor) -> torch.Tensor:
    return x


def bipartite_merge(
    metric: torch.Tensor, w: int, h: int, sx: int, sy: int, r: int, generator: torch.Generator | None
) -> tuple[Fn, Fn]:
    """``(merge, unmerge)`` for tokens [B, N, C] on an ``h`` x ``w`` grid: one destination per
    ``sy`` x ``sx`` cell (random with ``generator``, else the top-left one), and the ``r`` sources
    most similar to a destination averaged into it."""
    b, n, _ = metric.shape
    if r <= 0 or w == 1 or h == 1:
        return _same, _same
    device = metric.device
    with torch.no_grad():
        rows, cols = h // sy, w // sx
        if generator is None:
            pick = torch.zeros(rows, cols, 1, dtype=torch.int64)
        else:
            pick = torch.randint(sy * sx, size=(rows, cols, 1), generator=generator)
        cells = torch.zeros(rows, cols, sy * sx, dtype=torch.int64).scatter_(2, pick, -torch.ones_like(pick))
        grid = cells.view(rows, cols, sy, sx).transpose(1, 2).reshape(rows * sy, cols * sx)
        if rows * sy < h or cols * sx < w:  # the cells do not cover the grid: the rest are sources
            full = torch.zeros(h, w, dtype=torch.int64)
            full[: rows * sy, : cols * sx] = grid
            grid = full
        order = grid.reshape(1, -1, 1).argsort(dim=1).to(device)  # destinations (-1) first, then sources
        n_dst = rows * cols
        src_at, dst_at = order[:, n_dst:, :], order[:, :n_dst, :]

        def split(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            c = x.shape[-1]
            return (
                torch.gather(x, 1, src_at.expand(b, n - n_dst, c)),
                torch.gather(x, 1, dst_at.expand(b, n_dst, c)),
            )

        a, bb = split(metric / metric.norm(dim=-1, keepdim=True))
        r = min(a.shape[1], r)
        best, best_dst = (a @ bb.transpose(-1, -2)).max(dim=-1)
        ranked = best.argsort(dim=-1, descending=True)[..., None]
        kept_idx, merged_idx = ranked[..., r:, :], ranked[..., :r, :]
        into = torch.gather(best_dst[..., None], -2, merged_idx)

    def merge(x: torch.Tensor) -> torch.Tensor:
        src, dst = split(x)
        rows_, t, c = src.shape
        kept = torch.gather(src, -2, kept_idx.expand(rows_, t - r, c))
        moved = torch.gather(src, -2, merged_idx.expand(rows_, r, c))
        return torch.cat(
            [kept, dst.scatter_reduce(-2, into.expand(rows_, r, c), moved, reduce="mean")], dim=1
        )

    def unmerge(x: torch.Tensor) -> torch.Tensor:
        n_kept = kept_idx.shape[1]
        kept, dst = x[..., :n_kept, :], x[..., n_kept:, :]
        c = kept.shape[-1]
        out = torch.zeros(b, n, c, device=x.device, dtype=x.dtype)
        src_positions = src_at.expand(b, src_at.shape[1], 1)
        out.scatter_(-2, dst_at.expand(b, n_dst, c), dst)
        out.scatter_(-2, torch.gather(src_positions, 1, kept_idx).expand(b, n_kept, c), kept)
        out.scatter_(
            -2,
            torch.gather(src_positions, 1, merged_idx).expand(b, r, c),
            torch.gather(dst, -2, into.expand(b, r, c)),
        )
        return out

    return merge, unmerge


def merge_functions(
    x: torch.Tensor, ratio: float, original_shape: list[int], generator: torch.Generator | None
) -> tuple[Fn, Fn]:
    """ComfyUI's choice: merge only at the full latent resolution, 2x2 cells, ``ratio`` of the tokens."""
    _, _, height, width = original_shape
    downsample = int(math.ceil(math.sqrt((height * width) // x.shape[1])))
    if downsample > 1:
        return _same, _same
    w, h = int(math.ceil(width / downsample)), int(math.ceil(height / downsample))
    return bipartite_merge(x, w, h, 2, 2, int(x.shape[1] * ratio), generator)


def tome_hooks(module: Any, ratio: float) -> SamplingHooks:
    generator = torch.Generator()
    unmerge: list[Fn] = [_same]

    def start(info: RunInfo) -> None:
        generator.manual_seed(0)

    def merge_queries(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, extra: dict[str, Any]
    ) -> tuple[Any, Any, Any]:
        merge, unmerge[0] = merge_functions(q, ratio, extra["original_shape"], generator)
        return merge(q), k, v

    def unmerge_output(out: torch.Tensor, extra: dict[str, Any]) -> torch.Tensor:
        return unmerge[0](out)

    return SamplingHooks(
        run_start=(start,),
        block_patches=(
            BlockPatch("attn1_patch", merge_queries),
            BlockPatch("attn1_output_patch", unmerge_output),
        ),
    )


class TomePatchModel(Node):
    SCHEMA = NodeSchema(
        node_id="TomePatchModel",
        display_name="Tome Patch Model",
        category="_for_testing",
        description="Merge similar self-attention queries (ToMe) for speed; trades a little quality.",
        inputs=(
            Input("model", MODEL, "The UNet model to patch."),
            Input(
                "ratio",
                FLOAT,
                "Fraction of query tokens merged (0 = off; 0.3–0.5 typical).",
                default=0.3,
                min=0.0,
                max=1.0,
                step=0.01,
            ),
        ),
        outputs=(Output("MODEL", MODEL, "The model with token merging applied."),),
    )

    def run(self, ctx: NodeContext, *, model: Any, ratio: float) -> tuple[Any]:
        if ratio <= 0:
            return (model,)
        return unet_patch(
            model, "TomePatchModel", ("attn1_patch", "attn1_output_patch"), tome_hooks, round(float(ratio), 4)
        )


NODES: list[type[Node]] = [TomePatchModel]
