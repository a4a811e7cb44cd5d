"""Guiders: the model function a sampler calls, ``(x, sigma) -> guided denoised``, in sigma space.

A GUIDER value (:class:`Guider`) is immutable: a MODEL handle, named conditioning branches and the
rule that combines their predictions (ComfyUI's ``CFGGuider`` family). At sampling time
:class:`GuidedRun` binds it to the resident module: it prepares the conditioning
(``nodes.sample.cond_batch``), wraps the denoiser's forward in the model's sampling hooks
(``nodes.core.sampling_hooks``), and evaluates branches as ComfyUI's ``sampling_function`` does:

- a model call takes ``calculate_input(sigma, x)`` and ``timestep(sigma)`` and its raw output
  becomes ``calculate_denoised`` (the ModelSampling of the handle);
- CFG combines **denoised** predictions, ``uncond + (cond - uncond) * cfg``; with cfg 1 the
  negative is not evaluated unless a patch sets ``disable_cfg1_optimization``;
- ``pre_cfg`` hooks see all branch outputs, a ``cfg_function`` hook replaces the formula (given
  ``x - denoised`` as ComfyUI), ``post_cfg`` hooks see the result.

Stacked jobs (one batch of several coalesced requests) share one GuidedRun: each job's rows use
its own conditioning, the combine rule is the same for all.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import torch

from nodes.control.controlnet import controls_to_uncond
from nodes.core.cond import CondEntry, EntryWeightHooks, HookRun
from nodes.core.sampling_hooks import (
    BlockPatch,
    BlockSkip,
    ModelCall,
    Row,
    block_options,
    blocks_skipped,
    declared_skip_lists,
)
from nodes.sample import cond_batch as cb

# Branch names whose rows are the "uncond" side for hooks (ComfyUI's prompt_type negative).
_UNCOND = frozenset({"negative", "middle", "empty_negative_prompt", "extra"})


@dataclass(frozen=True)
class Guider:
    """ComfyUI's ``CFGGuider``: ``positive`` and ``negative`` combined with ``cfg``.

    ``branches`` holds each named conditioning as a tuple of entries. Subclasses change only
    :meth:`predict` and their parameters; equal guiders (but the prompts) can share a batch."""

    model: Any
    branches: tuple[tuple[str, tuple[CondEntry, ...]], ...]
    cfg: float = 1.0

    def entries(self, name: str) -> tuple[CondEntry, ...]:
        return dict(self.branches).get(name, ())

    def combine_key(self) -> tuple[Any, ...]:
        """What must be equal for two guiders' jobs to share one batch."""
        return (type(self), tuple(n for n, _ in self.branches), self.cfg)

    def batched_names(self) -> tuple[str, ...]:
        """The branches one step evaluates together (the cfg-1 optimisation applied, as ``predict``
        applies it unless a patch or the sampler disables it)."""
        return ("positive",) if math.isclose(self.cfg, 1.0) else ("positive", "negative")

    def batch_rows(self) -> int:
        """Model-call rows per latent row in one step, at most: the entries of the evaluated
        branches (CFG's cond and uncond: 2). The activation estimate of block streaming uses it."""
        return max(1, sum(len(self.entries(name)) for name in self.batched_names()))

    def predict(self, run: GuidedRun, x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        cfg = run.hooks.scale(self.cfg, sigma)
        skip_negative = math.isclose(cfg, 1.0) and not run.disable_cfg1_optimization
        names = ["positive", None if skip_negative else "negative"]
        out = run.pre_cfg(names, run.calc(names, x, sigma), cfg, x, sigma)
        return run.cfg_function(out[0], out[1], cfg, x, sigma, names[0], names[1])


@dataclass(frozen=True)
class BasicGuider(Guider):
    """ComfyUI's ``Guider_Basic``: the positive prediction alone (cfg 1, no negative)."""


@dataclass(frozen=True)
class DualCFGGuider(Guider):
    """ComfyUI's ``Guider_DualCFG``: ``cond1`` (positive) over ``cond2`` (middle) with ``cfg``
    (cfg_conds), ``cond2`` over ``negative`` with ``cfg2``; ``nested`` is the "nested" style."""

    cfg2: float = 1.0
    nested: bool = False

    def combine_key(self) -> tuple[Any, ...]:
        return (*super().combine_key(), self.cfg2, self.nested)

    def batched_names(self) -> tuple[str, ...]:
        if self.nested or not math.isclose(self.cfg2, 1.0):
            return ("negative", "middle", "positive")
        return ("positive",) if math.isclose(self.cfg, 1.0) else ("middle", "positive")

    def predict(self, run: GuidedRun, x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        names: list[str | None] = ["negative", "middle", "positive"]
        if self.nested:
            out = run.calc(names, x, sigma)
            text = run.cfg_function(out[2], out[1], self.cfg, x, sigma, "positive", "middle")
            return out[0] + self.cfg2 * (text - out[0])
        if not run.disable_cfg1_optimization and math.isclose(self.cfg2, 1.0):
            names[0] = None
            if math.isclose(self.cfg, 1.0):
                names[1] = None
        out = run.calc(names, x, sigma)
        return (
            run.cfg_function(out[1], out[0], self.cfg2, x, sigma, names[1], names[0])
            + (out[2] - out[1]) * self.cfg
        )


def perp_neg(
    pos: torch.Tensor, neg: torch.Tensor, empty: torch.Tensor, neg_scale: float, cfg: float
) -> torch.Tensor:
    """Perp-Neg (Armandpour et al. 2023): CFG against the part of the negative direction that is
    perpendicular to the positive one, both relative to the empty prompt."""
    p, n = pos - empty, neg - empty
    perp = n - ((n * p).sum() / torch.linalg.vector_norm(p) ** 2) * p
    return empty + cfg * (p - perp * neg_scale)


@dataclass(frozen=True)
class PerpNegGuider(Guider):
    """ComfyUI's ``Guider_PerpNeg``: positive, negative and an empty prompt in one batch."""

    neg_scale: float = 1.0

    def combine_key(self) -> tuple[Any, ...]:
        return (*super().combine_key(), self.neg_scale)

    def batched_names(self) -> tuple[str, ...]:
        return ("positive", "negative", "empty_negative_prompt")

    def predict(self, run: GuidedRun, x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        names: list[str | None] = ["positive", "negative", "empty_negative_prompt"]
        cfg = run.hooks.scale(self.cfg, sigma)
        out = run.pre_cfg(names, run.calc(names, x, sigma), cfg, x, sigma)
        result = perp_neg(out[0], out[1], out[2], self.neg_scale, cfg)
        extra = {"empty_cond": run.cond_args("empty_negative_prompt"), "empty_cond_denoised": out[2]}
        return run.post_cfg(result, out[0], out[1], cfg, x, sigma, "positive", "negative", extra)


class GuidedRun:
    """A guider bound to the resident module for one sampling run (see the module docstring).

    Samplers call it as ``run(x, sigma, **extra_args)`` with one sigma per batch row;
    ``extra_args["model_options"]`` may add post-CFG functions and ``disable_cfg1_optimization``
    (the CFG++ samplers do, as in ComfyUI)."""

    def __init__(
        self,
        guiders: Sequence[Guider],
        module: Any,
        rows: int,
        latent_size: tuple[int, int],
        forward: Any = None,
        model_inputs: Mapping[str, Any] | None = None,
        resident: Mapping[str, Any] | None = None,
    ) -> None:
        self.guider = guiders[0]
        self.model = self.guider.model
        self.model_sampling = self.model.model_sampling
        self.denoiser = self.model.denoiser
        self.module = module
        # resident: the modules the patches need beside the model (model patches' networks), by handle key
        self.hooks = (
            self.model.sampling_hooks(module, resident) if resident else self.model.sampling_hooks(module)
        )
        self.size = latent_size
        self.pixels = (latent_size[0] * 8, latent_size[1] * 8)  # SDXL's size ids (the UNet families' factor)
        self._forward = forward if forward is not None else module
        self._apply = self.hooks.apply_model(self._raw_forward)
        self._predict = self.hooks.predict(self._guided)
        self._transformer_options = self.hooks.transformer_options()
        self._kwargs: dict[tuple[Any, ...], dict[str, Any]] = {}
        self._hook_runs: dict[int, tuple[EntryWeightHooks, HookRun]] = {}
        self._names: list[str | None] = []  # the branches of the current calc, by index
        self.model_options: dict[str, Any] = {}  # the sampler's, for the current call
        self.dtype = next(module.parameters()).dtype
        # what ComfyUI hands every cond's extra_conds (the sampled latent, its noise mask): defaults
        # under each entry's own extras, read by the denoisers that need them (inpainting UNets)
        # ``seeds`` (one per job) become each entry's ``seed`` (unCLIP's noise augmentation reads it)
        self.model_inputs = dict(model_inputs or {})
        self._seeds = tuple(self.model_inputs.pop("seeds", ()))
        self._with_inputs_cache: dict[tuple[int, int], tuple[CondEntry, CondEntry]] = {}
        self.jobs = []
        for j, g in enumerate(guiders):
            prepared = {
                name: cb.prepare(
                    self._with_inputs(entries, j), latent_size, self.model_sampling.percent_to_sigma
                )
                for name, entries in controls_to_uncond(g.branches)
            }
            cb.add_same_area_counterparts(prepared)
            self.jobs.append(cb.RequestConds(slice(j * rows, (j + 1) * rows), prepared))

    # -- what samplers call ----------------------------------------------------------------
    def __call__(self, x: torch.Tensor, sigma: torch.Tensor, **extra_args: Any) -> torch.Tensor:
        self.model_options = dict(extra_args.get("model_options") or {})
        sigma = torch.as_tensor(sigma, dtype=torch.float32).reshape(-1).to(x.device)
        if sigma.numel() == 1:
            sigma = sigma.expand(x.shape[0])
        return self._predict(x, sigma)

    def _guided(self, x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        return self.guider.predict(self, x, sigma)

    # -- building blocks for guiders and hooks ---------------------------------------------
    @property
    def disable_cfg1_optimization(self) -> bool:
        return self.hooks.disable_cfg1_optimization or bool(
            self.model_options.get("disable_cfg1_optimization")
        )

    def calc(self, names: Sequence[str | None], x: torch.Tensor, sigma: torch.Tensor) -> list[torch.Tensor]:
        """Denoised prediction per named branch (zeros for ``None``), as ComfyUI's calc_cond_batch;
        a ``calc_cond_batch`` hook replaces it (ComfyUI's ``sampler_calc_cond_batch_function``)."""
        if self.hooks.calc_cond_batch is not None:
            return self.hooks.calc_cond_batch(
                {
                    "conds": list(names),
                    "input": x,
                    "sigma": sigma,
                    "model": self,
                    "model_options": self.model_options,
                }
            )
        return self.calc_batch(names, x, sigma)

    def calc_batch(
        self,
        names: Sequence[str | None],
        x: torch.Tensor,
        sigma: torch.Tensor,
        *,
        block_skip: BlockSkip | None = None,
    ) -> list[torch.Tensor]:
        """:meth:`calc` without the hook; ``block_skip``: transformer blocks these calls skip."""
        self._names = list(names)
        call = self._call if block_skip is None else partial(self._call, block_skip=block_skip)
        return cb.calc_cond_batch(call, self.jobs, names, x, sigma)

    def calc_entries(
        self,
        entries: Sequence[CondEntry],
        x: torch.Tensor,
        sigma: torch.Tensor,
        patches: Sequence[BlockPatch] = (),
    ) -> torch.Tensor:
        """Denoised prediction of extra conditioning for every job (PerpNeg's empty prompt; PAG's
        and SAG's extra calls), with ``patches`` added to the block patches for these calls only
        (ComfyUI's ``calc_cond_batch`` with changed ``model_options``)."""
        prepared = cb.prepare(self._with_inputs(entries), self.size, self.model_sampling.percent_to_sigma)
        jobs = [cb.RequestConds(job.rows, {"extra": prepared}) for job in self.jobs]
        self._names = ["extra"]
        saved = self._transformer_options
        self._transformer_options = block_options(patches, saved) if patches else saved
        try:
            return cb.calc_cond_batch(self._call, jobs, ["extra"], x, sigma)[0]
        finally:
            self._transformer_options = saved

    def cond_args(self, name: str | None) -> list[Any] | None:
        """The entries of a branch as hook arguments (``None`` for a skipped branch)."""
        return None if name is None else list(self.guider.entries(name))

    def pre_cfg(
        self,
        names: Sequence[str | None],
        out: list[torch.Tensor],
        scale: float,
        x: torch.Tensor,
        sigma: torch.Tensor,
    ) -> list[torch.Tensor]:
        for fn in self.hooks.pre_cfg:
            out = fn(
                {
                    "conds": [self.cond_args(n) for n in names],
                    "conds_out": out,
                    "cond_scale": scale,
                    "timestep": sigma,
                    "input": x,
                    "sigma": sigma,
                    "model": self,
                    "model_options": self.model_options,
                }
            )
        return out

    def cfg_function(
        self,
        cond: torch.Tensor,
        uncond: torch.Tensor,
        scale: float,
        x: torch.Tensor,
        sigma: torch.Tensor,
        cond_name: str | None,
        uncond_name: str | None,
    ) -> torch.Tensor:
        """ComfyUI's ``cfg_function``: the guidance formula (or the patch's), then post-CFG hooks."""
        if self.hooks.cfg_function is not None:
            result = x - self.hooks.cfg_function(
                {
                    "cond": x - cond,
                    "uncond": x - uncond,
                    "cond_scale": scale,
                    "timestep": sigma,
                    "input": x,
                    "sigma": sigma,
                    "cond_denoised": cond,
                    "uncond_denoised": uncond,
                    "model": self,
                    "model_options": self.model_options,
                }
            )
        else:
            result = uncond + (cond - uncond) * scale
        return self.post_cfg(result, cond, uncond, scale, x, sigma, cond_name, uncond_name, {})

    def post_cfg(
        self,
        result: torch.Tensor,
        cond: torch.Tensor,
        uncond: torch.Tensor,
        scale: float,
        x: torch.Tensor,
        sigma: torch.Tensor,
        cond_name: str | None,
        uncond_name: str | None,
        extra: Mapping[str, Any],
    ) -> torch.Tensor:
        for fn in (*self.hooks.post_cfg, *self.model_options.get("sampler_post_cfg_function", ())):
            result = fn(
                {
                    "denoised": result,
                    "cond": self.cond_args(cond_name),
                    "uncond": self.cond_args(uncond_name),
                    "cond_scale": scale,
                    "model": self,
                    "uncond_denoised": uncond,
                    "cond_denoised": cond,
                    "sigma": sigma,
                    "model_options": self.model_options,
                    "input": x,
                    "branches": (cond_name, uncond_name),
                    **extra,
                }
            )
        return result

    def _with_inputs(self, entries: Sequence[CondEntry], job: int = 0) -> list[CondEntry]:
        """``entries`` with the model inputs (and job ``job``'s seed) under their extras; one copy per
        entry and job for the run (the forward's kwargs are cached by entry identity, so a copy must
        live as long as the run)."""
        inputs = dict(self.model_inputs)
        if self._seeds:
            inputs["seed"] = self._seeds[min(job, len(self._seeds) - 1)]
        if not inputs:
            return list(entries)
        out = []
        for e in entries:
            kept = self._with_inputs_cache.get((id(e), job))
            if kept is None or kept[0] is not e:
                kept = (e, replace(e, extras={**inputs, **e.extras}))
                self._with_inputs_cache[(id(e), job)] = kept
            out.append(kept[1])
        return out

    # -- the model call --------------------------------------------------------------------
    def _call(
        self,
        xs: torch.Tensor,
        sigma: torch.Tensor,
        conds: Sequence[cb.Cond],
        rows: int,
        branches: Sequence[int],
        block_skip: BlockSkip | None = None,
    ) -> torch.Tensor:
        """One batched model call: the denoised prediction for the concatenated crops ``xs``."""
        ms = self.model_sampling
        x_in = ms.calculate_input(sigma, xs).to(self.dtype)
        timestep = ms.timestep(sigma).float()
        key = cb.model_kwargs_key(conds, rows, self.size)
        if key not in self._kwargs:
            self._kwargs[key] = self.denoiser.conditioning(
                [c.entry for c in conds], rows, self.pixels, like=x_in
            )
        kwargs = dict(self._kwargs[key])
        uncond = [self._names[b] in _UNCOND for b in branches]
        if self._transformer_options or block_skip is not None:
            # ComfyUI's per-call entries: 0 = cond, 1 = uncond per chunk; the blocks this call skips
            skip = {} if block_skip is None else {"block_skip": block_skip}
            kwargs["transformer_options"] = {
                **self._transformer_options,
                "sigmas": sigma,
                "cond_or_uncond": [int(u) for u in uncond],
                **skip,
            }
        kinds: tuple[Row, ...] = tuple("uncond" if u else "cond" for u in uncond for _ in range(rows))
        # one identity per entry, stable for the run (ComfyUI's uuids): its branch, prompt and area
        chunks = tuple(
            hash((self._names[b], id(c.entry), c.area)) for c, b in zip(conds, branches, strict=True)
        )
        call = ModelCall(x_in, timestep, sigma, kwargs, kinds, chunks)
        hooks = conds[0].entry.extras.get("hooks")  # one call's entries share their hooks (cond_batch)
        if hooks is None:
            out = self._apply(call).float()
        else:
            with self._hook_run(hooks).applied(self.module, float(sigma[0])):
                out = self._apply(call).float()
        return ms.calculate_denoised(sigma, out, xs)

    def _hook_run(self, hooks: EntryWeightHooks) -> HookRun:
        """The weight hooks of entries bound to this run (one binding per hooks value)."""
        run = self._hook_runs.get(id(hooks))
        if run is None or run[0] is not hooks:
            run = (hooks, hooks.start(self.model, self.model_sampling.percent_to_sigma))
            self._hook_runs[id(hooks)] = run
        return run[1]

    def _raw_forward(self, call: ModelCall) -> torch.Tensor:
        kwargs = dict(call.cond_kwargs)
        if (
            kwargs.get("control") is not None
        ):  # ControlNets act within their sigma range (nodes.control.controlnet)
            kwargs["control"] = kwargs["control"].at(call.sigma)
        skip = (kwargs.get("transformer_options") or {}).get("block_skip")
        with blocks_skipped(self._forward, declared_skip_lists(self.denoiser), skip):  # skip-layer guidance
            return self.denoiser.forward(self._forward, call.x_in, call.timestep, kwargs)
