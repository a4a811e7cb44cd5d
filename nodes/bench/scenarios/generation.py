"""txt2img end to end and per step, Loom vs diffusers' StableDiffusionPipeline on the same modules;
cache scenarios (identical resubmit, seed-only, prompt-only); checkpoint swap A→B→A."""

from __future__ import annotations

import time
from functools import partial
from typing import Any

from nodes.bench.report import Row, median, timed
from nodes.bench.runtime import BenchRuntime, txt2img
from nodes.bench.setup import BenchSetup

CFG = 7.0


class StepClock:
    """Times between consecutive sampler steps (progress events / pipeline callbacks)."""

    def __init__(self) -> None:
        self.stamps: list[float] = []

    def tick(self) -> None:
        self.stamps.append(time.perf_counter())

    def pipeline_callback(self, pipe: Any, step: int, timestep: Any, callback_kwargs: dict) -> dict:
        self.tick()
        return callback_kwargs

    def per_step(self) -> float:
        gaps = [b - a for a, b in zip(self.stamps, self.stamps[1:], strict=False)]
        return median(gaps)


def diffusers_pipeline(rt: BenchRuntime, ckpt: str) -> Any:
    """StableDiffusionPipeline over the very modules Loom's memory manager holds."""
    from diffusers import StableDiffusionPipeline

    from nodes.families import SD15
    from nodes.models import open_checkpoint
    from nodes.samplers import make_scheduler

    handles = open_checkpoint(rt.files.resolve("checkpoints", ckpt))
    with rt.models.use(handles.clip) as clip:
        text_encoder, tokenizer = clip["clip_l"], clip.tokenizers["clip_l"]
    with rt.models.use(handles.vae) as vae, rt.models.use(handles.unet) as unet:
        pipe = StableDiffusionPipeline(
            vae=vae, text_encoder=text_encoder, tokenizer=tokenizer, unet=unet,
            scheduler=make_scheduler("euler", "normal", SD15().scheduler_config("epsilon")),
            safety_checker=None, feature_extractor=None, requires_safety_checker=False)  # type: ignore[arg-type]
    pipe.set_progress_bar_config(disable=True)  # type: ignore[attr-defined]
    return pipe


def loom_vs_diffusers(setup: BenchSetup) -> list[Row]:
    import torch

    rt = BenchRuntime(setup.models_dir, setup.work / "vs", settings={"preview_method": "none"})
    rt.run(txt2img(setup.ckpt_a, size=64, steps=1))  # loads every model once
    pipe = diffusers_pipeline(rt, setup.ckpt_a)
    clock = StepClock()
    rt.bus.subscribe(lambda e: clock.tick() if e.type == "progress" else None)
    rows: list[Row] = []
    counter = 0
    for size in setup.sizes:
        for steps in setup.steps:
            loom_e2e, ref_e2e, loom_step, ref_step = [], [], [], []
            for _ in range(setup.repeats):  # interleaved
                counter += 1
                text = f"a lighthouse at dusk, take {counter}"  # new prompt: encode runs on both sides
                clock.stamps.clear()
                prompt = txt2img(setup.ckpt_a, size=size, steps=steps, seed=counter, text=text, cfg=CFG)
                seconds, _ = timed(partial(rt.run, prompt))
                loom_e2e.append(seconds)
                loom_step.append(clock.per_step())
                clock.stamps.clear()
                seconds, _ = timed(partial(
                    pipe, prompt=text, negative_prompt="blurry", height=size, width=size, num_inference_steps=steps,
                    guidance_scale=CFG, generator=torch.Generator().manual_seed(counter),
                    callback_on_step_end=clock.pipeline_callback))
                ref_e2e.append(seconds)
                ref_step.append(clock.per_step())
            where = f"{size}² {steps} steps"
            lo, re, ls, rs = median(loom_e2e), median(ref_e2e), median(loom_step), median(ref_step)
            rows += [Row(f"txt2img {where}", "Loom end to end", lo, "s"),
                     Row(f"txt2img {where}", "diffusers end to end", re, "s"),
                     Row(f"txt2img {where}", "Loom / diffusers end to end", lo / re, "ratio", "target <= 1.0"),
                     Row(f"txt2img {where}", "Loom s/step", ls, "s"),
                     Row(f"txt2img {where}", "diffusers s/step", rs, "s"),
                     Row(f"txt2img {where}", "Loom / diffusers per step", ls / rs, "ratio", "target <= 1.0")]
    rt.close()
    return rows


def cache_paths(setup: BenchSetup) -> list[Row]:
    size, steps = setup.sizes[0], setup.steps[0]
    rt = BenchRuntime(setup.models_dir, setup.work / "cache")
    cold = rt.run(txt2img(setup.ckpt_a, size=size, steps=steps, seed=1))
    same = [rt.run(txt2img(setup.ckpt_a, size=size, steps=steps, seed=1)) for _ in range(setup.repeats)]
    seeds = [rt.run(txt2img(setup.ckpt_a, size=size, steps=steps, seed=100 + i)) for i in range(setup.repeats)]
    prompts = [rt.run(txt2img(setup.ckpt_a, size=size, steps=steps, seed=100, text=f"other {i}"))
               for i in range(setup.repeats)]
    rt.close()
    cold_s = cold.timings["total_s"]
    resubmit = median([r.timings["total_s"] for r in same])
    seed_s = median([r.timings["total_s"] for r in seeds])
    disk = sum(1 for r in seeds for load in r.memory.get("loads", []) if load["source"] == "disk")
    ran = ",".join(seeds[-1].executed)
    return [
        Row("cache", "cold run (load + encode + sample + decode)", cold_s, "s", f"{size}², {steps} steps"),
        Row("cache", "identical resubmit", resubmit * 1e3, "ms", f"executed: {same[-1].executed or 'nothing'}"),
        Row("cache", "identical resubmit / cold", resubmit / cold_s, "ratio", "target < 0.02"),
        Row("cache", "seed-only change", seed_s, "s", f"ran nodes {ran}; {disk} disk loads"),
        Row("cache", "seed-only / cold", seed_s / cold_s, "ratio", "no load, no encode"),
        Row("cache", "prompt-only change", median([r.timings["total_s"] for r in prompts]), "s",
            f"ran nodes {','.join(prompts[-1].executed)}"),
    ]


def swap(setup: BenchSetup) -> list[Row]:
    size, steps = setup.sizes[0], setup.steps[0]
    rt = BenchRuntime(setup.models_dir, setup.work / "swap")
    results = [rt.run(txt2img(ckpt, size=size, steps=steps, seed=seed))
               for seed, ckpt in enumerate((setup.ckpt_a, setup.ckpt_b, setup.ckpt_a))]
    rt.close()
    rows = []
    for label, result in zip(("A", "B", "A again"), results, strict=True):
        sources = sorted({load["source"] for load in result.memory.get("loads", [])})
        load_s = sum(load["seconds"] for load in result.memory.get("loads", []))
        rows.append(Row("checkpoint swap A→B→A", f"{label}: run", result.timings["total_s"], "s",
                        f"loads from {'/'.join(sources) or '-'}, {load_s:.3f} s loading"))
    return rows


def run(setup: BenchSetup) -> list[Row]:
    return [*loom_vs_diffusers(setup), *cache_paths(setup), *swap(setup)]
