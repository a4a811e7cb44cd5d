"""Model loading figures for a full-size SD1.5-architecture checkpoint (random weights, generated
here into bench_cache/, fp16 like most downloads). Not a test: prints figures.

    python main.py bench model_load [--compute-s 2.0]

Prints: the time to simply read the file (the disk limit), a cold load through the manager (page
cache dropped for the file with posix_fadvise where the OS allows), a load from the RAM tier, a
swap A→B, and a two-checkpoint "workflow" (use A for --compute-s, then B) with prefetch off/on.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from engine.memory.manager import ModelManager
from nodes.bench.page_cache import drop_page_cache
from nodes.families.build import ldm_state_dict
from nodes.families.catalog import SD15
from nodes.load.handles import open_checkpoint

ROOT = Path(__file__).resolve().parents[3]  # the repository
CACHE = ROOT / "bench_cache"


def read_file(path: Path) -> float:
    start = time.perf_counter()
    with path.open("rb") as f:
        while f.read(64 << 20):
            pass
    return time.perf_counter() - start


def make_checkpoints() -> tuple[Path, Path]:
    a, b = CACHE / "sd15_random_a.safetensors", CACHE / "sd15_random_b.safetensors"
    if not a.is_file():
        from diffusers import (  # lazy: diffusers takes seconds to import; only a first run builds the weights
            AutoencoderKL,
            UNet2DConditionModel,
        )
        from transformers import CLIPTextConfig, CLIPTextModel  # lazy: as above

        cfg = SD15().config_dir()
        torch.manual_seed(0)
        t = time.perf_counter()
        unet = UNet2DConditionModel.from_config(UNet2DConditionModel.load_config(cfg / "unet"))
        vae = AutoencoderKL.from_config(AutoencoderKL.load_config(cfg / "vae"))
        text = CLIPTextModel(CLIPTextConfig.from_pretrained(cfg / "text_encoder"))
        sd = ldm_state_dict(SD15(), {"unet": unet, "clip_l": text, "vae": vae})
        sd = {k: v.half().contiguous() for k, v in sd.items()}
        CACHE.mkdir(exist_ok=True)
        save_file(sd, str(a))
        print(f"generated {a.name} ({a.stat().st_size / 2**30:.2f} GiB) in {time.perf_counter() - t:.1f}s")
    if not b.is_file():
        shutil.copyfile(a, b)
    return a, b


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="main.py bench model_load", description=__doc__)
    parser.add_argument("--compute-s", type=float, default=2.0, help="simulated node compute time")
    args = parser.parse_args(argv)

    a_path, b_path = make_checkpoints()
    a, b = open_checkpoint(a_path).unet, open_checkpoint(b_path).unet
    gib = a.estimate_bytes() / 2**30
    print(f"UNet: {gib:.2f} GiB in the file (fp16); computes in fp32 on CPU")

    cold = drop_page_cache(a_path)
    print(
        f"read file (page cache {'dropped' if cold else 'kept'}): {read_file(a_path):.2f}s for "
        f"{a_path.stat().st_size / 2**30:.2f} GiB; again, warm: {read_file(a_path):.2f}s"
    )

    def timed(mm: ModelManager, handle: object) -> tuple[float, str]:
        t = time.perf_counter()
        with mm.use(handle):  # type: ignore[arg-type]
            pass
        return time.perf_counter() - t, mm.stats()["loads"][-1]["source"]

    mm = ModelManager(ram_budget_bytes=24 * 2**30, prefetch=False)
    drop_page_cache(a_path)
    rss_before = rss_bytes()
    print("cold load A (disk, page cache dropped): {:.2f}s [{}]".format(*timed(mm, a)))
    print("swap A→B (B from disk, page cache warm): {:.2f}s [{}]".format(*timed(mm, b)))
    print("swap B→A (A from the RAM tier):           {:.2f}s [{}]".format(*timed(mm, a)))
    s = mm.stats()
    print(f"   evictions: {[e['to'] for e in s['evictions']]}, max_resident {s['max_resident']}")
    held = s["ram_tier_bytes"] + sum(r["bytes"] for r in s["resident"])
    grown = rss_bytes() - rss_before
    print(
        f"process memory grew {grown / 2**30:.2f} GiB; the manager accounts for {held / 2**30:.2f} GiB "
        f"(ratio {grown / max(held, 1):.2f})"
    )
    mm.close()

    for prefetch in (False, True):
        mm = ModelManager(ram_budget_bytes=24 * 2**30, prefetch=prefetch)
        drop_page_cache(a_path)
        drop_page_cache(b_path)
        t = time.perf_counter()
        mm.hint_upcoming([a, b])
        with mm.use(a):
            time.sleep(args.compute_s)  # the node computes with A
        mm.hint_upcoming([b])
        with mm.use(b):
            pass
        total = time.perf_counter() - t
        s = mm.stats()
        print(
            f"workflow A({args.compute_s:.0f}s compute)→B, prefetch {'on ' if prefetch else 'off'}: {total:.2f}s "
            f"(sources {[x['source'] for x in s['loads']]}, prefetch hits {s['prefetch_hits']})"
        )
        mm.close()


if __name__ == "__main__":
    main()
