"""The Ray queue on a real local Ray cluster (loopback only) with 1-3 CPU worker actors over the
stub runtime: affinity, a SIGKILLed worker, cancel, a worker joining later, 50 jobs identical to
single-process runs. One cluster for the module; each test has its own namespace and workers."""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")

from engine import events as ev  # noqa: E402
from engine.context import Folders  # noqa: E402
from engine.distributed.attempt import AttemptEvent, ExecutionRetry  # noqa: E402
from engine.distributed.pool import ActorResources, RayWorkerPool  # noqa: E402
from engine.distributed.ray_queue import QueueSettings, RayJobQueue  # noqa: E402
from engine.distributed.router import first_model_finder  # noqa: E402
from engine.distributed.worker import WorkerConfig  # noqa: E402
from engine.executor import RunRequest  # noqa: E402
from engine.jobs.records import JobRecord, Notice  # noqa: E402
from engine.jobs.spec import JobSpec  # noqa: E402
from engine.jobs.store import JobStore  # noqa: E402
from nodes.bench.stubs import worker_runtime  # noqa: E402
from nodes.bench.stubs.worker_runtime import make_registry, workflow  # noqa: E402

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[3]
FACTORY = "nodes.bench.stubs.worker_runtime:build"


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    ray.init(
        address="local",
        num_cpus=3,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}},
    )
    yield
    ray.shutdown()


class Setup:
    """A pool in a namespace of its own, a queue over it, and the notices it sent."""

    def __init__(self, tmp: Path, load_s: float) -> None:
        self.tmp = tmp
        self.pool = RayWorkerPool(namespace=f"loom-test-{uuid.uuid4().hex[:8]}")
        self.config = WorkerConfig(
            FACTORY, {"root": str(tmp / "workers"), "load_s": load_s}, scratch_dir=str(tmp / "scratch")
        )
        self.out = tmp / "server-out"
        self.queue = RayJobQueue(
            JobStore(),
            self.pool,
            Folders(tmp / "in", self.out, tmp / "temp"),
            model_of=first_model_finder(make_registry()),
            settings=QueueSettings(discover_every_s=0.2, default_load_s=1.0, default_run_s=0.2),
        )
        self.notices: list[Notice] = []
        self.queue.subscribe(self.notices.append)

    def workers(self, count: int) -> list[str]:
        names = self.pool.spawn(self.config, ActorResources(num_cpus=1), count)
        self.queue.start()
        deadline = time.monotonic() + 60
        while not set(names) <= set(self.queue.router_workers()):
            assert time.monotonic() < deadline, "workers did not join"
            time.sleep(0.05)
        return names

    def events(self, prompt_id: str) -> list[AttemptEvent]:
        return [
            n for n in list(self.notices) if isinstance(n, AttemptEvent) and n.spec.prompt_id == prompt_id
        ]

    def wait_for_progress(self, prompt_id: str) -> str:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for n in self.events(prompt_id):
                if isinstance(n.event, ev.Progress):
                    return n.worker_id
            time.sleep(0.01)
        raise AssertionError(f"job {prompt_id} made no progress")

    def run_all(self, prompts: list[dict[str, Any]], timeout: float = 90) -> list[JobRecord]:
        ids = [self.queue.submit(JobSpec(p)).prompt_id for p in prompts]
        records = [self.queue.wait(pid, timeout) for pid in ids]
        assert all(r is not None for r in records), "a job never finished"
        return [r for r in records if r is not None]

    def close(self) -> None:
        self.queue.stop()
        self.pool.shutdown()


@pytest.fixture
def setup(cluster: None, tmp_path: Path) -> Iterator[Any]:
    made: list[Setup] = []

    def make(load_s: float = 0.05) -> Setup:
        made.append(Setup(tmp_path, load_s))
        return made[-1]

    yield make
    for s in made:
        s.close()


def test_alternating_models_on_two_workers_cause_no_swaps_after_warm_up(setup: Any) -> None:
    s = setup(load_s=0.5)
    names = s.workers(2)
    records = s.run_all([workflow("AB"[i % 2] + ".safetensors", i, steps=5, step_s=0.02) for i in range(12)])
    assert [r.status for r in records] == ["succeeded"] * 12
    stats = [s.pool.call(name, "stats") for name in names]
    assert sorted(st["jobs"] for st in stats) == [6, 6]
    assert [st["loads"] for st in stats] == [1, 1]  # each loaded its model once, in its first job
    assert [st["evictions"] for st in stats] == [0, 0]
    for st in stats:
        assert st["history"][0]["loads"] and not any(h["loads"] for h in st["history"][1:])
    assert sum(len(r.memory.get("loads", [])) for r in records) == 2
    cluster = s.queue.cluster()
    assert sorted(w["resident_model"] for w in cluster["workers"].values()) == [
        "checkpoints/A.safetensors",
        "checkpoints/B.safetensors",
    ]
    assert [w["loads"] for w in cluster["workers"].values()] == [1, 1]
    assert cluster["load_s"]["checkpoints/A.safetensors"] >= 0.5  # measured by the workers' memory managers


def test_a_sigkilled_worker_s_job_completes_elsewhere_as_attempt_2_with_one_output(setup: Any) -> None:
    s = setup()
    s.workers(2)
    spec = s.queue.submit(JobSpec(workflow("A.safetensors", 11, steps=300, step_s=0.01)))
    victim = s.wait_for_progress(spec.prompt_id)
    os.kill(s.pool.call(victim, "info")["pid"], signal.SIGKILL)
    record = s.queue.wait(spec.prompt_id, 60)
    assert record is not None and record.status == "succeeded"
    events = s.events(spec.prompt_id)
    retries = [n for n in events if isinstance(n.event, ExecutionRetry)]
    assert [n.attempt for n in retries] == [2] and retries[0].event.previous_worker == victim  # type: ignore[attr-defined]
    success = [n for n in events if isinstance(n.event, ev.ExecutionSuccess)]
    assert [(n.attempt, n.worker_id != victim) for n in success] == [(2, True)]
    assert sorted(p.name for p in s.out.iterdir()) == ["Loom_00001_.png"]  # the output exists once
    assert victim not in s.queue.router_workers()

    # A worker joining now gets work: a new model goes to it (empty) rather than evicting A.
    (late,) = s.workers(1)
    (record,) = s.run_all([workflow("C.safetensors", 3)])
    assert record.status == "succeeded"
    assert {n.worker_id for n in s.events(record.spec.prompt_id) if n.worker_id} == {late}


def test_cancel_interrupts_the_job_on_its_worker_which_then_runs_the_next(setup: Any) -> None:
    s = setup()
    (name,) = s.workers(1)
    spec = s.queue.submit(JobSpec(workflow("A.safetensors", 1, steps=2000, step_s=0.01)))
    s.wait_for_progress(spec.prompt_id)
    assert s.queue.cancel(spec.prompt_id)
    record = s.queue.wait(spec.prompt_id, 30)  # bounded wait; run to its end it would be "succeeded"
    assert record is not None and record.status == "cancelled"
    assert any(isinstance(n.event, ev.ExecutionInterrupted) for n in s.events(spec.prompt_id))
    (after,) = s.run_all([workflow("A.safetensors", 2)])
    assert after.status == "succeeded" and s.pool.call(name, "stats")["jobs"] == 2


def test_fifty_jobs_on_three_workers_match_single_process_outputs(setup: Any, tmp_path: Path) -> None:
    prompts = [
        workflow("ABC"[i % 3] + ".safetensors", 1000 + i, steps=2, step_s=0.002, prefix=f"job{i}")
        for i in range(50)
    ]
    local = worker_runtime.build(_ns(root=str(tmp_path / "single"), load_s=0.01))
    expected = []
    for prompt in prompts:
        result = local.executor.run(RunRequest(prompt=prompt))
        image = result.outputs["3"]["images"][0]
        expected.append((local.folders.output_dir / image["filename"]).read_bytes())
    s = setup(load_s=0.05)
    s.workers(3)
    records = s.run_all(prompts, timeout=120)
    assert [r.status for r in records] == ["succeeded"] * 50
    got = [(s.out / r.outputs["3"]["images"][0]["filename"]).read_bytes() for r in records]
    assert got == expected
    assert len(list(s.out.iterdir())) == 50


def _ns(**kw: Any) -> Any:
    import argparse

    return argparse.Namespace(**kw)


def test_a_job_id_that_reads_as_a_path_removes_nothing_outside_the_folders(setup: Any) -> None:
    s = setup()
    s.workers(1)
    victim = (
        s.tmp / "victim.1"
    )  # what scratch/<worker>/../../victim.1 and server-out/.loom-attempts/../../ name
    victim.mkdir()
    (victim / "keep.txt").write_text("x")
    spec = s.queue.submit(JobSpec(workflow("A.safetensors", 4), "../../victim"))
    record = s.queue.wait(spec.prompt_id, 60)
    assert record is not None and record.status == "succeeded"
    assert (victim / "keep.txt").exists()
    assert sorted(p.name for p in s.out.iterdir()) == ["Loom_00001_.png"]
