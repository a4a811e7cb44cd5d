"""The step-cache runs shared by ``python main.py bench step_cache`` and the step-cache tests
(``tests/nodes/patches/test_step_cache.py``): each cache (EasyCache, LazyCache, FirstBlockCache)
patched onto a Flux transformer, sampled with KSampler, its transformer work counted with forward
hooks; :func:`bench_lines` prints seconds, speed-up and latent difference against no cache."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from nodes.family_nodes.flux_nodes import EmptySD3LatentImage
from nodes.patches.easycache import EasyCache, LazyCache
from nodes.patches.first_block_cache import FirstBlockCache
from nodes.sample.ksampler import KSampler

STEPS = 12
Patcher = Callable[[Any, Any, float], Any]


def easy(ctx: Any, model: Any, threshold: float) -> Any:
    return EasyCache().run(
        ctx, model=model, reuse_threshold=threshold, start_percent=0.15, end_percent=0.95, verbose=False
    )[0]


def lazy(ctx: Any, model: Any, threshold: float) -> Any:
    return LazyCache().run(
        ctx, model=model, reuse_threshold=threshold, start_percent=0.15, end_percent=0.95, verbose=True
    )[0]


def first_block(ctx: Any, model: Any, threshold: float) -> Any:
    return FirstBlockCache().run(
        ctx, model=model, residual_diff_threshold=threshold, start_percent=0.0, end_percent=1.0
    )[0]


CACHES: dict[str, Patcher] = {"EasyCache": easy, "LazyCache": lazy, "FirstBlockCache": first_block}


class Counted:
    """Transformer calls and calls of the last block's attention (not run when blocks are skipped)."""

    def __init__(self, ctx: Any, model: Any) -> None:
        self.calls = self.last_block = 0
        with ctx.models.use(model) as module:
            last = (module.single_transformer_blocks or module.transformer_blocks)[-1]
            self.handles = [
                module.register_forward_hook(lambda *a: self._add("calls")),
                last.attn.register_forward_hook(lambda *a: self._add("last_block")),
            ]

    def _add(self, name: str) -> None:
        setattr(self, name, getattr(self, name) + 1)

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def sample(
    ctx: Any, model: Any, pos: Any, neg: Any, size: int = 128, steps: int = STEPS, cfg: float = 2.0
) -> tuple[torch.Tensor, Counted, float]:
    """KSampler (euler, simple) from an empty latent; the output, the counts and the seconds."""
    latent = EmptySD3LatentImage().run(ctx, width=size, height=size, batch_size=1)[0]
    counted = Counted(ctx, model)
    start = time.perf_counter()
    try:
        out = KSampler().run(
            ctx,
            model=model,
            seed=1,
            steps=steps,
            cfg=cfg,
            sampler_name="euler",
            scheduler="simple",
            positive=pos,
            negative=neg,
            latent_image=latent,
            denoise=1.0,
        )[0]["samples"]
    finally:
        counted.remove()
    return out, counted, time.perf_counter() - start


def bench_lines(ctx: Any, model: Any, pos: Any, neg: Any, size: int, steps: int, header: str) -> str:
    """Seconds, speed-up, model work done and latent difference of each cache against none."""
    sample(ctx, model, pos, neg, size=size, steps=2)  # load and warm up
    plain, _, plain_s = sample(ctx, model, pos, neg, size=size, steps=steps)
    lines = [f"step caches, {header}, {size} px, {steps} steps, cfg 2: no cache {plain_s:.2f} s"]
    for name, threshold in (
        ("EasyCache", 0.2),
        ("LazyCache", 0.2),
        ("FirstBlockCache", 0.1),
        ("FirstBlockCache", 0.5),
    ):
        patched = CACHES[name](ctx, model, threshold)
        sample(ctx, patched, pos, neg, size=size, steps=2)  # a patched model is its own resident copy
        out, counted, seconds = sample(ctx, patched, pos, neg, size=size, steps=steps)
        diff = (out - plain).abs()
        lines.append(
            f"  {name:16s} {threshold:<4}: {seconds:.2f} s ({plain_s / seconds:.2f}x), transformer calls "
            f"{counted.calls}, full block stacks {counted.last_block}/{steps}; latent diff max "
            f"{diff.max().item():.3f}, mean {diff.mean().item():.4f} (latent std {plain.std().item():.3f})"
        )
    return "\n".join(lines)
