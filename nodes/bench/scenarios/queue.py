"""Throughput of queued jobs with and without request coalescing, and next-job prefetch."""

from __future__ import annotations

from engine.jobs.coalesce import CoalesceConfig, Coalescer
from engine.jobs.queue import LocalJobQueue
from engine.jobs.spec import JobSpec
from engine.jobs.store import JobStore
from nodes.bench.report import Row, timed
from nodes.bench.runtime import BenchRuntime, image_difference, txt2img
from nodes.bench.setup import BenchSetup

JOBS = 8


def _queue_run(setup: BenchSetup, coalesce: bool, tag: str, steps: int) -> tuple[float, list]:
    rt = BenchRuntime(setup.models_dir, setup.work / f"queue_{tag}")
    rt.run(
        txt2img(setup.ckpt_a, size=setup.queue_size, steps=1, seed=999)
    )  # warm: models loaded, like a server
    coalescer = Coalescer(rt.executor, CoalesceConfig(window_s=0.05, max_batch=JOBS)) if coalesce else None
    queue = LocalJobQueue(rt.executor, JobStore(setup.work / f"queue_{tag}.sqlite"), coalescer=coalescer)
    for i in range(JOBS):
        queue.submit(
            JobSpec(
                prompt=txt2img(
                    setup.ckpt_a,
                    size=setup.queue_size,
                    steps=steps,
                    seed=i,
                    text=f"a lighthouse, variant {i % 4}",
                )
            )
        )
    seconds, records = timed(queue.drain)
    images = [rt.image_of(r) for r in records]
    rt.close()
    return seconds, images


def run(setup: BenchSetup) -> list[Row]:
    steps = setup.steps[0]
    plain_s, plain = _queue_run(setup, False, "plain", steps)
    fast_s, fast = _queue_run(setup, True, "coalesced", steps)
    diff = max(image_difference(a, b) for a, b in zip(plain, fast, strict=True))
    where = f"{JOBS} jobs, {setup.queue_size}², {steps} steps"
    return [
        Row("queue", "jobs/s one by one", JOBS / plain_s, "jobs/s", where),
        Row("queue", "jobs/s coalesced", JOBS / fast_s, "jobs/s", where),
        Row("queue", "coalescing throughput ratio", plain_s / fast_s, "x", "target >= 1.3"),
        Row("queue", "coalesced vs alone image diff", diff, "mean |Δ|", "0..1 pixels; float noise only"),
    ]
