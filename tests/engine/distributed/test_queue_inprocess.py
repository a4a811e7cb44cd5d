"""The worker class, the output store and the queue's fault handling, without Ray: workers are
plain :class:`LoomWorker` objects behind an in-process pool whose 'kill' makes the stream fail
the way Ray's does (:class:`WorkerLost`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from engine import events as ev
from engine.context import Folders
from engine.distributed.attempt import AttemptEvent, ExecutionRetry
from engine.distributed.outputs import OutputStore
from engine.distributed.ray_queue import QueueSettings, RayJobQueue
from engine.distributed.router import first_model_finder
from engine.distributed.worker import (
    JobOutcome,
    LoomWorker,
    OutputFile,
    WorkerConfig,
    WorkerEvent,
    WorkerLost,
)
from engine.jobs.queue import JobQueue
from engine.jobs.records import JobFinished, Notice
from engine.jobs.spec import JobSpec
from engine.jobs.store import JobStore
from nodes.bench.stubs.worker_runtime import make_registry, workflow


def make_worker(tmp: Path, name: str, load_s: float = 0.05) -> LoomWorker:
    return LoomWorker(
        WorkerConfig(
            "nodes.bench.stubs.worker_runtime:build",
            {"root": str(tmp / name), "load_s": load_s},
            name=f"loom-worker-{name}",
            scratch_dir=str(tmp / "scratch"),
        )
    )


class InProcessPool:
    """The queue's pool protocol over in-process workers; ``kill(name)`` fails its stream."""

    def __init__(self, workers: list[LoomWorker]) -> None:
        self.workers = {w.worker_id: w for w in workers}
        self._new = list(self.workers)
        self.dead: set[str] = set()
        self.started = threading.Event()
        self.progressed: set[str] = set()  # workers that streamed a progress event

    def add(self, worker: LoomWorker) -> None:
        self.workers[worker.worker_id] = worker
        self._new.append(worker.worker_id)

    def discover(self) -> tuple[list[str], list[str]]:
        ready, self._new = self._new, []
        return ready, []

    def run(self, name: str, task: JobSpec) -> Iterator[WorkerEvent | JobOutcome]:
        if name in self.dead:
            raise WorkerLost(f"{name} is dead")
        stream: Generator[WorkerEvent | JobOutcome, None, None] = self.workers[name].run_job(task)  # type: ignore[assignment]
        try:
            for item in stream:
                if isinstance(item, WorkerEvent) and isinstance(item.event, ev.Progress):
                    self.progressed.add(name)
                    self.started.set()
                if name in self.dead:
                    self.workers[name].executor.interrupt.set()  # let the abandoned run end quickly
                    raise WorkerLost(f"{name} was killed during {task.prompt_id} (attempt {task.attempt})")
                yield item
        finally:
            stream.close()

    def tell(self, name: str, method: str, *args: Any) -> None:
        getattr(self.workers[name], method)(*args)

    def forget(self, name: str) -> None:
        self.workers.pop(name, None)


def make_queue(
    tmp: Path, pool: InProcessPool, store: JobStore | None = None
) -> tuple[RayJobQueue, list[Notice]]:
    folders = Folders(tmp / "server-in", tmp / "server-out", tmp / "server-temp")
    queue = RayJobQueue(
        store or JobStore(),
        pool,
        folders,
        model_of=first_model_finder(make_registry()),
        settings=QueueSettings(discover_every_s=0.05, default_load_s=1.0, default_run_s=0.2),
    )
    notices: list[Notice] = []
    queue.subscribe(notices.append)
    protocol: JobQueue = queue  # mypy checks the Ray queue against the server's protocol
    return queue, notices if protocol is queue else []


def wait_until_progressing(queue: RayJobQueue, pool: InProcessPool, prompt_id: str) -> str:
    """The live worker running ``prompt_id`` once it has reported progress."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        worker = queue.assignments().get(prompt_id)
        if worker is not None and worker not in pool.dead and worker in pool.progressed:
            return worker
        time.sleep(0.01)
    raise AssertionError(f"job {prompt_id} never made progress on a live worker")


# --- the worker on its own -----------------------------------------------------------------------
def test_a_worker_streams_events_then_its_outcome_with_the_files(tmp_path: Path) -> None:
    worker = make_worker(tmp_path, "a")
    items = list(worker.run_job(JobSpec(workflow("A.safetensors", 7), "p1", attempt=3)))
    events, outcome = items[:-1], items[-1]
    assert isinstance(outcome, JobOutcome) and outcome.result.status == "success"
    assert all(isinstance(i, WorkerEvent) and i.attempt == 3 for i in events)
    assert [i.event.type for i in events][0] == "execution_start"  # type: ignore[union-attr]
    assert [(f.folder, f.path) for f in outcome.files] == [("output", "Loom_00001_.png")]
    assert outcome.load_s > 0.04 and outcome.attempt == 3
    assert not (tmp_path / "scratch" / "loom-worker-a" / "p1.3").exists()  # scratch removed
    again = list(worker.run_job(JobSpec(workflow("A.safetensors", 8), "p2")))[-1]
    assert isinstance(again, JobOutcome) and again.load_s == 0.0  # model still resident
    assert worker.stats()["loads"] == 1 and worker.stats()["jobs"] == 2


def test_interrupt_reaches_the_running_job_and_a_cancel_can_arrive_before_it(tmp_path: Path) -> None:
    worker = make_worker(tmp_path, "a")
    stream = worker.run_job(JobSpec(workflow("A.safetensors", 1, steps=500, step_s=0.01), "slow"))
    for item in stream:
        if isinstance(item, WorkerEvent) and isinstance(item.event, ev.Progress):
            assert worker.interrupt("slow") is True
            break
    rest = list(stream)
    assert isinstance(rest[-1], JobOutcome) and rest[-1].result.status == "interrupted"
    assert worker.interrupt("early") is False  # not here yet: remembered
    last = list(worker.run_job(JobSpec(workflow("A.safetensors", 2), "early")))[-1]
    assert isinstance(last, JobOutcome) and last.result.status == "interrupted"


# --- the output store -----------------------------------------------------------------------------
def test_outputs_are_committed_once_under_names_that_do_not_collide(tmp_path: Path) -> None:
    store = OutputStore(tmp_path / "out", tmp_path / "temp")
    ui = {"9": {"images": [{"filename": "Loom_00001_.png", "subfolder": "", "type": "output"}]}}
    first = store.commit("p1", 1, [OutputFile("output", "Loom_00001_.png", b"one")], ui)
    second = store.commit("p2", 1, [OutputFile("output", "Loom_00001_.png", b"two")], ui)
    assert first == ui
    assert second == {"9": {"images": [{"filename": "Loom_00002_.png", "subfolder": "", "type": "output"}]}}
    assert store.commit("p2", 2, [OutputFile("output", "Loom_00001_.png", b"dup")], ui) is None
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["Loom_00001_.png", "Loom_00002_.png"]
    with pytest.raises(ValueError, match="outside"):
        store.commit("p3", 1, [OutputFile("output", "../escape.png", b"x")], {})


# --- the queue's faults ----------------------------------------------------------------------------
def test_a_job_whose_worker_dies_runs_again_as_attempt_2_and_its_output_exists_once(tmp_path: Path) -> None:
    pool = InProcessPool([make_worker(tmp_path, "a"), make_worker(tmp_path, "b")])
    queue, notices = make_queue(tmp_path, pool)
    queue.start()
    try:
        spec = queue.submit(JobSpec(workflow("A.safetensors", 5, steps=100, step_s=0.01)))
        assert pool.started.wait(10)
        victim = queue.assignments()[spec.prompt_id]
        pool.dead.add(victim)
        record = queue.wait(spec.prompt_id, 20)
    finally:
        queue.stop()
    assert record is not None and record.status == "succeeded"
    job_events = [n for n in notices if isinstance(n, AttemptEvent) and n.spec.prompt_id == spec.prompt_id]
    retries = [n for n in job_events if isinstance(n.event, ExecutionRetry)]
    assert len(retries) == 1 and retries[0].attempt == 2 and retries[0].event.previous_worker == victim  # type: ignore[attr-defined]
    success = [n for n in job_events if isinstance(n.event, ev.ExecutionSuccess)]
    assert len(success) == 1 and success[0].attempt == 2 and success[0].worker_id != victim
    assert [p.name for p in (tmp_path / "server-out").iterdir()] == ["Loom_00001_.png"]
    assert record.outputs["3"]["images"][0]["filename"] == "Loom_00001_.png"


def test_executed_events_name_the_files_the_server_stored(tmp_path: Path) -> None:
    pool = InProcessPool([make_worker(tmp_path, "a")])
    queue, notices = make_queue(tmp_path, pool)
    queue.start()
    try:
        ids = [queue.submit(JobSpec(workflow("A.safetensors", i))).prompt_id for i in range(3)]
        records = [queue.wait(pid, 20) for pid in ids]
    finally:
        queue.stop()
    names = [r.outputs["3"]["images"][0]["filename"] for r in records if r is not None]
    assert sorted(names) == ["Loom_00001_.png", "Loom_00002_.png", "Loom_00003_.png"]
    executed = {
        n.spec.prompt_id: n.event.output["images"][0]["filename"]  # type: ignore[attr-defined]
        for n in notices
        if isinstance(n, AttemptEvent) and isinstance(n.event, ev.Executed)
    }
    assert executed == {pid: name for pid, name in zip(ids, names, strict=True)}
    for pid in ids:  # closing events stay in ComfyUI's order: executed, success, executing(None)
        types = [n.event.type for n in notices if isinstance(n, AttemptEvent) and n.spec.prompt_id == pid]
        assert types[-3:] == ["executed", "execution_success", "executing"]


def test_a_job_that_kills_every_worker_fails_after_max_attempts(tmp_path: Path) -> None:
    pool = InProcessPool([make_worker(tmp_path, "a")])
    queue, _ = make_queue(tmp_path, pool)
    queue.settings = QueueSettings(
        max_attempts=2, discover_every_s=0.05, default_load_s=1.0, default_run_s=0.2
    )
    queue.start()
    try:
        spec = queue.submit(JobSpec(workflow("A.safetensors", 1, steps=200, step_s=0.01)))
        for name in ("b", "c"):
            pool.dead.add(wait_until_progressing(queue, pool, spec.prompt_id))
            pool.add(make_worker(tmp_path, name))  # a worker joining later gets the job
        record = queue.wait(spec.prompt_id, 20)
    finally:
        queue.stop()
    assert record is not None and record.status == "failed"
    assert "died 2 times" in str(record.error)


def test_cancel_reaches_the_running_job_and_removes_pending_ones(tmp_path: Path) -> None:
    pool = InProcessPool([make_worker(tmp_path, "a")])
    queue, notices = make_queue(tmp_path, pool)
    queue.start()
    try:
        running = queue.submit(JobSpec(workflow("A.safetensors", 1, steps=1000, step_s=0.01)))
        waiting = queue.submit(JobSpec(workflow("A.safetensors", 2)))
        assert pool.started.wait(10)
        assert [s.prompt_id for s in queue.running()] == [running.prompt_id]
        assert queue.cancel(waiting.prompt_id) and queue.cancel(running.prompt_id)
        rec = queue.wait(running.prompt_id, 10)
    finally:
        queue.stop()
    assert rec is not None and rec.status == "cancelled"
    assert queue.get(waiting.prompt_id).status == "cancelled"  # type: ignore[union-attr]
    assert any(isinstance(n, JobFinished) and n.record.spec.prompt_id == running.prompt_id for n in notices)


def test_a_restarted_server_runs_the_jobs_that_were_queued_or_running(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "loom.sqlite")
    specs = [JobSpec(workflow("B.safetensors", i), number=float(i)) for i in range(2)]
    for spec in specs:
        store.add_pending(spec)
    assert store.pop_next() is not None  # a single-process server was running the first one
    store.close()
    pool = InProcessPool([make_worker(tmp_path, "a")])
    queue, _ = make_queue(tmp_path, pool, JobStore(tmp_path / "loom.sqlite"))
    assert [s.prompt_id for s in queue.recovered] == [specs[0].prompt_id]
    records = queue.drain(timeout=20)  # bounded wait; the statuses say whether both ran
    queue.stop()
    assert [r.status for r in records] == ["succeeded", "succeeded"]
