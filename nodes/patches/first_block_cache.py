"""First-block cache for transformer (DiT) denoisers: the Loom-only ``FirstBlockCache`` node.

The idea of ParaAttention's "First Block Cache" (https://github.com/chengzeyi/ParaAttention, after
TeaCache, Liu et al. 2024, https://arxiv.org/abs/2411.19108): how much the first transformer
block changes the image tokens is a cheap signal for how much the whole stack will. Every model
call runs the first block; its residual (image out − image in) is compared with the residual of
the last fully computed call of the same conditioning batch, as ``mean|r − r_prev| / mean|r_prev|``.
Under ``residual_diff_threshold`` the other blocks do not run: the image tokens after the last
block are taken as the first block's output plus the remaining blocks' residual remembered from
that last full call. The comparison is always against the last full call, so small changes add up
until a full call is due. Threshold 0 never skips (the result is bit-identical to no cache).

Generic over families: the denoiser kind declares its blocks (``denoiser.block_stack(module)``,
:class:`nodes.core.sampling_hooks.BlockStack`); any DiT family that declares them can use the node. While a
model call runs, each block's ``forward`` is replaced by a wrapper on the instance and restored
afterwards (no state is left on the module). Only between ``start_percent`` and ``end_percent`` of
the sampling; calls outside run in full and forget the cache.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from engine.context import NodeContext
from engine.node import Node
from engine.schema import FLOAT, MODEL, Input, NodeSchema, Output
from nodes.core.sampling_hooks import (
    ApplyFn,
    BlockIO,
    BlockStack,
    ModelCall,
    RunInfo,
    SamplingHooks,
    replaced_forwards,
)

log = logging.getLogger(__name__)


class FirstBlockCacheError(ValueError):
    """The model has no transformer blocks to cache (a UNet)."""


@dataclass
class _Entry:
    """One conditioning batch's memory: the first block's residual and the other blocks' residual
    of the last full call."""

    first: torch.Tensor
    rest: torch.Tensor | None = None


@dataclass
class _Call:
    """What the block wrappers of one model call share (``entry``: the last full call's memory,
    replaced by this call's when it runs in full)."""

    entry: _Entry | None
    skip: bool = False
    first_out: torch.Tensor | None = None
    tokens: int = 0


@dataclass
class FirstBlockCacheRun:
    """The cache of one sampling run (see the module docstring)."""

    stack: BlockStack
    threshold: float
    start_percent: float
    end_percent: float
    start_sigma: float = 1e9
    end_sigma: float = -1.0
    entries: dict[Any, _Entry] = field(default_factory=dict)
    full_calls: int = 0
    cached_calls: int = 0

    def start(self, info: RunInfo) -> None:
        if info.percent_to_sigma is not None:
            self.start_sigma = info.percent_to_sigma(self.start_percent)
            self.end_sigma = info.percent_to_sigma(self.end_percent)
        self.entries.clear()
        log.info(
            "FirstBlockCache enabled - threshold: %s, sigmas %.4g..%.4g, %d blocks",
            self.threshold,
            self.start_sigma,
            self.end_sigma,
            len(self.stack.blocks),
        )

    def model_call(self, apply: ApplyFn, call: ModelCall) -> torch.Tensor:
        key = (call.chunks, tuple(call.x_in.shape))  # one memory per conditioning batch
        sigma = None if call.sigma is None else float(call.sigma[0])
        if sigma is None or sigma > self.start_sigma or sigma < self.end_sigma or len(self.stack.blocks) < 2:
            self.entries.pop(key, None)
            self.full_calls += 1
            return apply(call)
        state = _Call(self.entries.get(key))
        with self._wrapped(state):
            out = apply(call)
        if state.skip:
            self.cached_calls += 1
        else:
            self.full_calls += 1
            if state.entry is not None:
                self.entries[key] = state.entry
        return out

    def _decide(self, prev: _Entry | None, residual: torch.Tensor) -> bool:
        if prev is None or prev.rest is None or prev.first.shape != residual.shape:
            return False
        scale = float(prev.first.abs().mean())
        return scale > 0 and float((residual - prev.first).abs().mean()) / scale < self.threshold

    @contextmanager
    def _wrapped(self, state: _Call) -> Iterator[None]:
        """The blocks' forwards replaced for one call: the first decides, the middle ones pass
        through when skipping, the last adds the remembered residual (or remembers it)."""
        blocks = self.stack.blocks
        (first, first_io), (last, last_io) = blocks[0], blocks[-1]
        first_forward, last_forward = first.forward, last.forward

        def run_first(*args: Any, **kwargs: Any) -> Any:
            out = first_forward(*args, **kwargs)
            image = first_io.image_out(out, 0)
            residual = image - first_io.image_in(args, kwargs)
            state.first_out, state.tokens = image, image.shape[1]
            state.skip = self._decide(state.entry, residual)
            if not state.skip:
                state.entry = _Entry(residual.detach())
            return out

        def middle(original: Any, io: BlockIO) -> Any:
            def forward(*args: Any, **kwargs: Any) -> Any:
                return io.passthrough(args, kwargs) if state.skip else original(*args, **kwargs)

            return forward

        def run_last(*args: Any, **kwargs: Any) -> Any:
            assert state.first_out is not None and state.entry is not None
            if state.skip:
                assert state.entry.rest is not None
                return last_io.with_image(
                    last_io.passthrough(args, kwargs), state.first_out + state.entry.rest
                )
            out = last_forward(*args, **kwargs)
            state.entry.rest = (last_io.image_out(out, state.tokens) - state.first_out).detach()
            return out

        replaced = [
            (first, run_first),
            *((b, middle(b.forward, io)) for b, io in blocks[1:-1]),
            (last, run_last),
        ]
        with replaced_forwards(replaced):
            yield


@dataclass(frozen=True)
class FirstBlockCachePatch:
    """A weight-neutral MODEL patch: a fresh :class:`FirstBlockCacheRun` per sampling run, over
    the blocks the denoiser kind declares."""

    denoiser: Any
    threshold: float
    start_percent: float
    end_percent: float
    changes_module: ClassVar[bool] = (
        False  # forwards are replaced only during a call: the loaded module is reused
    )

    @property
    def key(self) -> str:
        return f"first_block_cache:{self.threshold}:{self.start_percent}:{self.end_percent}"

    def apply(self, module: Any, handle: Any) -> None:
        """Weights stay as they are."""

    def sampling_hooks(self, module: Any) -> SamplingHooks:
        run = FirstBlockCacheRun(
            self.denoiser.block_stack(module), self.threshold, self.start_percent, self.end_percent
        )
        return SamplingHooks(run_start=(run.start,), model_wrappers=(run.model_call,))


class FirstBlockCache(Node):
    SCHEMA = NodeSchema(
        node_id="FirstBlockCache",
        display_name="First Block Cache (transformers)",
        category="model_patches",
        description="Skip all but the first transformer block on steps where the first block's change is close to "
        "that of the last full step (transformer/DiT models); trades some quality for speed.",
        inputs=(
            Input("model", MODEL, "A transformer (DiT) model."),
            Input(
                "residual_diff_threshold",
                FLOAT,
                "Relative change of the first block's residual under which the "
                "other blocks are skipped (0 = never skip; 0.05-0.15 typical).",
                default=0.1,
                min=0.0,
                max=1.0,
                step=0.001,
            ),
            Input(
                "start_percent",
                FLOAT,
                "The relative sampling step to begin caching.",
                default=0.0,
                min=0.0,
                max=1.0,
                step=0.01,
            ),
            Input(
                "end_percent",
                FLOAT,
                "The relative sampling step to end caching.",
                default=1.0,
                min=0.0,
                max=1.0,
                step=0.01,
            ),
        ),
        outputs=(Output("MODEL", MODEL, "The model with the first-block cache."),),
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        model: Any,
        residual_diff_threshold: float,
        start_percent: float,
        end_percent: float,
    ) -> tuple[Any]:
        if not hasattr(model.denoiser, "block_stack"):
            raise FirstBlockCacheError(
                f"FirstBlockCache needs a transformer (DiT) model; this {model.family.title} model's denoiser has no "
                "transformer blocks. Use DeepCache for UNet models, or remove the node"
            )
        patch = FirstBlockCachePatch(model.denoiser, residual_diff_threshold, start_percent, end_percent)
        return (model.with_patch(patch),)


NODES: list[type[Node]] = [FirstBlockCache]
