"""``KSamplerBatched`` / ``KSamplerAdvancedBatched``: KSampler (Advanced) over lists of seeds and
prompts in one batched UNet call per step.

The ``batching.variant`` of KSampler and KSamplerAdvanced. Request coalescing
(``engine/coalesce.py``) runs queued jobs that differ only in seeds and prompt text as one merged
workflow in which this node receives one seed and one prompt pair per job; it stacks the jobs
along the batch axis (rows ``[j*B, (j+1)*B)`` are job ``j``; CFG branches as
``[negatives; positives]``) and returns one LATENT per job, each equal to what the single node
gives for that job alone up to float noise (same per-seed noise, same per-row scheduler
arithmetic). Inputs a single batched call cannot express (areas, several entries per side,
differing settings, an empty step window) fall back to one call per job.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch

from engine.context import NodeContext
from engine.node import Node
from engine.schema import LATENT, NodeSchema, Output
from nodes import samplers as smp
from nodes.conditioning import CondEntry
from nodes.denoise import Inpaint, Window, cfg_combine, run_loop, start_latent
from nodes.device import compiled_forward, tf32_scope
from nodes.hooks import ModelCall, RunInfo
from nodes.latent import check_latent_for, tag_latent
from nodes.sampling import (
    KSampler,
    KSamplerAdvanced,
    Settings,
    _latent_mask,
    _Reporter,
    sample,
)


class _RowsGuidance:
    """Model function for stacked jobs: one UNet call on ``[neg rows; pos rows]`` per step."""

    def __init__(self, unet: Any, model: Any, pos: Sequence[CondEntry], neg: Sequence[CondEntry],
                 rows: int, s: Settings, forward: Any = None) -> None:
        self.s, self.rows, self.denoiser = s, rows, model.denoiser  # rows: B per job
        module = forward if forward is not None else unet  # the compiled UNet under --compile
        self.apply = model.sampling_hooks(unet).apply_model(
            lambda call: self.denoiser.forward(module, call.x_in, call.timestep, dict(call.cond_kwargs)))
        self.param = next(unet.parameters())
        self.entries = [*neg, *pos] if s.cfg != 1.0 else list(pos)
        branch = ["uncond"] * len(neg) + ["cond"] * len(pos) if s.cfg != 1.0 else ["cond"] * len(pos)
        self.row_kinds: tuple[Any, ...] = tuple(b for b in branch for _ in range(rows))
        self._inputs: dict[tuple[int, int], dict[str, Any]] = {}

    def __call__(self, x_in: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        h, w = x_in.shape[-2:]
        xs = torch.cat([x_in, x_in]) if self.s.cfg != 1.0 else x_in  # (branches*k*B, C, h, w)
        if (h, w) not in self._inputs:
            self._inputs[(h, w)] = self.denoiser.conditioning(self.entries, self.rows, (h * 8, w * 8), like=self.param)
        out = self.apply(ModelCall(xs, t, None, self._inputs[(h, w)], self.row_kinds))
        if self.s.cfg == 1.0:
            return out
        neg, pos = out.chunk(2)
        return cfg_combine(neg, pos, self.s.cfg, self.s.guidance_rescale)


def _simple(cond: Sequence[CondEntry]) -> bool:
    return len(cond) == 1 and cond[0].area is None and not cond[0].extras


def can_stack(settings: Sequence[Settings], pos: Sequence[Any], neg: Sequence[Any]) -> bool:
    """Whether one stacked call reproduces every job: same settings but the seed, plain prompts."""
    first = replace(settings[0], seed=0)
    return all(replace(s, seed=0) == first for s in settings) and all(_simple(c) for c in [*pos, *neg])


@torch.no_grad()
def sample_stacked(ctx: NodeContext, model: Any, positives: Sequence[Sequence[CondEntry]],
                   negatives: Sequence[Sequence[CondEntry]], latent: dict, settings: Sequence[Settings]) -> list[dict]:
    """Sample ``len(settings)`` jobs sharing model, latent and settings (but the seed) together."""
    family, k = model.family, len(settings)
    s = settings[0]
    check_latent_for(latent, family, "latent_image")
    samples = model.latent_format.process_in(latent["samples"].float())  # (B, C, h, w)
    batch_index = latent.get("batch_index") or list(range(samples.shape[0]))
    b = samples.shape[0]
    scheduler = smp.make_scheduler(s.sampler_name, s.scheduler, model.scheduler_config())
    smp.set_schedule(scheduler, s.window.total, s.scheduler, family.sampling.ays_sigmas)
    noise = torch.cat([smp.make_noise(j.seed, samples.shape, batch_index) for j in settings])  # (k*B, C, h, w)
    gens = ([g for j in settings for g in smp.step_generators(j.seed, batch_index)]
            if smp.is_ancestral(s.sampler_name) else None)
    stacked = samples.repeat(k, 1, 1, 1)
    with ctx.models.use(model) as unet:
        model.sampling_hooks(unet).start_run(RunInfo(None, stacked.shape[0], s.window.total))
        if not can_stack(settings, positives, negatives):
            raise ValueError("these jobs cannot be stacked; call sample() per job")
        param = next(unet.parameters())
        x = start_latent(scheduler, stacked, noise, s.window, s.add_noise).to(param)
        inpaint = None
        if "noise_mask" in latent:
            mask = _latent_mask(latent["noise_mask"], samples.shape).to(param).repeat(k, 1, 1, 1)
            inpaint = Inpaint(stacked.to(param), noise.to(param), mask)
        guidance = _RowsGuidance(unet, model, [p[0] for p in positives], [n[0] for n in negatives], b, s,
                                 compiled_forward(unet, ctx.settings))
        with tf32_scope(ctx.settings, param.device):
            x = run_loop(scheduler, x, s.window, guidance, generators=gens, inpaint=inpaint,
                         on_step=_Reporter(ctx, model))
    results = []
    for part in model.latent_format.process_out(x.float().cpu()).chunk(k):
        out = {key: v for key, v in latent.items() if key != "samples"}
        out["samples"] = part
        results.append(tag_latent(out, family))
    return results


def _broadcast(inputs: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """ComfyUI's list mapping: one call per index, shorter lists repeating their last item."""
    k = max((len(v) for v in inputs.values()), default=1)
    return [{name: v[min(i, len(v) - 1)] for name, v in inputs.items() if v} for i in range(k)]


def _run_calls(ctx: NodeContext, calls: list[dict[str, Any]], settings: list[Settings]) -> list[dict]:
    """One stacked sampling for all calls when they can share it, else one ``sample`` per call."""
    first = calls[0]
    same = all(c["model"] is first["model"] and c["latent_image"] is first["latent_image"] for c in calls)
    if len(calls) > 1 and same and can_stack(settings, [c["positive"] for c in calls], [c["negative"] for c in calls]):
            return sample_stacked(ctx, first["model"], [c["positive"] for c in calls],
                                  [c["negative"] for c in calls], first["latent_image"], settings)
    return [sample(ctx, c["model"], c["positive"], c["negative"], c["latent_image"], s)
            for c, s in zip(calls, settings, strict=True)]


class KSamplerBatched(Node):
    SCHEMA = NodeSchema(
        node_id="KSamplerBatched",
        display_name="KSampler (batched lists)",
        category="sampling",
        description="KSampler over lists of seeds/prompts: one batched UNet call per step, one latent per item.",
        inputs=KSampler.SCHEMA.inputs,
        outputs=(Output("LATENT", LATENT, "One denoised latent per list item.", is_list=True),),
        input_is_list=True,
    )

    def run(self, ctx: NodeContext, **inputs: Any) -> tuple[list[dict]]:
        calls = _broadcast(inputs)
        settings = [Settings(c["seed"], c["steps"], c["cfg"], c["sampler_name"], c["scheduler"],
                             Window.from_denoise(c["steps"], c["denoise"]), True, c.get("guidance_rescale", 0.0))
                    for c in calls]
        return (_run_calls(ctx, calls, settings),)


class KSamplerAdvancedBatched(Node):
    SCHEMA = NodeSchema(
        node_id="KSamplerAdvancedBatched",
        display_name="KSampler (Advanced, batched lists)",
        category="sampling",
        description="KSampler (Advanced) over lists of noise seeds/prompts: one batched UNet call per step, "
                    "one latent per item.",
        inputs=KSamplerAdvanced.SCHEMA.inputs,
        outputs=(Output("LATENT", LATENT, "One (partly) denoised latent per list item.", is_list=True),),
        input_is_list=True,
    )

    def run(self, ctx: NodeContext, **inputs: Any) -> tuple[list[dict]]:
        calls = _broadcast(inputs)
        if any(c["start_at_step"] >= min(c["end_at_step"], c["steps"]) for c in calls):
            single = KSamplerAdvanced()  # an empty window returns the latent as it is
            return ([single.run(ctx, **c)[0] for c in calls],)
        settings = [Settings(c["noise_seed"], c["steps"], c["cfg"], c["sampler_name"], c["scheduler"],
                             Window(c["steps"], c["start_at_step"], min(c["end_at_step"], c["steps"]),
                                    c["return_with_leftover_noise"] != "enable"),
                             c["add_noise"] == "enable", c.get("guidance_rescale", 0.0))
                    for c in calls]
        return (_run_calls(ctx, calls, settings),)
