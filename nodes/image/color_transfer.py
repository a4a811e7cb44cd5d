"""ColorTransfer (ComfyUI's "Transfer Color", ``comfy_extras/nodes_post_processing.py``): match the
colours of images to reference images.

Methods: ``reinhard_lab`` (each Lab channel shifted and scaled to the reference's mean and standard
deviation), ``mkl_lab`` (the Monge-Kantorovich linear map between the Lab covariances) and
``histogram`` (each RGB channel through the lookup table that maps its 256-bin CDF onto the
reference's). ``source_stats`` (a DynamicCombo; its ``target_index`` travels as
``"source_stats.target_index"``): ``per_frame`` matches each frame to the reference frame of the
same index (the last one when there are fewer, pooled when there is one), ``uniform`` pools every
frame's statistics into one transform, ``target_frame`` takes one chosen frame's. Lab is kornia's
(the same conversion ComfyUI calls). ``strength`` blends from the input (0) past the match (> 1).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from engine.context import NodeContext
from engine.node import Node
from engine.schema import COMBO, FLOAT, IMAGE, INT, Input, NodeSchema, Output

METHODS = ("reinhard_lab", "mkl_lab", "histogram")
SOURCE_STATS = ("per_frame", "uniform", "target_frame")
EPS = 1e-6
BINS = 256
Stats = tuple[torch.Tensor, torch.Tensor]  # mean [C, 1], std [C, 1] or covariance [C, C]


class ColorTransferError(ValueError):
    """Images or choices the node cannot use; the message names the input."""


def to_lab(frame: torch.Tensor) -> torch.Tensor:
    """One [H, W, 3] frame as Lab [3, H * W]."""
    from kornia.color import rgb_to_lab  # lazy: kornia is slow to import; only this node needs Lab

    return rgb_to_lab(frame.float().permute(2, 0, 1)[None]).view(3, -1)


def from_lab(lab: torch.Tensor, height: int, width: int) -> torch.Tensor:
    from kornia.color import lab_to_rgb  # lazy: kornia is slow to import; only this node needs Lab

    return lab_to_rgb(lab.view(1, 3, height, width))[0].permute(1, 2, 0)


def frame_stats(flat: torch.Tensor, reinhard: bool) -> Stats:
    mean = flat.mean(dim=-1, keepdim=True)
    if reinhard:
        return mean, flat.std(dim=-1, keepdim=True, unbiased=False).clamp_min(EPS)
    centred = flat - mean
    return mean, centred @ centred.T / flat.shape[1]


def pooled_stats(frames: torch.Tensor, reinhard: bool) -> Stats:
    """Mean of the frames' means, then the mean of their spreads about it (ComfyUI's two passes)."""
    labs = [to_lab(f) for f in frames]
    mean = torch.stack([lab.mean(dim=-1, keepdim=True) for lab in labs]).mean(dim=0)
    if reinhard:
        var = torch.stack([((lab - mean) ** 2).mean(dim=-1, keepdim=True) for lab in labs]).mean(dim=0)
        return mean, var.sqrt().clamp_min(EPS)
    return mean, torch.stack([(lab - mean) @ (lab - mean).T / lab.shape[1] for lab in labs]).mean(dim=0)


def mkl_matrix(cov_source: torch.Tensor, cov_ref: torch.Tensor) -> torch.Tensor:
    """The linear map T with T cov_source T^T = cov_ref (Pitié's Monge-Kantorovich solution)."""
    values, vectors = torch.linalg.eigh(cov_source)
    root = values.clamp_min(0).sqrt().clamp_min(EPS)
    scaled = vectors * root[None]
    mid_values, mid_vectors = torch.linalg.eigh(scaled.T @ cov_ref @ scaled)
    half = (mid_vectors * mid_values.clamp_min(0).sqrt()[None]) @ mid_vectors.T
    inverse = vectors * (1.0 / root)[None]
    return inverse @ half @ inverse.T


def affine(source: Stats, ref: Stats, reinhard: bool) -> Callable[[torch.Tensor], torch.Tensor]:
    """Lab [3, N] -> Lab [3, N] taking ``source`` statistics to ``ref``."""
    if reinhard:
        scale = ref[1] / source[1]
        return lambda flat: (flat - source[0]) * scale + ref[0]
    t = mkl_matrix(source[1], ref[1])
    return lambda flat: t @ (flat - source[0]) + ref[0]


def cdf(frames: torch.Tensor) -> torch.Tensor:
    """[C, 256] cumulative share of every frame's pixels per channel bin."""
    flat = frames.float().permute(3, 0, 1, 2).reshape(frames.shape[3], -1)
    bins = (flat * (BINS - 1)).long().clamp(0, BINS - 1)
    hist = torch.zeros(flat.shape[0], BINS).scatter_add_(1, bins, torch.ones_like(flat))
    total = hist.cumsum(1)
    return total / total[:, -1:]


def lookup(source_cdf: torch.Tensor, ref_cdf: torch.Tensor) -> torch.Tensor:
    return torch.searchsorted(ref_cdf.contiguous(), source_cdf.contiguous()).clamp_max(BINS - 1).float() / (
        BINS - 1
    )


def match_histograms(target: torch.Tensor, ref: torch.Tensor, mode: str, index: int) -> list[torch.Tensor]:
    shared = None
    if mode == "uniform":
        shared = lookup(cdf(target), cdf(ref))
    elif mode == "target_frame":
        shared = lookup(cdf(target[index : index + 1]), cdf(ref))
    out = []
    for i, frame in enumerate(target):
        lut = (
            shared
            if shared is not None
            else lookup(cdf(frame[None]), cdf(ref[min(i, ref.shape[0] - 1)][None]))
        )
        flat = frame.float().permute(2, 0, 1).reshape(frame.shape[2], -1)
        matched = lut.gather(1, (flat * 255).long().clamp(0, 255))
        out.append(matched.view(frame.shape[2], frame.shape[0], frame.shape[1]).permute(1, 2, 0))
    return out


def match_lab(
    target: torch.Tensor, ref: torch.Tensor, mode: str, index: int, reinhard: bool
) -> list[torch.Tensor]:
    shared = None
    pooled_ref = pooled_stats(ref, reinhard) if ref.shape[0] == 1 or mode != "per_frame" else None
    if mode == "uniform":
        shared = affine(pooled_stats(target, reinhard), pooled_ref, reinhard)  # type: ignore[arg-type]
    elif mode == "target_frame":
        shared = affine(frame_stats(to_lab(target[index]), reinhard), pooled_ref, reinhard)  # type: ignore[arg-type]
    out = []
    for i, frame in enumerate(target):
        flat = to_lab(frame)
        if shared is not None:
            moved = shared(flat)
        else:
            ref_stats = pooled_ref or frame_stats(to_lab(ref[min(i, ref.shape[0] - 1)]), reinhard)
            moved = affine(frame_stats(flat, reinhard), ref_stats, reinhard)(flat)
        out.append((flat, moved))
    return [torch.stack(pair) for pair in out]


class ColorTransfer(Node):
    SCHEMA = NodeSchema(
        node_id="ColorTransfer",
        display_name="Transfer Color",
        category="image/postprocessing",
        description="Match the colors of one image to another using various algorithms.",
        inputs=(
            Input("image_target", IMAGE, "Image(s) to apply the color transform to."),
            Input(
                "image_ref",
                IMAGE,
                "Reference image(s) to match colors to. If not provided, processing is skipped",
                optional=True,
            ),
            Input("method", COMBO, "The color transfer algorithm.", options=METHODS, default=METHODS[0]),
            Input(
                "source_stats",
                COMBO,
                "per_frame: each frame matched to image_ref individually. uniform: pool stats across all source "
                "frames as baseline, match to image_ref. target_frame: use one chosen frame as the baseline for "
                "the transform to image_ref, applied uniformly to all frames (preserves relative differences)",
                options=SOURCE_STATS,
                default=SOURCE_STATS[0],
            ),
            Input(
                "source_stats.target_index",
                INT,
                "Frame index used as the source baseline for computing the transform to image_ref",
                default=0,
                min=0,
                max=10000,
                optional=True,
                extra={"revealed_by": {"input": "source_stats", "choices": ["target_frame"]}},
            ),
            Input(
                "strength",
                FLOAT,
                "How far to move toward the match (0: unchanged).",
                default=1.0,
                min=0.0,
                max=10.0,
                step=0.01,
            ),
        ),
        outputs=(Output("image", IMAGE, "The recoloured images."),),
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        image_target: torch.Tensor,
        method: str,
        source_stats: str,
        strength: float,
        image_ref: torch.Tensor | None = None,
        **option: Any,
    ) -> tuple[torch.Tensor]:
        if strength == 0 or image_ref is None:
            return (image_target,)
        if method not in METHODS:
            raise ColorTransferError(f"method: unknown {method!r}; expected one of {', '.join(METHODS)}")
        if source_stats not in SOURCE_STATS:
            raise ColorTransferError(
                f"source_stats: unknown {source_stats!r}; expected one of {', '.join(SOURCE_STATS)}"
            )
        for name, image in (("image_target", image_target), ("image_ref", image_ref)):
            if image.ndim != 4 or image.shape[-1] != 3:
                raise ColorTransferError(
                    f"{name}: expected an RGB IMAGE [B, H, W, 3], found {tuple(image.shape)}"
                )
        index = min(int(option.get("source_stats.target_index") or 0), image_target.shape[0] - 1)
        h, w = image_target.shape[1], image_target.shape[2]
        frames = []
        if method == "histogram":
            for frame, matched in zip(
                image_target, match_histograms(image_target, image_ref, source_stats, index), strict=True
            ):
                result = matched if strength == 1.0 else torch.lerp(frame.float(), matched, strength)
                frames.append(result.clamp(0, 1))
        else:
            for pair in match_lab(image_target, image_ref, source_stats, index, method == "reinhard_lab"):
                lab = pair[1] if strength == 1.0 else torch.lerp(pair[0], pair[1], strength)
                frames.append(from_lab(lab, h, w).clamp(0, 1))
        return (torch.stack(frames).to(image_target.dtype),)


NODES: list[type[Node]] = [ColorTransfer]
