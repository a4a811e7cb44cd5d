"""Next-job model prefetch from the queue: two queued jobs on different checkpoints (A then B) from
a cold model manager, with and without :class:`engine.jobs.coalesce.NextJobPrefetch`. With it, B's
models are read into RAM while A's job computes, so B's job finds them there instead of on disk."""

from __future__ import annotations

from typing import Any

from engine.jobs.coalesce import NextJobPrefetch
from engine.jobs.queue import LocalJobQueue
from engine.jobs.records import JobFinished
from engine.jobs.spec import JobSpec
from engine.jobs.store import JobStore
from nodes.bench.report import Row, median, timed
from nodes.bench.runtime import BenchRuntime, image_difference, txt2img
from nodes.bench.setup import BenchSetup


def _two_jobs(setup: BenchSetup, prefetch: bool, tag: str) -> dict[str, Any]:
    size, steps = setup.queue_size, setup.steps[0]
    rt = BenchRuntime(setup.models_dir, setup.work / f"prefetch_{tag}", prefetch=True)
    queue = LocalJobQueue(
        rt.executor,
        JobStore(setup.work / f"prefetch_{tag}.sqlite"),
        prefetch=NextJobPrefetch(rt.executor) if prefetch else None,
    )
    held_after_a: list[set[str]] = []

    def on_notice(notice: Any) -> None:
        if isinstance(notice, JobFinished) and not held_after_a:
            stats = rt.models.stats()
            held_after_a.append({m["key"] for m in [*stats["resident"], *stats["ram_tier"]]})

    queue.subscribe(on_notice)
    for ckpt in (setup.ckpt_a, setup.ckpt_b):
        queue.submit(JobSpec(prompt=txt2img(ckpt, size=size, steps=steps, seed=7)))
    seconds, records = timed(queue.drain)
    if len(records) != 2 or any(r.status != "succeeded" for r in records):
        raise RuntimeError(f"prefetch benchmark jobs failed: {[r.status for r in records]}")
    b_models = {load["key"] for load in records[1].memory.get("loads", [])}
    out = {
        "seconds": seconds,
        "b_s": records[1].timings["total_s"],
        "b_ready": len(b_models & held_after_a[0]),
        "b_models": len(b_models),
        "image": rt.image_of(records[1]),
    }
    rt.close()
    return out


def run(setup: BenchSetup) -> list[Row]:
    runs: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
    for rep in range(setup.repeats):  # interleaved; each side goes first every other time
        for on in (False, True) if rep % 2 == 0 else (True, False):
            runs[on].append(_two_jobs(setup, on, f"{'on' if on else 'off'}{rep}"))
    off_s, on_s = median([r["seconds"] for r in runs[False]]), median([r["seconds"] for r in runs[True]])
    off_b, on_b = median([r["b_s"] for r in runs[False]]), median([r["b_s"] for r in runs[True]])
    where = f"jobs A then B (two checkpoints), {setup.queue_size}², {setup.steps[0]} steps, cold manager"
    on_last, off_last = runs[True][-1], runs[False][-1]
    return [
        Row("next-job prefetch", "two-job queue, off", off_s, "s", where),
        Row("next-job prefetch", "two-job queue, on", on_s, "s", "on by default in serve and run"),
        Row("next-job prefetch", "queue speed-up", off_s / on_s, "x", ""),
        Row("next-job prefetch", "job B, off", off_b, "s", "its models read from disk while it runs"),
        Row("next-job prefetch", "job B, on", on_b, "s", "its models read while job A ran"),
        Row(
            "next-job prefetch",
            "job B's models in RAM when job A finished, on",
            on_last["b_ready"],
            "models",
            f"of {on_last['b_models']} (off: {off_last['b_ready']})",
        ),
        Row(
            "next-job prefetch",
            "image difference on vs off",
            max(
                image_difference(a["image"], b["image"]) for a, b in zip(runs[False], runs[True], strict=True)
            ),
            "mean |Δ|",
            "must be 0: prefetch only moves a read earlier",
        ),
    ]
