"""Extra seconds per image for the safety check and per run for the IP-Adapter image encode.

    python main.py bench vision [--full] [--repeats 3]

Demo models: through the nodes (``SafetyChecker`` on one 512 px image; ``IPAdapterAdvanced``'s
encode + projection on one reference image), the model already resident (first-load seconds shown
apart). ``--full``: full-size random weights built in memory (no file): the SD safety checker
(CLIP ViT-L/14, 24 layers, width 1024) and the OpenCLIP ViT-H/14 image encoder (32 layers,
width 1280) that ip-adapter_sd15 uses, plus ip-adapter_sd15's projection (1024 → 4 × 768).
Absolute times on shared machines vary up to 3×; compare figures from one run.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from engine.context import Folders, NodeContext
from engine.folders import ModelFolders
from engine.memory.manager import ModelManager
from nodes.control.ipadapter import IPAdapterFile, image_tokens
from nodes.demo.models import make_demo_models
from nodes.demo.vision import DEMO_CLIP_VISION, DEMO_IPADAPTER, DEMO_SAFETY, make_demo_vision_models
from nodes.encode.clip_vision import ClipVisionHandle, encode_pixels, preprocess
from nodes.image.safety import SafetyChecker, scores
from nodes.load.handles import open_checkpoint


def _timed(fn: Callable[[], Any], repeats: int) -> tuple[float, float]:
    """(first call, median of the next ``repeats``) in seconds."""
    start = time.perf_counter()
    fn()
    first = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return first, statistics.median(times)


def _random_init(module: torch.nn.Module) -> torch.nn.Module:
    """Materialise a meta-built module with small random weights (fast, unlike the HF init)."""
    module.to_empty(device="cpu")
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
        for name, b in module.named_buffers():
            if name.endswith("position_ids"):
                b.copy_(torch.arange(b.shape[-1]).view_as(b))
    return module.eval()


def bench_demo(repeats: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        make_demo_models(root)
        make_demo_vision_models(root)
        files = ModelFolders(root)
        folders = Folders(root / "in", root / "out", root / "tmp", model_files=files)
        manager = ModelManager(ram_budget_bytes=2**30, prefetch=False)
        ctx = NodeContext("1", "bench", folders, models=manager)
        image = torch.rand(1, 512, 512, 3)
        safety = DEMO_SAFETY

        def check() -> Any:
            return SafetyChecker().run(ctx, images=image, sensitivity=0.5, action="blur", safety_model=safety)

        first, warm = _timed(check, repeats)
        print(
            f"demo  safety check, 1 image 512 px:        {warm:7.3f} s/image  (first call incl. load {first:.3f} s)"
        )
        adapter = IPAdapterFile.from_file(root / "ipadapter" / DEMO_IPADAPTER)
        cv = ClipVisionHandle.from_file(root / "clip_vision" / DEMO_CLIP_VISION)
        open_checkpoint(root / "checkpoints" / "loom_demo_sd15.safetensors")
        first, warm = _timed(lambda: image_tokens(ctx, adapter, cv, image, None), repeats)
        print(
            f"demo  IP-Adapter encode + projection:      {warm:7.3f} s/run    (first call incl. load {first:.3f} s)"
        )
        manager.close()


def bench_full(repeats: int) -> None:
    from diffusers.models.embeddings import (  # lazy: diffusers takes seconds to import; only the reference needs it
        ImageProjection,
    )
    from diffusers.pipelines.stable_diffusion.safety_checker import (  # lazy: as above
        StableDiffusionSafetyChecker,
    )
    from transformers import CLIPConfig, CLIPVisionConfig, CLIPVisionModelWithProjection  # lazy: as above

    image = torch.rand(1, 512, 512, 3)
    vit_l = {
        "hidden_size": 1024,
        "intermediate_size": 4096,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
        "image_size": 224,
        "patch_size": 14,
        "hidden_act": "quick_gelu",
    }
    start = time.perf_counter()
    with torch.device("meta"):
        checker = StableDiffusionSafetyChecker(CLIPConfig(vision_config=vit_l, projection_dim=768))
    model = _random_init(checker)
    print(f"full  safety checker (ViT-L/14) built in {time.perf_counter() - start:.1f} s")
    first, warm = _timed(lambda: scores(model, preprocess(image, 224, "center"), 0.5), repeats)
    print(f"full  safety check, 1 image 512 px:        {warm:7.3f} s/image  (first {first:.3f} s)")
    model.to_empty(device="meta")  # free it before the next one
    vit_h = CLIPVisionConfig(
        hidden_size=1280,
        intermediate_size=5120,
        num_hidden_layers=32,
        num_attention_heads=16,
        image_size=224,
        patch_size=14,
        projection_dim=1024,
        hidden_act="gelu",
    )
    start = time.perf_counter()
    with torch.device("meta"):
        encoder = CLIPVisionModelWithProjection(vit_h)
        projection = ImageProjection(image_embed_dim=1024, cross_attention_dim=768, num_image_text_embeds=4)
    enc, proj = _random_init(encoder), _random_init(projection)
    print(f"full  ViT-H/14 image encoder built in {time.perf_counter() - start:.1f} s")

    def encode() -> Any:
        pixels = preprocess(image, 224, "center")
        out = encode_pixels(enc, pixels)  # ip-adapter_sd15: no negative encode (zero embeddings)
        with torch.inference_mode():
            return proj(out.image_embeds), proj(torch.zeros_like(out.image_embeds))

    first, warm = _timed(encode, repeats)
    print(f"full  IP-Adapter encode (ViT-H) + proj:    {warm:7.3f} s/run    (first {first:.3f} s)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="main.py bench vision", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--full", action="store_true", help="also full-size random weights (~3.5 GB RAM)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    bench_demo(args.repeats)
    if args.full:
        bench_full(args.repeats)


if __name__ == "__main__":
    main()
