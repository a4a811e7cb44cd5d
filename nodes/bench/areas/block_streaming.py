"""Block streaming throughput: one Flux transformer (random weights, built from a config) sampled
resident and under device budgets of 50% and 25% of its weights. Not a test: prints figures (no
timed assertions).

    python main.py bench block_streaming [--size tiny|small|medium] [--steps 4] [--threads 2] [--device cpu|cuda]

Every row goes through Loom's real path: ``ModelManager.use`` with ``device_budget`` set, the
denoiser handle's declared block stack, ``nodes.core.module_streaming``'s hooks. On the CPU the "device" is
simulated (plain copies, accounted); on CUDA the copies go over PCIe on a side stream. Per row:
the plan (blocks resident / streamed, prefetch), the most weight bytes on the device, the bytes
streamed per step, seconds per step (minimum and median over every step of every repeat, rows
interleaved per repeat) and whether the latent equals the resident one bit for bit.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from engine.memory.device_budget import BudgetError, DeviceBudget
from engine.memory.device_policy import DevicePolicy
from engine.memory.manager import ModelManager
from nodes.bench.areas.quant import SIZES, build, sample
from nodes.core.module_streaming import device_bytes
from nodes.load.handles import open_diffusion_model

ROOT = Path(__file__).resolve().parents[3]  # the repository


FRACTIONS = (1.0, 0.5, 0.25)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="main.py bench block_streaming", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    dtype = "float32" if args.device == "cpu" else "bfloat16"
    policy = DevicePolicy(device=args.device, default_dtype=dtype)
    with tempfile.TemporaryDirectory() as tmp:
        path, _ = build(args.size, Path(tmp))
        handle = open_diffusion_model(path)
        whole = device_bytes(handle.load(), getattr(torch, dtype))
        managers: dict[float, ModelManager] = {}
        for fraction in FRACTIONS:
            manager = ModelManager(policy, ram_budget_bytes=4 * whole, prefetch=False)
            manager.device_budget = DeviceBudget(int(whole * fraction), simulated=args.device == "cpu")
            managers[fraction] = manager
        times: dict[float, list[float]] = {f: [] for f in FRACTIONS}
        latents: dict[float, Any] = {}
        plans: dict[float, dict[str, Any]] = {}
        failed: dict[float, str] = {}
        for _ in range(args.repeats):
            for fraction, manager in managers.items():
                if fraction in failed:
                    continue
                try:
                    with manager.use(handle) as module:
                        latents[fraction], timed = sample(module, args.size, args.steps)
                        step_times = [wall for wall, _cpu in timed]  # sample gives (wall, CPU) seconds
                        state = manager.streaming_of(handle)
                        plans[fraction] = state.describe() if state is not None else {}
                except BudgetError as exc:
                    failed[fraction] = str(exc)
                    continue
                times[fraction] += step_times
                manager.free()  # one model on the device at a time, as the manager keeps it
                print(
                    f"  {fraction:.0%}: {statistics.median(step_times):.3f} s/step",
                    file=sys.stderr,
                    flush=True,
                )
        for manager in managers.values():
            manager.close()
    print(
        f"Flux transformer '{args.size}': {whole / 2**20:.1f} MiB of {dtype} weights, {args.steps} steps, "
        f"{args.threads} threads, {args.device}, torch {torch.__version__}"
    )
    print(
        f"{'budget':>7}{'resident':>9}{'streamed':>9}{'prefetch':>9}{'peak MiB':>10}{'MiB/step':>9}"
        f"{'s/step min':>11}{'median':>9}{'vs 100%':>9}{'identical':>10}"
    )
    base = min(times[1.0]) if times[1.0] else float("nan")
    for fraction in FRACTIONS:
        if fraction in failed:
            print(f"{fraction:>7.0%}  does not fit: {failed[fraction]}")
            continue
        plan, step = plans[fraction], min(times[fraction])
        resident = plan.get("resident", "all")
        per_step = plan.get("bytes_streamed", 0) / args.steps / 2**20  # the last repeat's residency
        same = bool(torch.equal(latents[fraction], latents[1.0]))
        print(
            f"{fraction:>7.0%}{resident:>9}{plan.get('streamed', 0):>9}{str(plan.get('prefetch', '-')):>9}"
            f"{plan.get('peak_bytes', whole) / 2**20:>10.1f}{per_step:>9.1f}{step:>11.4f}"
            f"{statistics.median(times[fraction]):>9.4f}{base / step:>8.2f}×{str(same):>10}"
        )


if __name__ == "__main__":
    main()
