"""Seconds per denoiser call (one sampling step, CFG batch of 2) with 0, 1 or 2 ControlNets and with
one T2I-Adapter, on a full-size SD1.5 UNet with random weights, through Loom's control path
(``UNetDenoiser.forward`` with the bound controls), and the bytes each control model adds.

    python main.py bench controlnet [--size 512] [--repeats 2] [--device cpu|cuda] [--threads N]

The cases run interleaved (each repeat times every case once), in wall and CPU seconds.

Printed, not asserted. Full size on 2 CPU cores: about 6–7 s per UNet call at 512 px (fp32);
absolute times on shared machines vary up to 3×, compare figures from one run.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from nodes.control.controlnet import Control
from nodes.control.controlnet_files import ControlNetHandle
from nodes.control.t2i_adapter import AdapterHandle
from nodes.core.cond import CondEntry
from nodes.core.handles import WeightsSource
from nodes.demo.control import demo_adapter
from nodes.families.components.unet import UNetDenoiser


def _modules(device: str) -> dict[str, Any]:
    from diffusers import (  # lazy: diffusers takes seconds to import; only to build the random modules
        ControlNetModel,
        UNet2DConditionModel,
    )

    torch.manual_seed(0)
    unet: Any = UNet2DConditionModel(cross_attention_dim=768, attention_head_dim=8)  # SD1.5's architecture
    nets = [ControlNetModel.from_unet(unet) for _ in range(2)]
    adapter = demo_adapter((320, 640, 1280, 1280))
    return {
        "unet": unet.eval().to(device),
        "cn": [n.eval().to(device) for n in nets],
        "t2i": adapter.to(device),
    }


def _bytes(module: Any) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def _call(modules: dict[str, Any], handles: list[Any], latent: int, device: str) -> Any:
    image = torch.rand(1, latent * 8, latent * 8, 3)
    control = None
    for handle in handles:
        control = Control(handle, image, 1.0, previous=control)
    mods = {
        h.key: (modules["t2i"] if h.kind == "t2i_adapter" else modules["cn"][i])
        for i, h in enumerate(handles)
    }
    entries = [
        CondEntry(
            embeds=torch.randn(1, 77, 768),
            extras={
                "control_modules": mods,
                "percent_to_sigma": lambda p: 0.0,
                **({"control": control} if control else {}),
            },
        )
        for _ in range(2)
    ]
    den = UNetDenoiser()
    kwargs = den.conditioning(entries, 1, (latent * 8, latent * 8))
    kwargs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    if "control" in kwargs:
        kwargs["control"] = kwargs["control"].at(None)
    x, t = torch.randn(2, 4, latent, latent, device=device), torch.full((2,), 500.0, device=device)

    def run() -> None:
        with torch.no_grad():
            den.forward(modules["unet"], x, t, kwargs)
        if device == "cuda":
            torch.cuda.synchronize()

    return run


def _handles(tmp: Path) -> dict[str, Any]:
    """Handles with distinct keys (the modules are passed in directly, the files only name them)."""

    def src(name: str) -> WeightsSource:
        return WeightsSource(tmp / name, name)

    return {
        "cn1": ControlNetHandle(source=src("a"), nbytes=0, config={}),
        "cn2": ControlNetHandle(source=src("b"), nbytes=0, config={"x": 1}),
        "t2i": AdapterHandle(source=src("c"), nbytes=0, config={"adapter_type": "full_adapter"}),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="main.py bench controlnet", description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads or max(1, torch.get_num_threads()))
    modules = _modules(args.device)
    h = _handles(Path("/nonexistent"))
    print(
        f"SD1.5 UNet {_bytes(modules['unet']) / 2**20:.0f} MiB, ControlNet {_bytes(modules['cn'][0]) / 2**20:.0f} MiB, "
        f"T2I-Adapter {_bytes(modules['t2i']) / 2**20:.0f} MiB (fp32)"
    )
    cases = {
        "no control": [],
        "1 ControlNet": [h["cn1"]],
        "2 ControlNets": [h["cn1"], h["cn2"]],
        "1 T2I-Adapter": [h["t2i"]],
    }
    runs = {label: _call(modules, handles, args.size // 8, args.device) for label, handles in cases.items()}
    for run in runs.values():
        run()  # warm-up
    wall: dict[str, list[float]] = {label: [] for label in runs}
    cpu: dict[str, list[float]] = {label: [] for label in runs}
    for _ in range(args.repeats):  # interleaved: a slower stretch of the machine hits every case alike
        for label, run in runs.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            run()
            wall[label].append(time.perf_counter() - start)
            cpu[label].append(time.process_time() - start_cpu)
    base = statistics.median(cpu["no control"])
    for label in runs:
        median_cpu = statistics.median(cpu[label])
        print(
            f"{label:>14}: {statistics.median(wall[label]):.3f} s per step ({median_cpu:.3f} CPU s, "
            f"{median_cpu / base:.2f}× no control) at {args.size}² (batch 2, {args.device}, "
            f"{torch.get_num_threads()} threads)"
        )


if __name__ == "__main__":
    main()
