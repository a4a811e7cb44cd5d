"""Seconds per sampling step: Loom's KSampler loop vs diffusers' StableDiffusionPipeline.

Same full-size SD1.5-architecture UNet (random weights, generated once and cached under the
gitignored ``bench_cache/``), same scheduler (euler / normal), same prompt embeddings, CFG 7.5,
fp32 on CPU; text encoding and VAE decoding are excluded on both sides (the pipeline is given
``prompt_embeds`` and returns latents). Run::

    python tests/benchmarks/bench_sampling.py [--sizes 256 512] [--steps 3] [--repeats 1]

Prints one line per size: Loom s/step, diffusers s/step and the ratio (target <= 1.0).
"""

from __future__ import annotations

import argparse
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
CACHE = ROOT / "bench_cache" / "sd15_unet_random"


def load_unet() -> Any:
    import json

    import torch
    from diffusers import UNet2DConditionModel

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

    def sampling_hooks(self, module: Any) -> Any:
        from nodes.hooks import SamplingHooks

        return SamplingHooks()

    def scheduler_config(self) -> dict[str, Any]:
        return dict(self.family.scheduler_config(self.prediction))


class ResidentModels:
    def __init__(self, module: Any) -> None:
        self.module = module

    def use(self, handle: Any) -> Any:
        return nullcontext(self.module)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 512])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()

    import torch
    from diffusers import StableDiffusionPipeline

    from engine.context import Folders, NodeContext
    from nodes.conditioning import CondEntry
    from nodes.denoise import Window
    from nodes.families import SD15
    from nodes.samplers import make_noise, make_scheduler
    from nodes.sampling import Settings, sample

    torch.set_grad_enabled(False)
    t0 = time.perf_counter()
    unet = load_unet()
    print(f"UNet ready in {time.perf_counter() - t0:.1f} s ({sum(p.numel() for p in unet.parameters()) / 1e6:.0f}M params, "
          f"{torch.get_num_threads()} threads)")
    model = BenchModel(SD15())
    gen = torch.Generator().manual_seed(1)
    pos, neg = torch.randn(1, 77, 768, generator=gen), torch.randn(1, 77, 768, generator=gen)
    folders = Folders(ROOT / "bench_cache" / "in", ROOT / "bench_cache" / "out", ROOT / "bench_cache" / "tmp")
    ctx = NodeContext("3", "bench", folders, models=ResidentModels(unet))
    pipe = StableDiffusionPipeline(vae=None, text_encoder=None, tokenizer=None, unet=unet,  # type: ignore[arg-type]
                                   scheduler=make_scheduler("euler", "normal", model.scheduler_config()),
                                   safety_checker=None, feature_extractor=None, requires_safety_checker=False)
    pipe.vae_scale_factor = 8
    pipe.set_progress_bar_config(disable=True)

    print(f"{'size':>6} {'loom s/step':>12} {'diffusers s/step':>17} {'ratio':>7}")
    for size in args.sizes:
        h = size // 8
        settings = Settings(0, args.steps, 7.5, "euler", "normal", Window.from_denoise(args.steps, 1.0))
        latent = {"samples": torch.zeros(1, 4, h, h)}
        loom, ref = [], []

        def run_loom(s: Settings = settings, latent: dict = latent) -> None:
            sample(ctx, model, [CondEntry(pos)], [CondEntry(neg)], latent, s)

        def run_diffusers(steps: int = args.steps, size: int = size) -> None:
            h = size // 8
            pipe(prompt_embeds=pos, negative_prompt_embeds=neg, height=size, width=size, num_inference_steps=steps,
                 guidance_scale=7.5, latents=make_noise(0, (1, 4, h, h)), output_type="latent")

        run_loom(Settings(0, 1, 7.5, "euler", "normal", Window.from_denoise(1, 1.0)))  # warm-up: allocator, oneDNN
        run_diffusers(1)
        for _ in range(args.repeats):  # interleaved, so load on the machine hits both alike
            t = time.perf_counter()
            run_loom()
            loom.append((time.perf_counter() - t) / args.steps)
            t = time.perf_counter()
            run_diffusers()
            ref.append((time.perf_counter() - t) / args.steps)
        lo, di = min(loom), min(ref)
        print(f"{size:>6} {lo:>12.3f} {di:>17.3f} {lo / di:>7.3f}", flush=True)


if __name__ == "__main__":
    main()
