"""Step caching by predicted change: ComfyUI's ``EasyCache`` and ``LazyCache`` nodes
(``comfy_extras/nodes_easycache.py``, read for behaviour; written anew). Off unless in a workflow.

EasyCache (Zhou et al. 2025, "Less is Enough: Training-Free Video Diffusion Acceleration via
Runtime-Adaptive Caching", https://arxiv.org/abs/2507.02860) watches how much the model's input
changes from one call to the next (mean absolute difference, every 8th latent pixel of the first
conditioning's rows) and learns, on the steps it computes, the ratio ``k`` of output change to
input change. Between computed steps it accumulates the predicted relative output change
``k · Δinput / mean|output|``; while that sum stays under ``reuse_threshold`` the model is not
called and its output is taken as ``x + (output - x)`` of the last computed call, per conditioning
entry (ComfyUI's ``uuids``). The first conditioning of a step decides for every call of that step.
Only between ``start_percent`` and ``end_percent`` of the sampling (as sigmas, through the model's
``percent_to_sigma``).

LazyCache is the same rule one level up, on the whole guided prediction of a step (every
branch and CFG, ComfyUI's ``PREDICT_NOISE`` wrapper): a skipped step returns ``x + (denoised -
x)`` of the last computed step.

Both are weight-neutral patches (``nodes.patches.guidance.GuidancePatch``) acting through sampling
hooks (``nodes.core.sampling_hooks``): EasyCache a model wrapper (per model call) and a predict wrapper (a new
step), LazyCache a predict wrapper. State lives in the hooks of one sampling run. Unlike ComfyUI, a skipped call does not add the cached difference into the model
input in place.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from engine.context import NodeContext
from engine.node import Node
from engine.schema import BOOLEAN, FLOAT, MODEL, Input, NodeSchema, Output
from nodes.core.sampling_hooks import ApplyFn, ModelCall, PredictFn, RunInfo, SamplingHooks
from nodes.patches.guidance import GuidancePatch

log = logging.getLogger(__name__)
SUBSAMPLE = 8  # every 8th latent pixel in both directions, as ComfyUI


@dataclass
class ChangeTracker:
    """The shared rule: relative transformation rate, accumulated predicted change, and the
    subsampled previous input/output (see the module docstring)."""

    name: str
    threshold: float
    start_percent: float
    end_percent: float
    verbose: bool
    start_sigma: float = 1e9  # until run_start says otherwise: every sigma is inside
    end_sigma: float = -1.0
    rate: float | None = None
    cumulative: float = 0.0
    x_prev: torch.Tensor | None = None
    out_prev: torch.Tensor | None = None
    out_norm: float | None = None
    metadata: tuple[Any, ...] | None = None
    skipped: int = 0

    def start(self, info: RunInfo) -> None:
        if info.percent_to_sigma is not None:
            self.start_sigma = info.percent_to_sigma(self.start_percent)
            self.end_sigma = info.percent_to_sigma(self.end_percent)
        log.info(
            "%s enabled - threshold: %s, start_percent: %s, end_percent: %s",
            self.name,
            self.threshold,
            self.start_percent,
            self.end_percent,
        )

    def past_end(self, sigma: torch.Tensor | None) -> bool:
        return sigma is None or not float(sigma[0]) > self.end_sigma

    def active(self, sigma: torch.Tensor) -> bool:
        return float(sigma[0]) <= self.start_sigma

    def check(self, metadata: tuple[Any, ...]) -> None:
        """Forget everything when the tensors' shape, dtype or device change."""
        if self.metadata is not None and metadata != self.metadata:
            log.warning("%s - tensor shape, dtype or device changed, resetting state", self.name)
            self.rate, self.cumulative, self.x_prev, self.out_prev, self.out_norm = (
                None,
                0.0,
                None,
                None,
                None,
            )
        self.metadata = metadata

    def input_change(self, x_sub: torch.Tensor) -> float | None:
        return None if self.x_prev is None else float((x_sub - self.x_prev).abs().mean())

    def may_skip(self, input_change: float | None, cached: bool) -> bool:
        """Add the predicted change; True (skip) while the sum stays under the threshold and a
        cached difference exists (``cached``), else start a new sum."""
        if input_change is None or self.out_norm is None or self.rate is None:
            return False
        self.cumulative += self.rate * input_change / self.out_norm
        if self.cumulative < self.threshold and cached:
            if self.verbose:
                log.info(
                    "%s - skipping step; cumulative change %.4f < %s",
                    self.name,
                    self.cumulative,
                    self.threshold,
                )
            return True
        if self.verbose:
            log.info("%s - computing step; cumulative change %.4f", self.name, self.cumulative)
        self.cumulative = 0.0
        return False

    def computed(
        self, x_sub: torch.Tensor, out_sub: torch.Tensor, out: torch.Tensor, input_change: float | None
    ) -> None:
        """Learn the rate from a computed call and remember its subsampled input and output."""
        if self.out_prev is not None and input_change is not None and input_change > 0:
            self.rate = float((out_sub - self.out_prev).abs().mean()) / input_change
        self.x_prev, self.out_prev, self.out_norm = x_sub.clone(), out_sub.clone(), float(out.abs().mean())


def _subsample(t: torch.Tensor) -> torch.Tensor:
    return t[..., ::SUBSAMPLE, ::SUBSAMPLE]


@dataclass
class EasyCacheRun:
    """One sampling run of EasyCache: the tracker plus each conditioning entry's last difference."""

    tracker: ChangeTracker
    channels: int
    first: int | None = None
    skip_step: bool = False
    diffs: dict[int, torch.Tensor] = field(default_factory=dict)

    def rows(self, t: torch.Tensor, chunks: Sequence[int]) -> torch.Tensor:
        """The first conditioning's rows of ``t``, subsampled."""
        per = t.shape[0] // len(chunks)
        i = chunks.index(self.first)  # type: ignore[arg-type]
        return _subsample(t[i * per : (i + 1) * per])

    def cached(self, x: torch.Tensor, chunks: Sequence[int]) -> torch.Tensor:
        if self.first in chunks:
            self.tracker.skipped += 1
        per = x.shape[0] // len(chunks)
        return torch.cat([x[i * per : (i + 1) * per] + self.diffs[c].to(x) for i, c in enumerate(chunks)])

    def model_call(self, apply: ApplyFn, call: ModelCall) -> torch.Tensor:
        t = self.tracker
        chunks = call.chunks or (0,)
        if t.past_end(call.sigma):
            return apply(call)
        assert call.sigma is not None
        x = call.x_in[:, : self.channels]
        has_first, change = self.first in chunks, None
        if t.active(call.sigma):
            t.check((x.device, x.dtype, tuple(x.shape[1:])))
            complete = all(c in self.diffs for c in chunks)
            if self.skip_step and complete:
                return self.cached(x, chunks)
            if self.first is None:
                self.first, has_first = chunks[0], True
            if has_first:
                change = t.input_change(self.rows(x, chunks))
                if t.may_skip(change, complete):
                    self.skip_step = True
                    return self.cached(x, chunks)
        out = apply(call)
        y = out[:, : self.channels]
        per = x.shape[0] // len(chunks)
        for i, c in enumerate(chunks):
            self.diffs[c] = (y[i * per : (i + 1) * per] - x[i * per : (i + 1) * per]).detach()
        if has_first:
            t.computed(self.rows(x, chunks), self.rows(y, chunks), y, change)
        return out

    def predict(self, predict: PredictFn, x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        self.skip_step = False  # a new step: its first conditioning decides again
        return predict(x, sigma)


def easycache_hooks(
    threshold: float, start: float, end: float, verbose: bool, channels: int
) -> SamplingHooks:
    run = EasyCacheRun(ChangeTracker("EasyCache", threshold, start, end, verbose), channels)
    return SamplingHooks(
        run_start=(run.tracker.start,), predict_wrappers=(run.predict,), model_wrappers=(run.model_call,)
    )


def lazycache_hooks(
    threshold: float, start: float, end: float, verbose: bool, channels: int
) -> SamplingHooks:
    tracker = ChangeTracker("LazyCache", threshold, start, end, verbose)
    state: dict[str, torch.Tensor] = {}

    def predict(inner: PredictFn, x_full: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        if tracker.past_end(sigma):
            return inner(x_full, sigma)
        x = x_full[:, :channels]
        change = None
        if tracker.active(sigma):
            tracker.check((x.device, x.dtype, tuple(x.shape)))
            change = tracker.input_change(_subsample(x))
            if tracker.may_skip(change, "diff" in state):
                tracker.skipped += 1
                return x + state["diff"].to(x)
        out = inner(x_full, sigma)
        state["diff"] = (out - x).detach()
        tracker.computed(_subsample(x), _subsample(out), out, change)
        return out

    return SamplingHooks(run_start=(tracker.start,), predict_wrappers=(predict,))


def _inputs(name: str) -> tuple[Input, ...]:
    return (
        Input("model", MODEL, f"The model to add {name} to."),
        Input(
            "reuse_threshold",
            FLOAT,
            "The threshold for reusing cached steps.",
            default=0.2,
            min=0.0,
            max=3.0,
            step=0.01,
        ),
        Input(
            "start_percent",
            FLOAT,
            f"The relative sampling step to begin use of {name}.",
            default=0.15,
            min=0.0,
            max=1.0,
            step=0.01,
        ),
        Input(
            "end_percent",
            FLOAT,
            f"The relative sampling step to end use of {name}.",
            default=0.95,
            min=0.0,
            max=1.0,
            step=0.01,
        ),
        Input("verbose", BOOLEAN, "Whether to log verbose information.", default=False),
    )


class EasyCache(Node):
    SCHEMA = NodeSchema(
        node_id="EasyCache",
        display_name="EasyCache",
        category="advanced/debug",
        description="Native EasyCache implementation.",
        inputs=_inputs("EasyCache"),
        outputs=(Output("MODEL", MODEL, "The model with EasyCache."),),
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        model: Any,
        reuse_threshold: float,
        start_percent: float,
        end_percent: float,
        verbose: bool,
    ) -> tuple[Any]:
        params = (reuse_threshold, start_percent, end_percent, verbose, model.latent_format.channels)
        return (model.with_patch(GuidancePatch("easycache", params, easycache_hooks)),)


class LazyCache(Node):
    SCHEMA = NodeSchema(
        node_id="LazyCache",
        display_name="LazyCache",
        category="advanced/debug",
        description="A homebrew version of EasyCache - even 'easier' version of EasyCache to implement. Overall "
        "works worse than EasyCache, but better in some rare cases AND universal compatibility with "
        "everything in ComfyUI.",
        inputs=_inputs("LazyCache"),
        outputs=(Output("MODEL", MODEL, "The model with LazyCache."),),
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        model: Any,
        reuse_threshold: float,
        start_percent: float,
        end_percent: float,
        verbose: bool,
    ) -> tuple[Any]:
        params = (reuse_threshold, start_percent, end_percent, verbose, model.latent_format.channels)
        return (model.with_patch(GuidancePatch("lazycache", params, lazycache_hooks)),)


NODES: list[type[Node]] = [EasyCache, LazyCache]
