"""Step caches for transformers (EasyCache, LazyCache, FirstBlockCache): seconds, speed-up, model
work skipped and latent difference against no cache, on a random-weight Flux dev transformer.

    python main.py bench step_cache [--size 128] [--steps 12] [--double 4] [--single 8] [--width 256]

The transformer is written to a temporary .safetensors file next to the demo text encoders; the
runs are ``nodes/bench/step_cache_runs.py``'s (which the step-cache tests share). Random weights change their first-block
residual more from step to step than trained ones, so FirstBlockCache needs a higher threshold here
than on a real model. Printed, never asserted; absolute times on shared machines vary up to 3×.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from engine.context import Folders, NodeContext, RunSettings
from engine.folders import ModelFolders
from engine.memory.manager import ModelManager
from nodes.bench.step_cache_runs import bench_lines
from nodes.core.parts import Part
from nodes.demo.flux import DEMO_CLIP_L, DEMO_T5XXL, make_flux_demo
from nodes.encode.conditioning import CLIPTextEncode
from nodes.families.build import original_state_dict
from nodes.families.components.flux_dit import FluxTransformer, rope_axes
from nodes.load.handles import open_diffusion_model, open_text_encoders


def write_flux(folder: Path, double: int, single: int, width: int) -> Path:
    from diffusers import (  # lazy: diffusers takes seconds to import; only to build the random weights
        FluxTransformer2DModel,
    )

    torch.manual_seed(7)
    heads = max(1, width // 64)
    model: Any = FluxTransformer2DModel(
        patch_size=1,
        in_channels=64,
        num_layers=double,
        num_single_layers=single,
        attention_head_dim=width // heads,
        num_attention_heads=heads,
        joint_attention_dim=32,
        pooled_projection_dim=32,
        guidance_embeds=True,
        axes_dims_rope=rope_axes(width // heads),
    )
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.03)
    sd = original_state_dict(Part.make("unet", FluxTransformer(), "", "", dict(model.config)), model)
    path = folder / "bench_flux.safetensors"
    save_file({k: v.contiguous() for k, v in sd.items()}, str(path))
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="main.py bench step_cache", description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=128, help="image side in pixels")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--double", type=int, default=4, help="double-stream blocks")
    parser.add_argument("--single", type=int, default=8, help="single-stream blocks")
    parser.add_argument("--width", type=int, default=256, help="transformer width (64-wide heads)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        make_flux_demo(root)
        folders = Folders(root / "input", root / "output", root / "temp", model_files=ModelFolders(root))
        folders.ensure()
        ctx = NodeContext(
            node_id="1",
            prompt_id="bench",
            folders=folders,
            models=ModelManager(ram_budget_bytes=4 << 30, prefetch=False),
            settings=RunSettings(),
        )
        clip = open_text_encoders(
            [root / "text_encoders" / DEMO_T5XXL, root / "text_encoders" / DEMO_CLIP_L], "flux"
        )
        pos = CLIPTextEncode().run(ctx, text="a cat on a roof", clip=clip)[0]
        neg = CLIPTextEncode().run(ctx, text="blurry", clip=clip)[0]
        model = open_diffusion_model(write_flux(root, args.double, args.single, args.width))
        header = f"random Flux dev ({args.double}+{args.single} blocks, width {args.width}, 1 thread)"
        print(bench_lines(ctx, model, pos, neg, size=args.size, steps=args.steps, header=header))


if __name__ == "__main__":
    main()
