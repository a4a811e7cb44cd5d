"""Seconds per sampling step: Loom's sampling station vs diffusers' StableDiffusionPipeline.

Same full-size SD1.5-architecture UNet (random weights, generated once and cached under the
gitignored ``bench_cache/``), the same math (euler over ComfyUI's "normal" sigmas; diffusers runs
them through ``nodes/bench/diffusers_ref.ComfyEulerScheduler``), same prompt embeddings, CFG 7.5,
fp32 on CPU; text encoding and VAE decoding are excluded on both sides (the pipeline is given
``prompt_embeds`` and returns latents). Run::

    python main.py bench sampling [--sizes 256 512] [--steps 3] [--repeats 1]

Prints one line per size: Loom s/step, diffusers s/step, the ratio (target <= 1.0) and Loom's own
work per step outside the UNet call (target < 1 ms).
"""

from __future__ import annotations

import argparse
import json
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.context import Folders, NodeContext
from nodes.bench.diffusers_ref import ComfyEulerScheduler
from nodes.core.cond import CondEntry
from nodes.core.sampling_hooks import SamplingHooks
from nodes.diffusion.ksampler import sampler_object
from nodes.diffusion.noise import prepare_noise
from nodes.diffusion.schedulers import ksampler_sigmas
from nodes.families.catalog import SD15
from nodes.sample.ksampler import SamplingRequest, cfg_guider, sample

ROOT = Path(__file__).resolve().parents[3]  # the repository
CACHE = ROOT / "bench_cache" / "sd15_unet_random"


def load_unet() -> Any:
    from diffusers import (  # lazy: diffusers takes seconds to import; only the reference needs it
        UNet2DConditionModel,
    )

    if (CACHE / "config.json").is_file():
        return UNet2DConditionModel.from_pretrained(CACHE, local_files_only=True).eval()
    config = json.loads((ROOT / "models" / "configs" / "sd15" / "unet" / "config.json").read_text())
    torch.manual_seed(0)
    unet = UNet2DConditionModel.from_config(config).eval()
    unet.save_pretrained(CACHE)
    return unet


@dataclass(frozen=True)
class BenchModel:
    """Stands in for a DenoiserHandle: the family and scheduler config, with the module already built."""

    family: Any
    prediction: str = "epsilon"

    @property
    def latent_format(self) -> Any:
        return self.family.latent_format

    @property
    def denoiser(self) -> Any:
        return self.family.denoiser

    @property
    def model_sampling(self) -> Any:
        return self.family.model_sampling(self.prediction)

    def sampling_hooks(self, module: Any) -> Any:
        return SamplingHooks()

    def scheduler_config(self) -> dict[str, Any]:
        return dict(self.family.scheduler_config(self.prediction))


class ResidentModels:
    def __init__(self, module: Any) -> None:
        self.module = module

    def use(self, handle: Any) -> Any:
        return nullcontext(self.module)

    def plan_run(self, handle: Any, run: Any) -> None:
        return None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="main.py bench sampling", description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 512])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args(argv)

    from diffusers import (  # lazy: diffusers takes seconds to import; only the reference needs it
        StableDiffusionPipeline,
    )

    torch.set_grad_enabled(False)
    t0 = time.perf_counter()
    unet = load_unet()
    print(
        f"UNet ready in {time.perf_counter() - t0:.1f} s ({sum(p.numel() for p in unet.parameters()) / 1e6:.0f}M params, "
        f"{torch.get_num_threads()} threads)"
    )
    model = BenchModel(SD15())
    ms = model.model_sampling
    gen = torch.Generator().manual_seed(1)
    pos, neg = torch.randn(1, 77, 768, generator=gen), torch.randn(1, 77, 768, generator=gen)
    folders = Folders(ROOT / "bench_cache" / "in", ROOT / "bench_cache" / "out", ROOT / "bench_cache" / "tmp")
    ctx = NodeContext("3", "bench", folders, models=ResidentModels(unet))
    guider = cfg_guider(model, [CondEntry(pos)], [CondEntry(neg)], 7.5)
    unet_s: list[float] = []
    started: list[float] = []
    unet.register_forward_pre_hook(lambda *_: started.append(time.perf_counter()))
    unet.register_forward_hook(lambda *_: unet_s.append(time.perf_counter() - started[-1]))

    def pipe_for(steps: int) -> Any:
        sched = ComfyEulerScheduler.over(
            model.scheduler_config(), ms, ksampler_sigmas(ms, "normal", "euler", steps)
        )
        pipe: Any = StableDiffusionPipeline(
            vae=None,
            text_encoder=None,
            tokenizer=None,
            unet=unet,  # type: ignore[arg-type]
            scheduler=sched,
            safety_checker=None,
            feature_extractor=None,
            requires_safety_checker=False,
        )
        pipe.vae_scale_factor = 8
        pipe.set_progress_bar_config(disable=True)
        return pipe

    def run_loom(steps: int, size: int) -> None:
        latent = {"samples": torch.zeros(1, 4, size // 8, size // 8)}
        job = SamplingRequest(guider, prepare_noise(latent["samples"], 0), 0)
        sample(ctx, [job], sampler_object("euler"), ksampler_sigmas(ms, "normal", "euler", steps), latent)

    def run_diffusers(steps: int, size: int) -> None:
        pipe_for(steps)(
            prompt_embeds=pos,
            negative_prompt_embeds=neg,
            height=size,
            width=size,
            num_inference_steps=steps,
            guidance_scale=7.5,
            latents=prepare_noise(torch.zeros(1, 4, size // 8, size // 8), 0),
            output_type="latent",
        )

    print(f"{'size':>6} {'loom s/step':>12} {'diffusers s/step':>17} {'ratio':>7} {'loom own ms/step':>17}")
    for size in args.sizes:
        run_loom(1, size)  # warm-up: allocator, oneDNN
        run_diffusers(1, size)
        loom, ref, own = [], [], []
        for _ in range(args.repeats):  # interleaved, so load on the machine hits both alike
            unet_s.clear()
            t = time.perf_counter()
            run_loom(args.steps, size)
            total = time.perf_counter() - t
            loom.append(total / args.steps)
            own.append((total - sum(unet_s)) / args.steps)
            t = time.perf_counter()
            run_diffusers(args.steps, size)
            ref.append((time.perf_counter() - t) / args.steps)
        lo, di = min(loom), min(ref)
        print(f"{size:>6} {lo:>12.3f} {di:>17.3f} {lo / di:>7.3f} {min(own) * 1000:>17.2f}", flush=True)


if __name__ == "__main__":
    main()
