"""``run_bench``: every scenario in turn, one table (or one JSON object), medians over repeats.

Scenarios live in ``nodes/bench/scenarios/``; ``--quick`` uses the demo models at small sizes
(CI runs it in a few minutes), the full run full-size random SD1.5 weights from ``bench_cache/``.
Figures are absolute times on this machine; the ratios (same process, interleaved repeats) are what
to compare across machines.
"""

from __future__ import annotations

import json
import logging
import shutil
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

import torch

from nodes.bench.report import Row, format_table, machine, markdown_table, peak_rss_mib
from nodes.bench.scenarios import executor_overhead, fastpaths, generation, overlap, prefetch, queue, server
from nodes.bench.setup import BenchSetup, prepare

log = logging.getLogger("loom.bench")
Scenario = Callable[[BenchSetup], list[Row]]


def scenarios() -> dict[str, Scenario]:
    return {
        "executor": executor_overhead.run,
        "generation": generation.run,
        "server": server.run,
        "queue": queue.run,
        "prefetch": prefetch.run,
        "fastpaths": fastpaths.run,
        "overlap": overlap.run,
    }


def collect(
    quick: bool, *, only: list[str] | None = None, repeats: int | None = None, progress: TextIO | None = None
) -> dict[str, Any]:
    """Run the scenarios; returns ``{"machine", "mode", "rows", "seconds"}``."""
    torch.set_grad_enabled(False)
    started = time.perf_counter()
    setup = prepare(quick, repeats)
    rows: list[Row] = []
    try:
        for name, scenario in scenarios().items():
            if only and name not in only:
                continue
            t0 = time.perf_counter()
            new = scenario(setup)
            rows += new
            if progress is not None:
                print(
                    f"[bench] {name}: {len(new)} figures in {time.perf_counter() - t0:.1f} s",
                    file=progress,
                    flush=True,
                )
        rows.append(Row("memory", "peak process RSS", peak_rss_mib(), "MiB", "whole benchmark process"))
    finally:
        shutil.rmtree(setup.work, ignore_errors=True)
        if setup.quick:
            shutil.rmtree(setup.models_dir, ignore_errors=True)
    return {
        "machine": machine(),
        "mode": "quick" if quick else "full",
        "repeats": setup.repeats,
        "rows": [r.to_json() for r in rows],
        "seconds": round(time.perf_counter() - started, 1),
    }


def run_bench(
    quick: bool,
    as_json: bool,
    *,
    only: list[str] | None = None,
    repeats: int | None = None,
    out: TextIO | None = None,
    as_markdown: bool = False,
) -> int:
    """Run the benchmark and print a table (or one JSON object, or a Markdown table); 0 on success."""
    out = out or sys.stdout
    report = collect(quick, only=only, repeats=repeats, progress=sys.stderr)
    if as_json:
        print(json.dumps(report), file=out, flush=True)
    elif as_markdown:
        info = ", ".join(f"{k}={v}" for k, v in report["machine"].items())
        print(
            f"Machine: {info}. Mode {report['mode']}, median of {report['repeats']}, {report['seconds']} s.\n",
            file=out,
        )
        print(markdown_table([Row(**r) for r in report["rows"]]), file=out, flush=True)
    else:
        rows = [Row(**r) for r in report["rows"]]
        title = f"Loom benchmark ({report['mode']}, median of {report['repeats']}, {report['seconds']} s)"
        print(format_table(rows, report["machine"], title), file=out, flush=True)
    return 0
