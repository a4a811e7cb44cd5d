"""Each optimisation on vs off: speed ratio and image difference (ToMe, DeepCache, previews) and
device-level switches measured on the UNet itself (SDPA, channels-last, bf16; TF32/compile noted)."""

from __future__ import annotations

import argparse
import copy
import os
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import torch

from engine.memory import precision
from engine.memory.device_policy import DevicePolicy
from nodes.bench.report import Row, interleaved, median
from nodes.bench.runtime import BenchRuntime, contiguous_copy, image_difference, txt2img
from nodes.bench.setup import BenchSetup
from nodes.image.preview import PreviewPacer
from nodes.load.handles import open_checkpoint


def _sampler_s(rt: BenchRuntime, prompt: dict[str, Any]) -> tuple[float, Any]:
    result = rt.run(prompt)
    return result.timings["nodes"]["3"], rt.image(result)


def _on_off(rt: BenchRuntime, setup: BenchSetup, size: int, steps: int, **patch: Any) -> tuple[float, float]:
    """(speed ratio off/on of the sampler node, mean image difference), same seeds, interleaved."""
    off_t, on_t, diffs = [], [], []
    for seed in range(setup.repeats):
        off, off_img = _sampler_s(rt, txt2img(setup.ckpt_a, size=size, steps=steps, seed=seed))
        on, on_img = _sampler_s(rt, txt2img(setup.ckpt_a, size=size, steps=steps, seed=seed, **patch))
        off_t.append(off)
        on_t.append(on)
        diffs.append(image_difference(off_img, on_img))
    return median(off_t) / median(on_t), median(diffs)


def model_patches(setup: BenchSetup) -> list[Row]:
    rt = BenchRuntime(setup.models_dir, setup.work / "patches", run_settings={"preview_method": "none"})
    big, steps = setup.sizes[-1], setup.steps
    rt.run(txt2img(setup.ckpt_a, size=64, steps=1, tome=0.5))  # load both UNets once
    speed, diff = _on_off(rt, setup, big, steps[0], tome=0.5)
    rows = [
        Row("ToMe (TomePatchModel 0.5)", f"sampler speed-up at {big}²", speed, "x", "off by default"),
        Row("ToMe (TomePatchModel 0.5)", "image difference", diff, "mean |Δ|", "trades quality"),
    ]
    dc = {"cache_interval": 3, "cache_depth": 0, "start_step": 0, "end_step": 1000}
    speed, diff = _on_off(rt, setup, setup.sizes[0], steps[-1], deepcache=dc)
    rows += [
        Row(
            "DeepCache (interval 3, depth 0)",
            f"sampler speed-up, {setup.sizes[0]}² {steps[-1]} steps",
            speed,
            "x",
            "off by default",
        ),
        Row("DeepCache (interval 3, depth 0)", "image difference", diff, "mean |Δ|", "trades quality"),
    ]
    rt.close()
    return rows


def half_precision(setup: BenchSetup) -> list[Row]:
    """``--bf16-unet`` vs the CPU's fp32 policy on whole txt2img runs: sampler speed-up and image
    difference (bf16 trades quality; CPUs with native bf16 — AVX-512 BF16, AMX — gain, others lose)."""
    bf16 = precision.apply(DevicePolicy.cpu(), argparse.Namespace(bf16_unet=True))
    runtimes = {
        "fp32": BenchRuntime(setup.models_dir, setup.work / "fp32", run_settings={"preview_method": "none"}),
        "bf16": BenchRuntime(
            setup.models_dir, setup.work / "bf16", run_settings={"preview_method": "none"}, policy=bf16
        ),
    }
    for rt in runtimes.values():
        rt.run(txt2img(setup.ckpt_a, size=64, steps=1))  # load once
    size, steps = setup.sizes[-1], setup.steps[0]
    times: dict[str, list[float]] = {k: [] for k in runtimes}
    diffs = []
    for seed in range(setup.repeats):
        images = {}
        for name, rt in runtimes.items() if seed % 2 == 0 else reversed(runtimes.items()):
            seconds, images[name] = _sampler_s(rt, txt2img(setup.ckpt_a, size=size, steps=steps, seed=seed))
            times[name].append(seconds)
        diffs.append(image_difference(images["fp32"], images["bf16"]))
    for rt in runtimes.values():
        rt.close()
    return [
        Row(
            "--bf16-unet",
            f"sampler speed-up at {size}², {steps} steps",
            median(times["fp32"]) / median(times["bf16"]),
            "x",
            "opt-in flag (fp32 on CPU by default)",
        ),
        Row("--bf16-unet", "image difference", median(diffs), "mean |Δ|", "trades quality"),
    ]


@contextmanager
def _preview_clock(spent: list[float]) -> Iterator[None]:
    """Collects the seconds of every preview the sampler renders (``PreviewPacer.record`` gets the
    time from the denoised estimate to the encoded frame); benchmark-only instrumentation."""
    original = PreviewPacer.record

    def record(pacer: PreviewPacer, seconds: float) -> None:
        spent.append(seconds)
        original(pacer, seconds)

    PreviewPacer.record = record  # type: ignore[method-assign, assignment]
    try:
        yield
    finally:
        PreviewPacer.record = original  # type: ignore[method-assign]


def previews(setup: BenchSetup) -> list[Row]:
    """Preview cost as a share of sampling: measured directly (the seconds spent rendering previews
    over the sampler node's time), and as the sampler's slow-down against a run without previews
    (noisier: it includes the machine's run-to-run spread)."""
    size, steps = setup.sizes[0], setup.steps[-1]  # a percentage of the step: the smaller size suffices
    rows = []
    runtimes = {
        m: BenchRuntime(setup.models_dir, setup.work / f"preview_{m}", run_settings={"preview_method": m})
        for m in ("none", "latent2rgb", "taesd")
    }
    for rt in runtimes.values():
        rt.run(txt2img(setup.ckpt_a, size=64, steps=2))
    times: dict[str, list[float]] = {m: [] for m in runtimes}
    spent: dict[str, list[float]] = {m: [] for m in runtimes}
    shown: dict[str, list[int]] = {m: [] for m in runtimes}
    for seed in range(setup.repeats + 1):  # the first round learns each method's cost at this size
        for method, rt in runtimes.items():
            frames: list[float] = []
            with _preview_clock(frames):
                seconds = rt.run(txt2img(setup.ckpt_a, size=size, steps=steps, seed=seed)).timings["nodes"][
                    "3"
                ]
            if seed:
                times[method].append(seconds)
                spent[method].append(sum(frames) / seconds * 100)
                shown[method].append(len(frames))
    base = median(times["none"])
    for method in ("latent2rgb", "taesd"):
        slow = (median(times[method]) - base) / base * 100
        rows.append(
            Row(
                "previews",
                f"{method}: time rendering previews, {size}² {steps} steps",
                median(spent[method]),
                "% sampling",
                f"{median([float(n) for n in shown[method]]):.0f} previews per run, paced to "
                f"<= 5%; sampler vs no previews {slow:+.1f}% (run-to-run noise)",
            )
        )
    for rt in runtimes.values():
        rt.close()
    return rows


def _unet(rt: BenchRuntime, ckpt: str) -> Any:
    """A copy of the UNet as the manager computes with it (its memory order and dtype): the module
    itself goes back to its stored precision when the manager evicts it."""
    with rt.models.use(open_checkpoint(rt.files.resolve("checkpoints", ckpt)).unet) as unet:
        return copy.deepcopy(unet)


def _vae_channels_last(rt: BenchRuntime, setup: BenchSetup) -> Row:
    with rt.models.use(open_checkpoint(rt.files.resolve("checkpoints", setup.ckpt_a)).vae) as vae:
        last = copy.deepcopy(vae)  # as computed with (see _unet)
    plain = contiguous_copy(last)
    h = setup.sizes[-1] // 8
    z = torch.randn(1, 4, h, h, generator=torch.Generator().manual_seed(1))

    def decode(module: Any) -> Any:
        with torch.no_grad():
            return module.decode(z, return_dict=False)[0]

    diff = float((decode(plain) - decode(last)).abs().max())
    timing = interleaved(
        {"contiguous": partial(decode, plain), "channels_last": partial(decode, last)}, setup.repeats
    )
    return Row(
        "device: channels-last",
        f"VAE decode speed-up at {setup.sizes[-1]}²",
        timing["contiguous"] / timing["channels_last"],
        "x",
        f"max |Δ| {diff:.2e} (pixels in -1..1); on by default on CPU",
    )


def device_level(setup: BenchSetup) -> list[Row]:
    rt = BenchRuntime(setup.models_dir, setup.work / "device")
    unet = _unet(rt, setup.ckpt_a)
    h = setup.sizes[-1] // 8
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4, h, h, generator=gen)
    hidden = torch.randn(2, 77, unet.config.cross_attention_dim, generator=gen)
    t = torch.tensor(500)
    processors = {type(p).__name__ for p in unet.attn_processors.values()}
    rows = [
        Row(
            "device: SDPA attention",
            "processors",
            float("AttnProcessor2_0" in processors),
            "bool",
            f"{sorted(processors)} (torch scaled_dot_product_attention)",
        )
    ]

    def step(module: Any, sample: Any, states: Any) -> Any:
        with torch.no_grad():
            return module(sample, t, encoder_hidden_states=states, return_dict=False)[0]

    # Loom's policy keeps the UNet and VAE channels-last on CPU (DevicePolicy.channels_last): compare
    # with contiguous copies, the memory order diffusers loads them in
    last, plain = unet, contiguous_copy(unet)
    ref, alt = step(plain, x, hidden), step(last, x, hidden)
    timing = interleaved(
        {"contiguous": partial(step, plain, x, hidden), "channels_last": partial(step, last, x, hidden)},
        setup.repeats,
    )
    rows.append(
        Row(
            "device: channels-last",
            f"UNet call speed-up at {setup.sizes[-1]}² (CFG batch)",
            timing["contiguous"] / timing["channels_last"],
            "x",
            f"max |Δ| {float((ref - alt).abs().max()):.2e}; on by default on CPU",
        )
    )
    del plain
    rows.append(_vae_channels_last(rt, setup))
    bf16 = torch.nn.Module.to(copy.deepcopy(unet), torch.bfloat16)
    timing = interleaved(
        {
            "fp32": partial(step, unet, x, hidden),
            "bf16": partial(step, bf16, x.bfloat16(), hidden.bfloat16()),
        },
        max(1, setup.repeats - 1),
    )
    rows.append(
        Row(
            "device: bf16 vs fp32",
            "UNet call speed-up",
            timing["fp32"] / timing["bf16"],
            "x",
            "policy: fp32 on CPU, fp16/bf16 on CUDA (DevicePolicy.detect); flags override",
        )
    )
    del bf16
    rows.append(
        Row(
            "device: TF32",
            "enabled",
            float(torch.backends.cuda.matmul.allow_tf32),
            "bool",
            "--tf32: CUDA only, set around sampling; nothing to switch on a CPU",
        )
    )
    if os.environ.get("LOOM_BENCH_COMPILE") == "1":
        compiled = torch.compile(unet)
        first = interleaved({"compile+first": lambda: step(compiled, x, hidden)}, 1)["compile+first"]
        timing = interleaved(
            {"eager": lambda: step(unet, x, hidden), "compiled": lambda: step(compiled, x, hidden)},
            setup.repeats,
        )
        rows.append(
            Row(
                "device: torch.compile",
                "UNet call speed-up",
                timing["eager"] / timing["compiled"],
                "x",
                f"first call (compile) {first:.0f} s; opt-in only",
            )
        )
    else:
        rows.append(
            Row(
                "device: torch.compile",
                "UNet call speed-up",
                float("nan"),
                "x",
                "not run (LOOM_BENCH_COMPILE=1 measures it; ~64 s compile per shape on this CPU)",
            )
        )
    rt.close()
    return rows


def run(setup: BenchSetup) -> list[Row]:
    return [*model_patches(setup), *half_precision(setup), *previews(setup), *device_level(setup)]
