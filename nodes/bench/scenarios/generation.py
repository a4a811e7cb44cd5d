"""txt2img end to end and per step, Loom vs diffusers' StableDiffusionPipeline on the same modules;
cache scenarios (identical resubmit, seed-only, prompt-only); checkpoint swap A→B→A."""

from __future__ import annotations

import time
from functools import partial
from typing import Any

import torch

from nodes.bench.report import Row, median, timed
from nodes.bench.runtime import BenchRuntime, contiguous_copy, txt2img
from nodes.bench.setup import BenchSetup
from nodes.families.catalog import SD15
from nodes.load.handles import open_checkpoint

CFG = 7.0


class StepClock:
    """Times between consecutive sampler steps (progress events / pipeline callbacks), and the time
    spent inside the UNet's forward (hooks on the module both sides share), so that each side's
    own cost per step — everything but the UNet — can be told apart from the UNet's noise."""

    def __init__(self) -> None:
        self.stamps: list[float] = []
        self.unet_s: list[float] = []
        self._entered = 0.0

    def tick(self) -> None:
        self.stamps.append(time.perf_counter())

    def pipeline_callback(self, pipe: Any, step: int, timestep: Any, callback_kwargs: dict) -> dict:
        self.tick()
        return callback_kwargs

    def attach(self, unet: Any) -> None:
        unet.register_forward_pre_hook(lambda *_: setattr(self, "_entered", time.perf_counter()))
        unet.register_forward_hook(lambda *_: self.unet_s.append(time.perf_counter() - self._entered))

    def clear(self) -> None:
        self.stamps.clear()
        self.unet_s.clear()

    def gaps(self) -> list[float]:
        return [b - a for a, b in zip(self.stamps, self.stamps[1:], strict=False)]

    def outside_unet(self) -> list[float]:
        """Per step (after the first): the step's time minus its UNet call."""
        return [gap - unet for gap, unet in zip(self.gaps(), self.unet_s[1:], strict=False)]


def diffusers_pipeline(rt: BenchRuntime, ckpt: str) -> Any:
    """StableDiffusionPipeline over the weights Loom's memory manager holds, as diffusers would have
    them (``from_single_file``: contiguous memory order; Loom keeps UNet and VAE channels-last on
    CPU, so those two are copied; the text encoder is shared)."""
    from diffusers import (  # lazy: diffusers takes seconds to import; only the reference needs it
        EulerDiscreteScheduler,
        StableDiffusionPipeline,
    )

    handles = open_checkpoint(rt.files.resolve("checkpoints", ckpt))
    with rt.models.use(handles.clip) as clip:
        text_encoder, tokenizer = clip["clip_l"], clip.tokenizers["clip_l"]
    with rt.models.use(handles.vae) as loom_vae, rt.models.use(handles.unet) as loom_unet:
        vae, unet = contiguous_copy(loom_vae), contiguous_copy(loom_unet)
        pipe = StableDiffusionPipeline(
            vae=vae,
            text_encoder=text_encoder,
            tokenizer=tokenizer,
            unet=unet,
            scheduler=EulerDiscreteScheduler.from_config(SD15().scheduler_config("epsilon")),
            safety_checker=None,
            feature_extractor=None,
            requires_safety_checker=False,
        )  # type: ignore[arg-type]
    pipe.set_progress_bar_config(disable=True)  # type: ignore[attr-defined]
    return pipe


def _loom_unet(rt: BenchRuntime, ckpt: str) -> Any:
    with rt.models.use(open_checkpoint(rt.files.resolve("checkpoints", ckpt)).unet) as unet:
        return unet


def loom_vs_diffusers(setup: BenchSetup) -> list[Row]:
    rt = BenchRuntime(setup.models_dir, setup.work / "vs", run_settings={"preview_method": "none"})
    rt.run(txt2img(setup.ckpt_a, size=64, steps=1))  # loads every model once
    pipe = diffusers_pipeline(rt, setup.ckpt_a)
    clock = StepClock()
    clock.attach(pipe.unet)
    clock.attach(_loom_unet(rt, setup.ckpt_a))
    rt.bus.subscribe(lambda e: clock.tick() if e.type == "progress" else None)
    rows: list[Row] = []
    counter = 0
    for size in setup.sizes:
        for steps in setup.steps:
            e2e: dict[str, list[float]] = {"loom": [], "diffusers": []}
            step: dict[str, list[float]] = {"loom": [], "diffusers": []}
            own: dict[str, list[float]] = {"loom": [], "diffusers": []}
            for rep in range(setup.repeats):  # interleaved, and each side goes first every other time
                counter += 1
                text = f"a lighthouse at dusk, take {counter}"  # new prompt: encode runs on both sides
                prompt = txt2img(setup.ckpt_a, size=size, steps=steps, seed=counter, text=text, cfg=CFG)
                sides = {
                    "loom": partial(rt.run, prompt),
                    "diffusers": partial(
                        pipe,
                        prompt=text,
                        negative_prompt="blurry",
                        height=size,
                        width=size,
                        num_inference_steps=steps,
                        guidance_scale=CFG,
                        generator=torch.Generator().manual_seed(counter),
                        callback_on_step_end=clock.pipeline_callback,
                    ),
                }
                for side in ("loom", "diffusers") if rep % 2 == 0 else ("diffusers", "loom"):
                    clock.clear()
                    seconds, _ = timed(sides[side])
                    e2e[side].append(seconds)
                    step[side] += clock.gaps()  # every step of every repeat: a median over many
                    own[side] += clock.outside_unet()
            where = f"{size}² {steps} steps"
            lo, re = median(e2e["loom"]), median(e2e["diffusers"])
            ls, rs = median(step["loom"]), median(step["diffusers"])
            rows += [
                Row(f"txt2img {where}", "Loom end to end", lo, "s"),
                Row(f"txt2img {where}", "diffusers end to end", re, "s"),
                Row(f"txt2img {where}", "Loom / diffusers end to end", lo / re, "ratio", "target <= 1.0"),
                Row(f"txt2img {where}", "Loom s/step", ls, "s", f"median of {len(step['loom'])} steps"),
                Row(
                    f"txt2img {where}",
                    "diffusers s/step",
                    rs,
                    "s",
                    f"median of {len(step['diffusers'])} steps",
                ),
                Row(f"txt2img {where}", "Loom / diffusers per step", ls / rs, "ratio", "target <= 1.0"),
                Row(
                    f"txt2img {where}",
                    "per step outside the UNet, Loom",
                    median(own["loom"]) * 1e3,
                    "ms",
                    f"diffusers {median(own['diffusers']) * 1e3:.2f} ms (sampler, CFG, callbacks)",
                ),
            ]
    rt.close()
    return rows


def cache_paths(setup: BenchSetup) -> list[Row]:
    size, steps = setup.sizes[0], setup.steps[0]
    rt = BenchRuntime(setup.models_dir, setup.work / "cache")
    cold = rt.run(txt2img(setup.ckpt_a, size=size, steps=steps, seed=1))
    same = [rt.run(txt2img(setup.ckpt_a, size=size, steps=steps, seed=1)) for _ in range(setup.repeats)]
    seeds = [
        rt.run(txt2img(setup.ckpt_a, size=size, steps=steps, seed=100 + i)) for i in range(setup.repeats)
    ]
    prompts = [
        rt.run(txt2img(setup.ckpt_a, size=size, steps=steps, seed=100, text=f"other {i}"))
        for i in range(setup.repeats)
    ]
    rt.close()
    cold_s = cold.timings["total_s"]
    resubmit = median([r.timings["total_s"] for r in same])
    seed_s = median([r.timings["total_s"] for r in seeds])
    disk = sum(1 for r in seeds for load in r.memory.get("loads", []) if load["source"] == "disk")
    ran = ",".join(seeds[-1].executed)
    return [
        Row("cache", "cold run (load + encode + sample + decode)", cold_s, "s", f"{size}², {steps} steps"),
        Row(
            "cache", "identical resubmit", resubmit * 1e3, "ms", f"executed: {same[-1].executed or 'nothing'}"
        ),
        Row("cache", "identical resubmit / cold", resubmit / cold_s, "ratio", "target < 0.02"),
        Row("cache", "seed-only change", seed_s, "s", f"ran nodes {ran}; {disk} disk loads"),
        Row("cache", "seed-only / cold", seed_s / cold_s, "ratio", "no load, no encode"),
        Row(
            "cache",
            "prompt-only change",
            median([r.timings["total_s"] for r in prompts]),
            "s",
            f"ran nodes {','.join(prompts[-1].executed)}",
        ),
    ]


def swap(setup: BenchSetup) -> list[Row]:
    size, steps = setup.sizes[0], setup.steps[0]
    rt = BenchRuntime(setup.models_dir, setup.work / "swap")
    results = [
        rt.run(txt2img(ckpt, size=size, steps=steps, seed=seed))
        for seed, ckpt in enumerate((setup.ckpt_a, setup.ckpt_b, setup.ckpt_a))
    ]
    rt.close()
    rows = []
    for label, result in zip(("A", "B", "A again"), results, strict=True):
        sources = sorted({load["source"] for load in result.memory.get("loads", [])})
        load_s = sum(load["seconds"] for load in result.memory.get("loads", []))
        rows.append(
            Row(
                "checkpoint swap A→B→A",
                f"{label}: run",
                result.timings["total_s"],
                "s",
                f"loads from {'/'.join(sources) or '-'}, {load_s:.3f} s loading",
            )
        )
    return rows


def run(setup: BenchSetup) -> list[Row]:
    return [*loom_vs_diffusers(setup), *cache_paths(setup), *swap(setup)]
