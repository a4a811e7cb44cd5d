"""Memory budget and plan-aware overlap (engine/memory/ram_budget.py, engine/jobs/overlap.py).

*A→B→A*: three queued jobs on checkpoints A, B, A through the default queue prefetch
(:class:`engine.jobs.overlap.PlanAwarePrefetch`): the process's peak RSS above where it started (sampled
every few milliseconds), each job's time and model-read seconds, and where job 3's models came
from: going back to A should cost less than A's first, cold read.

*Cold first image*: one job on a fresh model manager, models read one after the other when a node
needs them (no prefetch, no overlap) against the plan-aware overlap (the denoiser read while the
prompts encode, the VAE read in the last steps), after one untimed warm-up job. Repeats
interleave; medians.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from engine.jobs.overlap import PlanAwarePrefetch
from engine.jobs.queue import LocalJobQueue
from engine.jobs.spec import JobSpec
from engine.jobs.store import JobStore
from nodes.bench.report import Row, median, timed
from nodes.bench.runtime import BenchRuntime, image_difference, txt2img
from nodes.bench.setup import BenchSetup


def _rss() -> int:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


@contextmanager
def _peak_rss(into: dict[str, int]) -> Iterator[None]:
    """Samples RSS every 5 ms while inside; ``into`` gets ``start`` and ``peak`` (bytes)."""
    stop = threading.Event()
    into["start"] = into["peak"] = _rss()

    def sample() -> None:
        while not stop.wait(0.005):
            into["peak"] = max(into["peak"], _rss())

    thread = threading.Thread(target=sample, name="bench-rss", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        into["peak"] = max(into["peak"], _rss())


def _queue(rt: BenchRuntime, setup: BenchSetup, tag: str, overlap: bool) -> Any:
    return LocalJobQueue(
        rt.executor,
        JobStore(setup.work / f"overlap_{tag}.sqlite"),
        prefetch=PlanAwarePrefetch(rt.executor) if overlap else None,
    )


def _read_seconds(record: Any, source: str | None = None) -> float:
    return sum(
        x["seconds"] for x in record.memory.get("loads", []) if source is None or x["source"] == source
    )


def _swap(setup: BenchSetup, rep: int) -> dict[str, Any]:
    size, steps = setup.queue_size, setup.steps[0]
    rt = BenchRuntime(setup.models_dir, setup.work / f"swap{rep}", prefetch=True)
    queue = _queue(rt, setup, f"swap{rep}", overlap=True)
    for i, ckpt in enumerate((setup.ckpt_a, setup.ckpt_b, setup.ckpt_a)):
        queue.submit(JobSpec(prompt=txt2img(ckpt, size=size, steps=steps, seed=5, text=f"a house, take {i}")))
    rss: dict[str, int] = {}
    with _peak_rss(rss):
        records = queue.drain()
    if len(records) != 3 or any(r.status != "succeeded" for r in records):
        raise RuntimeError(f"A→B→A benchmark jobs failed: {[r.status for r in records]}")
    out = {
        "peak_mib": (rss["peak"] - rss["start"]) / 2**20,
        "jobs": [r.timings["total_s"] for r in records],
        "reads": [_read_seconds(r) for r in records],
        "back_sources": sorted({x["source"] for x in records[2].memory.get("loads", [])}),
        "tier_mib": max(r.memory.get("max_ram_tier_bytes", 0) for r in records) / 2**20,
    }
    rt.close()
    return out


def _cold(setup: BenchSetup, overlap: bool, tag: str) -> dict[str, Any]:
    rt = BenchRuntime(setup.models_dir, setup.work / f"cold_{tag}", prefetch=overlap)
    queue = _queue(rt, setup, f"cold_{tag}", overlap)
    queue.submit(JobSpec(prompt=txt2img(setup.ckpt_a, size=setup.queue_size, steps=setup.steps[0], seed=9)))
    seconds, records = timed(queue.drain)
    if len(records) != 1 or records[0].status != "succeeded":
        raise RuntimeError(f"cold-image benchmark job failed: {[r.status for r in records]}")
    out = {"seconds": seconds, "image": rt.image_of(records[0])}
    rt.close()
    return out


def run(setup: BenchSetup) -> list[Row]:
    swaps = [_swap(setup, rep) for rep in range(setup.repeats)]
    cold: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
    _cold(setup, False, "warmup")  # first-use costs (tokenizer files, kernels) are nobody's figure
    for rep in range(setup.repeats):  # interleaved; each side goes first every other time
        for on in (False, True) if rep % 2 == 0 else (True, False):
            cold[on].append(_cold(setup, on, f"{'on' if on else 'off'}{rep}"))
    where = f"{setup.queue_size}², {setup.steps[0]} steps, demo checkpoints A, B, A in one queue"
    job = [median([s["jobs"][i] for s in swaps]) for i in range(3)]
    read = [median([s["reads"][i] for s in swaps]) for i in range(3)]
    off_s, on_s = median([c["seconds"] for c in cold[False]]), median([c["seconds"] for c in cold[True]])
    return [
        Row(
            "memory budget",
            "A→B→A peak RSS above start",
            median([s["peak_mib"] for s in swaps]),
            "MiB",
            where,
        ),
        Row(
            "memory budget",
            "A→B→A largest RAM tier",
            median([s["tier_mib"] for s in swaps]),
            "MiB",
            "text encoders dropped once the queue's prompts are encoded",
        ),
        Row("memory budget", "job A (cold)", job[0], "s", f"model reads {read[0]:.3f} s"),
        Row("memory budget", "job B (swap)", job[1], "s", f"model reads {read[1]:.3f} s"),
        Row(
            "memory budget",
            "job A again",
            job[2],
            "s",
            f"model reads {read[2]:.3f} s from {'/'.join(swaps[-1]['back_sources']) or 'nothing: all resident'}",
        ),
        Row(
            "memory budget",
            "going back to A vs A's cold read",
            read[2] / read[0] if read[0] else float("nan"),
            "x",
            "below 1: the way back is cheaper than a full reload",
        ),
        Row("plan-aware overlap", "cold first image, reads one after the other", off_s, "s", "no prefetch"),
        Row("plan-aware overlap", "cold first image, overlapped", on_s, "s", "denoiser read while encoding"),
        Row("plan-aware overlap", "cold first image speed-up", off_s / on_s, "x", ""),
        Row(
            "plan-aware overlap",
            "image difference on vs off",
            max(
                image_difference(a["image"], b["image"]) for a, b in zip(cold[False], cold[True], strict=True)
            ),
            "mean |Δ|",
            "must be 0: overlap only moves reads earlier",
        ),
    ]
