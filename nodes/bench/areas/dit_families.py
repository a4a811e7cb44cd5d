"""Per-family transformer figures, Loom vs diffusers on the same random weights: load time,
seconds per step and peak memory, for Z-Image Turbo, SD3.5 medium and Flux schnell (fp8).

    python main.py bench dit_families                      # tiny configs (checks the code, seconds)
    LOOM_BENCH_FULL=1 python main.py bench dit_families    # the real configs (needs the RAM)
    python main.py bench dit_families --full --family sd35_medium --size 256 --steps 3 --workdir /tmp/w
    python main.py bench dit_families --full --family zimage --fp8   # Z-Image in 6 GB instead of 12

Full size needs about the file's size in RAM per child (SD3.5 medium bf16 4.6 GiB, Z-Image 11.5 GiB
in bf16 or 5.7 GiB in fp8, Flux schnell fp8 11.1 GiB); the writer streams one tensor at a time
(``fullsize.py``), so the parent stays small. Defaults at full size: 256², 4 steps, 1 thread.

The transformer is built on the meta device from the family's real config (or a tiny one), given
seeded random weights tensor by tensor in the file dtype (bf16; fp8 e4m3 for Flux schnell), and
written twice: in the original single-file layout Loom's UNETLoader reads (through Loom's key
map) and as a diffusers folder (``config.json`` + ``diffusion_pytorch_model.safetensors``). Each
side then runs in its own child process, so its peak RSS is its own:

- Loom: ``load_diffusion_model`` (with UNETLoader's ``weight_dtype``) and the first model use
  (load time), then KSampler (euler, simple) from an empty latent with random conditioning of
  the family's width (text encoders are not part of the figure); s/step = sampler time / steps.
- diffusers: ``from_pretrained`` of the folder (for fp8: stored in fp8 with
  diffusers' layerwise casting computing in bf16, its own fp8 path), then the transformer
  called once per step with the inputs its pipeline would give it (a batch of two with CFG).

Then the step caches (EasyCache at 0.2 and 0.5, FirstBlockCache at 0.3 and 0.8) run the same
sampling on the Loom side: speed-up in CPU time against no cache and the difference of the final
latent (relative mean |Δ|) and of its decode through the demo's 16-channel VAE (0-255 levels).

Printed, never asserted; absolute times on shared machines vary up to 3×, compare the ratios. Each
time is given as wall seconds and as CPU seconds of the process (with one thread the CPU time is
what the work costs, whatever else runs on the machine).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from nodes.bench.dit_family_runs import FAMILIES, child, write_weights
from nodes.bench.fullsize_weights import meta_module, rss_gib
from nodes.bench.page_cache import drop_page_cache

ROOT = Path(__file__).resolve().parents[3]  # the repository


def child_env() -> dict[str, str]:
    """A child side (``-m nodes.bench.areas.dit_families --child``): this checkout first, offline."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path, "HF_HUB_OFFLINE": "1"}


# --- the parent -------------------------------------------------------------------------------
def measure(args: argparse.Namespace, name: str, folder: Path) -> list[str]:
    fp8 = args.fp8 or FAMILIES[name].file_dtype == torch.float8_e4m3fn
    start = time.perf_counter()
    folder = folder / ("fp8" if fp8 else "bf16") / ("full" if args.full else "tiny")
    single, diffusers_dir = folder / f"{name}.safetensors", folder / f"{name}_diffusers"
    if not single.exists():  # a --workdir keeps the files of an earlier run
        write_weights(name, args.full, folder, torch.float8_e4m3fn if fp8 else torch.bfloat16)
    written = time.perf_counter() - start
    writer_rss = rss_gib()
    results = {}
    files = [single, *diffusers_dir.glob("*.safetensors")]
    for side in ("loom", "diffusers"):
        os.sync()  # just-written pages are dirty, and the kernel drops only clean ones
        cold = all([drop_page_cache(f) for f in files])  # each side reads the weights from disk
        cmd = [
            sys.executable,
            "-m",
            "nodes.bench.areas.dit_families",
            "--child",
            side,
            "--family",
            name,
            "--size",
            str(args.size),
        ]
        cmd += ["--steps", str(args.steps), "--threads", str(args.threads), "--single", str(single)]
        cmd += ["--diffusers-dir", str(diffusers_dir)]
        cmd += [
            flag
            for flag, on in (("--full", args.full), ("--fp8", fp8), ("--no-caches", not args.caches))
            if on
        ]
        done = subprocess.run(
            cmd, capture_output=True, text=True, check=False, env={**os.environ, **child_env()}
        )
        if done.returncode != 0:
            raise RuntimeError(f"{side} child for {name} failed:\n{done.stderr[-4000:]}")
        results[side] = json.loads(done.stdout.strip().splitlines()[-1])
        results[side]["cold"] = cold
    loom, ref = results["loom"], results["diffusers"]
    count = sum(v.numel() for v in _meta(name, args.full).parameters())
    params = f"{count / 1e9:.2f} B" if count > 1e8 else f"{count / 1e6:.2f} M"
    title = (
        f"{name} ({'full' if args.full else 'tiny'} config, {params} parameters, "
        f"{'fp8 e4m3fn' if fp8 else 'bf16'} weights, bf16 compute, {args.size}², {args.steps} steps, "
        f"cfg {FAMILIES[name].cfg}, {args.threads} threads)"
    )
    lines = [
        title,
        f"  load from {'disk (page cache dropped before each side)' if loom['cold'] and ref['cold'] else 'the page cache'}",
        f"  weights written in {written:.1f} s ({single.stat().st_size / 2**30:.2f} GiB file; writer RSS "
        f"{writer_rss:.2f} GiB)",
        *(
            f"  {label:<14} Loom {loom[key]:.4g}  diffusers {ref[key]:.4g}  ratio {loom[key] / ref[key]:.3f}"
            for label, key in (
                ("load s", "load_s"),
                ("load+1 step s", "first_step_s"),
                ("s/step", "s_per_step"),
                ("CPU s/step", "cpu_s_per_step"),
                ("peak RSS GiB", "peak_rss_gib"),
            )
        ),
    ]
    for key, value in loom.items():
        if ": speed-up" in key:
            label = key.removesuffix(": speed-up")
            lines.append(
                f"  {label:<20} speed-up {value:.2f}× (CPU time), latent Δ {loom[label + ': latent Δ']:.3g} (relative), "
                f"image Δ {loom[label + ': image Δ']:.2f} of 255 (demo VAE)"
            )
    return lines


def _meta(name: str, full: bool) -> Any:
    import diffusers  # lazy: diffusers takes seconds to import; only its class lays out the weights

    spec = FAMILIES[name]
    return meta_module(getattr(diffusers, spec.diffusers_class), spec.full if full else spec.tiny)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="main.py bench dit_families", description=__doc__.splitlines()[0])
    parser.add_argument("--family", default="all", choices=["all", *FAMILIES])
    parser.add_argument(
        "--full",
        action="store_true",
        default=os.environ.get("LOOM_BENCH_FULL") == "1",
        help="the real configs (also LOOM_BENCH_FULL=1)",
    )
    parser.add_argument("--size", type=int, default=None, help="image side in pixels (256 full, 64 tiny)")
    parser.add_argument("--steps", type=int, default=None, help="steps (4 full, 2 tiny)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default 1)")
    parser.add_argument("--fp8", action="store_true", help="store every family's weights as fp8 e4m3fn")
    parser.add_argument("--no-caches", dest="caches", action="store_false", help="skip the step-cache runs")
    parser.add_argument("--workdir", default="", help="keep the written weights here (reused when present)")
    parser.add_argument("--child", choices=["loom", "diffusers"], default=None, help=argparse.SUPPRESS)
    parser.add_argument("--single", help=argparse.SUPPRESS)
    parser.add_argument("--diffusers-dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.size = args.size or (256 if args.full else 64)
    args.steps = args.steps or (4 if args.full else 2)
    args.threads = args.threads or 1
    if args.child:
        args.side = args.child
        child(args)
        return
    torch.set_num_threads(args.threads)
    names = list(FAMILIES) if args.family == "all" else [args.family]
    for name in names:
        if args.workdir:
            print("\n".join(measure(args, name, Path(args.workdir) / name)), flush=True)
            continue
        with tempfile.TemporaryDirectory(prefix="loom_bench_dit_") as tmp:  # one family's files at a time
            print("\n".join(measure(args, name, Path(tmp) / name)), flush=True)


if __name__ == "__main__":
    main()
