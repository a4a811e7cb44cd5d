"""Benchmark rows, medians, the machine's description, and the table printer."""

from __future__ import annotations

import os
import platform
import resource
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Row:
    scenario: str
    metric: str
    value: float
    unit: str
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    out = fn()
    return time.perf_counter() - started, out


def interleaved(fns: dict[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
    """Median seconds of each function, repeats interleaved so machine load hits all alike."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            times[name].append(timed(fn)[0])
    return {name: median(v) for name, v in times.items()}


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            info = f.read().splitlines()
        cpu = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), cpu)
        flags = set(next((line.split(":", 1)[1].split() for line in info if line.startswith("flags")), []))
    except OSError:
        pass
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    try:
        mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        mem_gib = float("nan")
    return {
        "cpu": cpu,
        "cpu_isa": torch.backends.cpu.get_cpu_capability(),
        "cpu_native_bf16": bool(flags & {"avx512_bf16", "amx_bf16"}),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "memory_gib": round(mem_gib, 1),
        "gpu": gpu,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "load_avg": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }


def format_table(rows: list[Row], info: dict[str, Any], title: str) -> str:
    lines = [title, "machine: " + ", ".join(f"{k}={v}" for k, v in info.items()), ""]
    width = max((len(r.scenario) for r in rows), default=10)
    mwidth = max((len(r.metric) for r in rows), default=10)
    lines.append(f"{'scenario':<{width}}  {'metric':<{mwidth}}  {'value':>12}  unit     note")
    for r in rows:
        lines.append(f"{r.scenario:<{width}}  {r.metric:<{mwidth}}  {r.value:>12.4g}  {r.unit:<7}  {r.note}")
    return "\n".join(lines)


def markdown_table(rows: list[Row]) -> str:
    out = ["| scenario | metric | value | unit | note |", "|---|---|---:|---|---|"]
    out += [f"| {r.scenario} | {r.metric} | {r.value:.4g} | {r.unit} | {r.note} |" for r in rows]
    return "\n".join(out)
