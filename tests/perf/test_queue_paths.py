"""Queue fast paths: request coalescing (each job's image equal to running it alone, chunking,
the companion window) and next-job model prefetch (same images, models read during the job before)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

import engine.jobs as jobs_module
from engine.coalesce import CoalesceConfig, Coalescer, NextJobPrefetch
from engine.jobs import JobSpec, LocalJobQueue
from engine.jobstore import JobStore
from nodes.bench.runtime import BenchRuntime, txt2img
from tests.perf.conftest import CKPT, CKPT_B


def _saved(rt: BenchRuntime, record: Any) -> np.ndarray:
    info = record.outputs["9"]["images"][0]
    with Image.open(rt.folders.output_dir / info["filename"]) as im:
        return np.asarray(im.convert("RGB"), dtype=np.float32) / 255.0


def test_coalesced_jobs_equal_running_alone_and_chunk(perf_models: Path, tmp_path: Path) -> None:
    rt = BenchRuntime(perf_models, tmp_path / "q")
    coalescer = Coalescer(rt.executor, CoalesceConfig(window_s=0.0, max_batch=3))
    queue = LocalJobQueue(rt.executor, JobStore(tmp_path / "q.sqlite"), coalescer=coalescer)
    jobs = [
        dict(seed=10 + i, text=f"prompt {i % 2}", sampler="euler_ancestral" if i < 0 else "euler")
        for i in range(4)
    ]
    for job in jobs:
        queue.submit(JobSpec(prompt=txt2img(CKPT, steps=3, **job)))
    records = queue.drain()
    assert [r.status for r in records] == ["succeeded"] * 4
    assert coalescer.groups_run == 1 and coalescer.jobs_coalesced == 3  # chunks of 3 and a lone 1
    assert all("3" in r.cached for r in records[:3]) and "3" in records[3].executed
    alone = BenchRuntime(perf_models, tmp_path / "alone")
    for job, record in zip(jobs, records, strict=True):
        expected = alone.image(alone.run(txt2img(CKPT, steps=3, **job)))
        assert np.abs(_saved(rt, record) - expected).max() <= 2 / 255
    rt.close()
    alone.close()


def test_coalescing_ancestral_sampler_and_other_settings_do_not_group(
    perf_models: Path, tmp_path: Path
) -> None:
    rt = BenchRuntime(perf_models, tmp_path / "q")
    coalescer = Coalescer(rt.executor, CoalesceConfig(window_s=0.0))
    queue = LocalJobQueue(rt.executor, JobStore(tmp_path / "q.sqlite"), coalescer=coalescer)
    prompts = [txt2img(CKPT, steps=2, seed=s, sampler="euler_ancestral") for s in (1, 2)]
    prompts.append(txt2img(CKPT, steps=3, seed=3, sampler="euler_ancestral"))  # other steps: own group
    for prompt in prompts:
        queue.submit(JobSpec(prompt=prompt))
    records = queue.drain()
    assert coalescer.jobs_coalesced == 2
    alone = BenchRuntime(perf_models, tmp_path / "alone")
    for prompt, record in zip(prompts, records, strict=True):
        assert np.abs(_saved(rt, record) - alone.image(alone.run(prompt))).max() <= 2 / 255
    rt.close()
    alone.close()


class VirtualClock:
    """Stands in for the ``time`` module inside ``engine.jobs``: sleeping advances a virtual clock
    instantly, so waits are measured exactly and no test depends on the machine's speed."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept = 0.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.slept += seconds


def test_lone_job_waits_at_most_the_window(perf_models: Path, tmp_path: Path, monkeypatch: Any) -> None:
    rt = BenchRuntime(perf_models, tmp_path / "q")
    queue = LocalJobQueue(
        rt.executor,
        JobStore(tmp_path / "q.sqlite"),
        coalescer=Coalescer(rt.executor, CoalesceConfig(window_s=0.2)),
    )
    spec = JobSpec(prompt=txt2img(CKPT))
    clock = VirtualClock()
    monkeypatch.setattr(jobs_module, "time", clock)
    assert queue._companions(spec, wait=True) == []
    assert clock.slept == pytest.approx(0.2)  # the whole window, and no more
    clock.slept = 0.0
    assert queue._companions(spec, wait=False) == []
    assert clock.slept == 0.0  # not waiting means not waiting
    monkeypatch.undo()
    rt.close()


def test_cached_job_does_not_wait_for_companions(perf_models: Path, tmp_path: Path, monkeypatch: Any) -> None:
    """An identical resubmit has nothing left to batch: it must not sit out the window."""
    rt = BenchRuntime(perf_models, tmp_path / "q")
    queue = LocalJobQueue(
        rt.executor,
        JobStore(tmp_path / "q.sqlite"),
        coalescer=Coalescer(rt.executor, CoalesceConfig(window_s=0.5)),
    )
    spec = JobSpec(prompt=txt2img(CKPT, seed=5))
    assert queue.coalescer is not None and queue.coalescer.has_work(spec)
    rt.run(spec.prompt)
    assert not queue.coalescer.has_work(JobSpec(prompt=txt2img(CKPT, seed=5)))
    assert queue.coalescer.has_work(JobSpec(prompt=txt2img(CKPT, seed=6)))  # a new seed still waits
    clock = VirtualClock()
    monkeypatch.setattr(jobs_module, "time", clock)
    assert queue._companions(JobSpec(prompt=txt2img(CKPT, seed=5)), wait=True) == []
    assert clock.slept == 0.0
    monkeypatch.undo()
    rt.close()


def _known_models(rt: BenchRuntime) -> set[str]:
    deadline = time.monotonic() + 10
    while rt.models._pending and time.monotonic() < deadline:  # let a background read finish
        time.sleep(0.02)
    stats = rt.models.stats()
    return {m["key"] for m in [*stats["resident"], *stats["ram_tier"]]}


def test_next_job_models_are_prefetched_and_images_unchanged(perf_models: Path, tmp_path: Path) -> None:
    from engine.jobs import JobFinished

    images = {}
    for mode in ("plain", "prefetch"):
        rt = BenchRuntime(perf_models, tmp_path / mode, prefetch=True)
        prefetch = NextJobPrefetch(rt.executor) if mode == "prefetch" else None
        queue = LocalJobQueue(rt.executor, JobStore(tmp_path / f"{mode}.sqlite"), prefetch=prefetch)
        seen_after_a: list[set[str]] = []

        def on_notice(notice: Any, rt: BenchRuntime = rt, seen: list[set[str]] = seen_after_a) -> None:
            if isinstance(notice, JobFinished) and not seen:
                seen.append(_known_models(rt))

        queue.subscribe(on_notice)
        for ckpt in (CKPT, CKPT_B):
            queue.submit(JobSpec(prompt=txt2img(ckpt, steps=2, seed=4)))
        records = queue.drain()
        images[mode] = [_saved(rt, r) for r in records]
        b_models = {load["key"] for load in records[1].memory["loads"]}
        assert len(b_models) == 3 and all("_b.safetensors" in k for k in b_models)
        # with the hook, B's models were read into RAM while A's job ran; without it, none were
        expected = b_models if mode == "prefetch" else set()
        assert b_models & seen_after_a[0] == expected
        rt.close()
    for a, b in zip(images["plain"], images["prefetch"], strict=True):
        assert np.array_equal(a, b)


def _advanced(seed: int, text: str) -> dict[str, Any]:
    """txt2img through two KSamplerAdvanced stages (ComfyUI's base → refiner split: 0..2 with
    leftover noise, then 2..4 without adding noise)."""
    prompt = txt2img(CKPT, steps=4, seed=seed, text=text)
    common = {
        "model": ["4", 0],
        "steps": 4,
        "cfg": 7.0,
        "sampler_name": "euler",
        "scheduler": "normal",
        "positive": ["6", 0],
        "negative": ["7", 0],
    }
    prompt["3"] = {
        "class_type": "KSamplerAdvanced",
        "inputs": {
            **common,
            "add_noise": "enable",
            "noise_seed": seed,
            "latent_image": ["5", 0],
            "start_at_step": 0,
            "end_at_step": 2,
            "return_with_leftover_noise": "enable",
        },
    }
    prompt["10"] = {
        "class_type": "KSamplerAdvanced",
        "inputs": {
            **common,
            "add_noise": "disable",
            "noise_seed": 0,
            "latent_image": ["3", 0],
            "start_at_step": 2,
            "end_at_step": 10000,
            "return_with_leftover_noise": "disable",
        },
    }
    prompt["8"]["inputs"]["samples"] = ["10", 0]
    return prompt


def test_ksampler_advanced_jobs_coalesce_and_equal_running_alone(perf_models: Path, tmp_path: Path) -> None:
    rt = BenchRuntime(perf_models, tmp_path / "q")
    coalescer = Coalescer(rt.executor, CoalesceConfig(window_s=0.0))
    queue = LocalJobQueue(rt.executor, JobStore(tmp_path / "q.sqlite"), coalescer=coalescer)
    prompts = [_advanced(20 + i, f"advanced {i}") for i in range(3)]
    for prompt in prompts:
        queue.submit(JobSpec(prompt=prompt))
    records = queue.drain()
    assert [r.status for r in records] == ["succeeded"] * 3
    assert coalescer.groups_run == 1 and coalescer.jobs_coalesced == 3
    # both stages ran batched: each job finds its second stage in the cache and needs nothing before it
    assert all("10" in r.cached and r.executed == ["8", "9"] for r in records)
    alone = BenchRuntime(perf_models, tmp_path / "alone")
    images = [alone.image(alone.run(prompt)) for prompt in prompts]
    for image, record in zip(images, records, strict=True):
        assert np.abs(_saved(rt, record) - image).max() <= 2 / 255
    assert np.abs(images[0] - images[1]).mean() > 0.01  # the seeds (and prompts) really differ
    rt.close()
    alone.close()


def test_every_coalesced_job_reports_its_own_sampler_progress(perf_models: Path, tmp_path: Path) -> None:
    """Jobs batched into one sampler call each see progress under their own prompt id (a client
    waiting on the second job watches its bar move while the batch samples), and a queued job's
    view carries that progress; preview frames stay with the first job (the batch's first item)."""
    from engine import events as ev
    from engine.jobs import JobEvent

    rt = BenchRuntime(perf_models, tmp_path / "q")
    queue = LocalJobQueue(
        rt.executor,
        JobStore(tmp_path / "q.sqlite"),
        coalescer=Coalescer(rt.executor, CoalesceConfig(window_s=0.0)),
    )
    specs = [queue.submit(JobSpec(prompt=txt2img(CKPT, steps=3, seed=20 + i))) for i in range(3)]
    progress: dict[str, list[int]] = {s.prompt_id: [] for s in specs}
    views: list[Any] = []

    def on_notice(notice: Any) -> None:
        if isinstance(notice, JobEvent) and isinstance(notice.event, ev.Progress):
            assert notice.event.prompt_id == notice.spec.prompt_id
            progress[notice.spec.prompt_id].append(notice.event.value)
            if notice.spec.prompt_id == specs[2].prompt_id:
                views.append(queue.get(specs[2].prompt_id))

    queue.subscribe(on_notice)
    records = queue.drain()
    assert [r.status for r in records] == ["succeeded"] * 3
    assert all("3" in r.cached for r in records[1:])  # their samplers ran in the head's batch
    for spec in specs:
        assert progress[spec.prompt_id] == [1, 2, 3], spec.prompt_id
    assert views and views[-1].status == "queued" and views[-1].progress is not None
    assert (views[-1].progress.value, views[-1].progress.max) == (3, 3)
    rt.close()
