"""Where the benchmark's models come from: the demo models (``--quick``) or full-size random
SD1.5-architecture weights generated once into ``bench_cache/`` (gitignored; never committed)."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from nodes.demo.models import make_demo_models
from nodes.families.base import CONFIGS_DIR
from nodes.families.build import ldm_state_dict
from nodes.families.catalog import SD15
from nodes.image.preview import make_demo_taesd

FULL_CKPT = "sd15_random.safetensors"
DEMO_CKPT = "loom_demo_sd15.safetensors"


@dataclass(frozen=True)
class BenchSetup:
    quick: bool
    models_dir: Path
    work: Path
    ckpt_a: str
    ckpt_b: str
    sizes: tuple[int, ...]
    steps: tuple[int, ...]
    repeats: int
    queue_size: int  # image size of the queue scenario


def cache_root() -> Path:
    return Path(os.environ.get("LOOM_BENCH_CACHE", Path.cwd() / "bench_cache"))


def _second_name(folder: Path, name: str) -> str:
    """Checkpoint B: the same file under another name (another model for Loom: fingerprints hold the path)."""
    other = name.replace(".safetensors", "_b.safetensors")
    if not (folder / other).exists():
        try:
            os.link(folder / name, folder / other)
        except OSError:
            shutil.copy(folder / name, folder / other)
    return other


def prepare(quick: bool, repeats: int | None = None) -> BenchSetup:
    if quick:
        models = Path(tempfile.mkdtemp(prefix="loom_bench_models_"))

        make_demo_models(models)
        ckpt = DEMO_CKPT
    else:
        models = cache_root() / "models"
        write_full_checkpoint(models / "checkpoints" / FULL_CKPT)
        ckpt = FULL_CKPT
    make_demo_taesd(models)
    other = _second_name(models / "checkpoints", ckpt)
    work = Path(tempfile.mkdtemp(prefix="loom_bench_work_"))
    if quick:
        return BenchSetup(True, models, work, ckpt, other, (128, 256), (4, 20), repeats or 3, 128)
    return BenchSetup(False, models, work, ckpt, other, (256, 512), (4, 20), repeats or 2, 256)


def write_full_checkpoint(path: Path) -> Path:
    """Random full-size SD1.5 UNet, CLIP-L and KL VAE in the original single-file layout (fp16, ~2 GB)."""
    if path.is_file():
        return path
    from diffusers import (  # lazy: diffusers takes seconds to import; only a first run builds the weights
        AutoencoderKL,
        UNet2DConditionModel,
    )
    from transformers import CLIPTextConfig, CLIPTextModel  # lazy: as above

    def config(sub: str) -> dict[str, Any]:
        return dict(json.loads((CONFIGS_DIR / "sd15" / sub / "config.json").read_text(encoding="utf-8")))

    print(f"writing full-size random SD1.5 weights to {path} (once) ...", file=sys.stderr, flush=True)
    torch.manual_seed(0)
    modules = {
        "unet": UNet2DConditionModel.from_config(config("unet")).eval(),
        "vae": AutoencoderKL.from_config(config("vae")).eval(),
        "clip_l": CLIPTextModel(
            CLIPTextConfig(**{k: v for k, v in config("text_encoder").items() if not k.startswith("_")})
        ).eval(),
    }
    tensors = {k: v.to(torch.float16).contiguous() for k, v in ldm_state_dict(SD15(), modules).items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    save_file(tensors, str(tmp), metadata={"format": "pt", "loom.note": "random weights for benchmarks"})
    tmp.replace(path)
    return path
