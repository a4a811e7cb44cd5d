"""Plan-aware overlap (engine/overlap.py), checked on the order of the memory manager's events,
never on durations: the queue's prompts are encoded in one text-encoder residency, the denoiser
read is scheduled while the encoder runs, the VAE read starts in the last steps, images unchanged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from engine.jobs import JobSpec, LocalJobQueue
from engine.jobstore import JobStore
from engine.overlap import PlanAwarePrefetch
from nodes.bench.runtime import BenchRuntime, txt2img
from tests.perf.conftest import CKPT, CKPT_B

JOBS = [(CKPT, "a red door"), (CKPT, "a blue door"), (CKPT_B, "a green door")]


def _drain(
    perf_models: Path, work: Path, overlap: bool
) -> tuple[list[Any], BenchRuntime, list[tuple[str, str, str]]]:
    rt = BenchRuntime(perf_models, work, prefetch=True)
    log: list[tuple[str, str, str]] = []
    rt.models.event_log = log
    queue = LocalJobQueue(
        rt.executor,
        JobStore(work / "jobs.sqlite"),
        prefetch=PlanAwarePrefetch(rt.executor) if overlap else None,
    )
    for ckpt, text in JOBS:
        queue.submit(JobSpec(prompt=txt2img(ckpt, steps=4, seed=3, text=text)))
    records = queue.drain()
    assert [r.status for r in records] == ["succeeded"] * 3
    return records, rt, log


def _at(log: list[tuple[str, str, str]], what: str, kind: str, name: str = "", last: bool = False) -> int:
    found = [i for i, (w, k, key) in enumerate(log) if w == what and k == kind and name in key]
    assert found, f"no {what} {kind} {name} in {log}"
    return found[-1] if last else found[0]


def test_queue_prompts_encoded_in_one_residency_then_encoders_dropped(
    perf_models: Path, tmp_path: Path
) -> None:
    records, rt, log = _drain(perf_models, tmp_path / "on", overlap=True)
    try:
        clip_reads = [key for what, kind, key in log if what == "read" and kind == "clip"]
        assert len(clip_reads) == 2 == len(set(clip_reads))  # each checkpoint's encoder read once
        # all six prompts (three jobs) encoded before the first sampler step
        assert _at(log, "release", "clip", last=True) < _at(log, "use", "unet")
        # the encoders went back to disk then, and no job read them again
        for key in set(clip_reads):
            assert any(e == ("drop", "clip", key) for e in log)
        assert not any(load["kind"] == "clip" for r in records[1:] for load in r.memory["loads"])
    finally:
        rt.close()


def test_denoiser_read_while_encoding_and_vae_read_in_the_last_steps(
    perf_models: Path, tmp_path: Path
) -> None:
    records, rt, log = _drain(perf_models, tmp_path / "on", overlap=True)
    try:
        first_unet = log[_at(log, "use", "unet")][2]
        # the denoiser's background read was scheduled before the text encoder's last use ended
        assert _at(log, "prefetch", "unet", first_unet) < _at(log, "release", "clip", last=True)
        # the VAE read waited for the sampler's last two of four steps
        vae_read = _at(log, "prefetch", "vae", CKPT.removesuffix(".safetensors"))
        assert _at(log, "use", "unet") < _at(log, "progress", "") < vae_read
        assert log.index(("progress", "", "2/4")) < vae_read < _at(log, "release", "unet")
        assert ("progress", "", "1/4") in log[:vae_read]
    finally:
        rt.close()


def test_overlap_leaves_images_unchanged(perf_models: Path, tmp_path: Path) -> None:
    images = {}
    for overlap in (False, True):
        records, rt, _ = _drain(perf_models, tmp_path / str(overlap), overlap)
        images[overlap] = [rt.image_of(r) for r in records]
        rt.close()
    for plain, overlapped in zip(images[False], images[True], strict=True):
        assert np.array_equal(plain, overlapped)
