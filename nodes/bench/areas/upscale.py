"""Upscale seconds per output megapixel through ``ImageUpscaleWithModel`` (tiled as ComfyUI: 512 px
tiles, 32 px overlap), the model already resident (first-load seconds shown apart).

    python main.py bench upscale [--full] [--size 256] [--repeats 2]

Default: the demo ESRGAN (4×, 8 features, 1 block) on a ``--size``² image. ``--full``: the
RealESRGAN_x4plus architecture (64 features, 23 RRDB blocks) with random weights, written to a
temporary .safetensors file; slow on a CPU, keep ``--size`` small there. Printed, never asserted;
absolute times on shared machines vary up to 3×.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from engine.context import Folders, NodeContext
from engine.folders import ModelFolders
from engine.memory.device_policy import DevicePolicy
from engine.memory.manager import ModelManager
from nodes.demo.upscale import demo_esrgan_state_dict
from nodes.image.upscale_model import ImageUpscaleWithModel, UpscaleModelLoader


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="main.py bench upscale", description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="full-size RealESRGAN_x4plus architecture")
    parser.add_argument("--size", type=int, default=256, help="input image side in pixels")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "upscale_models").mkdir()
        sd = demo_esrgan_state_dict(num_feat=64, num_blocks=23) if args.full else demo_esrgan_state_dict()
        save_file(sd, str(root / "upscale_models" / "bench.safetensors"))
        manager = ModelManager(DevicePolicy.detect(), ram_budget_bytes=2**32, prefetch=False)
        ctx = NodeContext(
            node_id="1",
            prompt_id="bench",
            folders=Folders(root, root, root, model_files=ModelFolders(root)),
            models=manager,
        )
        (handle,) = UpscaleModelLoader().run(ctx, model_name="bench.safetensors")
        image = torch.rand(1, args.size, args.size, 3, generator=torch.Generator().manual_seed(0))
        node = ImageUpscaleWithModel()
        start = time.perf_counter()
        (out,) = node.run(ctx, upscale_model=handle, image=image)
        first = time.perf_counter() - start
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            node.run(ctx, upscale_model=handle, image=image)
            times.append(time.perf_counter() - start)
        manager.close()
    megapixels = out.shape[1] * out.shape[2] / 1e6
    label = "RealESRGAN_x4plus (random)" if args.full else "demo ESRGAN"
    print(
        f"{label}: {args.size}² → {out.shape[2]}×{out.shape[1]} on {manager.policy.device}, "
        f"threads {torch.get_num_threads()}"
    )
    print(
        f"  first run (load + upscale) {first:.2f}s; upscale {statistics.median(times):.2f}s "
        f"= {statistics.median(times) / megapixels:.2f} s per output megapixel"
    )


if __name__ == "__main__":
    main()
