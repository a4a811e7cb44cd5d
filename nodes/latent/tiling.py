"""Tiled VAE work: overlapping tiles of a latent or an image, each run through a function, blended.

:func:`tiled` is the 2-D tiler of VAEDecodeTiled / VAEEncodeTiled on images (linear ramps over the
overlaps). :func:`tiled_video` is ComfyUI's ``tiled_scale_multidim`` on video latents
[B, C, T, h, w]: tiles in time and space, each decoded on its own (a causal video VAE starts each
time tile afresh), placed where its first latent frame lands in the output (``positions``: frame
``t`` at ``4 * t``, pixel ``y`` at ``8 * y``), feathered over the overlaps and averaged.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import torch


def _ramp(n: int, overlap: int, at_start: bool, at_end: bool) -> torch.Tensor:
    w = torch.ones(n)
    if overlap > 0:
        r = torch.linspace(0, 1, overlap + 2)[1:-1]
        if not at_start:
            w[:overlap] = r
        if not at_end:
            w[n - overlap :] = torch.minimum(w[n - overlap :], r.flip(0))
    return w


def tiled(
    x: torch.Tensor, fn: Callable[[torch.Tensor], torch.Tensor], tile: int, overlap: int, ratio: float
) -> torch.Tensor:
    """Apply ``fn`` (changes the spatial size by ``ratio``) to overlapping tiles of ``x`` [B, C, H, W]
    and blend the results with linear ramps over the overlaps."""
    _, _, h, w = x.shape
    overlap = min(overlap, tile // 2)
    stride = max(tile - overlap, 1)
    out: torch.Tensor | None = None
    weight: torch.Tensor | None = None
    ys = list(range(0, max(h - overlap, 1), stride))
    xs = list(range(0, max(w - overlap, 1), stride))
    for y in ys:
        for x0 in xs:
            y1, x1 = min(y + tile, h), min(x0 + tile, w)
            part = fn(x[:, :, y:y1, x0:x1])  # (B, C', (y1-y)*ratio, (x1-x0)*ratio)
            oy, ox, ov = int(y * ratio), int(x0 * ratio), int(overlap * ratio)
            ph, pw = part.shape[-2:]
            if out is None:
                out = torch.zeros(part.shape[0], part.shape[1], int(h * ratio), int(w * ratio))
                weight = torch.zeros(1, 1, int(h * ratio), int(w * ratio))
            mask = _ramp(ph, ov, y == 0, y1 >= h)[:, None] * _ramp(pw, ov, x0 == 0, x1 >= w)[None, :]
            out[:, :, oy : oy + ph, ox : ox + pw] += part.float().cpu() * mask
            assert weight is not None
            weight[:, :, oy : oy + ph, ox : ox + pw] += mask
    assert out is not None and weight is not None
    return out / weight.clamp_min(1e-8)


Scale = Callable[[int], int]


def tiled_video(
    samples: torch.Tensor,
    fn: Callable[[torch.Tensor], torch.Tensor],
    tile: Sequence[int],
    overlap: Sequence[int],
    sizes: Sequence[Scale],
    positions: Sequence[Scale],
    check: Callable[[], None] = lambda: None,
) -> torch.Tensor:
    """``fn`` over tiles of ``samples`` [B, C, *axes] (one ``tile`` / ``overlap`` per axis; ``sizes``
    map an axis' length in, the output's length out; ``positions`` map where a tile starts) and the
    results blended: each tile's edges fade over ``sizes(overlap)`` output cells, and every output cell
    is the weighted mean of the tiles covering it. ``check`` runs before each tile (interrupts)."""
    axes = samples.shape[2:]
    rows: list[torch.Tensor] = []
    for b in range(samples.shape[0]):
        one = samples[b : b + 1]
        if all(n <= t for n, t in zip(axes, tile, strict=True)):
            check()
            rows.append(fn(one).float().cpu())
            continue
        out: torch.Tensor | None = None
        weight: torch.Tensor | None = None
        starts = [
            range(0, n - o, t - o) if n > t else range(1) for n, t, o in zip(axes, tile, overlap, strict=True)
        ]
        for corner in itertools.product(*starts):
            part, at = one, []
            for d, start in enumerate(corner):
                pos = max(0, min(axes[d] - overlap[d], start))
                part = part.narrow(d + 2, pos, min(tile[d], axes[d] - pos))
                at.append(positions[d](pos))
            check()
            decoded = fn(part).float().cpu()
            if out is None or weight is None:
                shape = (1, decoded.shape[1], *(size(n) for size, n in zip(sizes, axes, strict=True)))
                out, weight = torch.zeros(shape), torch.zeros((1, 1, *shape[2:]))
            mask = torch.ones((1, 1, *decoded.shape[2:]))
            for d in range(len(axes)):
                feather = sizes[d](overlap[d])
                if 0 < feather < mask.shape[d + 2]:
                    for i in range(feather):
                        mask.narrow(d + 2, i, 1).mul_((i + 1) / feather)
                        mask.narrow(d + 2, mask.shape[d + 2] - 1 - i, 1).mul_((i + 1) / feather)
            o, w = out, weight
            for d in range(len(axes)):
                o = o.narrow(d + 2, at[d], mask.shape[d + 2])
                w = w.narrow(d + 2, at[d], mask.shape[d + 2])
            o.add_(decoded * mask)
            w.add_(mask)
        assert out is not None and weight is not None
        rows.append(out / weight.clamp_min(1e-8))
    return torch.cat(rows)
