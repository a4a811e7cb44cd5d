"""The worker: one Loom executor (registry, memory manager, resident model) per Ray actor.

:class:`LoomWorker` is a plain class -- tests drive it in-process -- that ``pool.py`` turns into a
threaded Ray actor, so :meth:`LoomWorker.interrupt` and :meth:`LoomWorker.stats` are served while
:meth:`LoomWorker.run_job` streams a job's events. It builds its runtime inside the actor from a
picklable :class:`WorkerConfig`: ``runtime_factory`` is an import path (``"main:build_runtime"``)
resolved there, so the engine never imports node code and each actor loads its own models.

Outputs: each attempt writes into its own scratch folder; when it ends the worker reads the files
back, deletes the folder and returns the bytes in the :class:`JobOutcome`. The server stores them
(``outputs.py``): a worker that dies mid-job leaves nothing behind on the server. A worker on the
server's own machine (``serve --isolate-jobs``, ``engine/jobs/worker_process.py``) sets
``WorkerConfig.outputs_in_place`` instead: it writes into its runtime's folders, as the server's
own process would, and keeps in-memory images; with ``WorkerConfig.prefetch`` it also reads the
next job's models during this one (``engine/jobs/overlap.py``).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import logging
import os
import queue
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from engine import events as ev
from engine.distributed.attempt_dirs import attempt_dir, remove_inside
from engine.executor import Executor, RunResult
from engine.jobs.overlap import PlanAwarePrefetch
from engine.jobs.spec import JobSpec

log = logging.getLogger("loom.distributed.worker")

WORKER_PREFIX = "loom-worker-"  # Ray actor names the server discovers
OUTPUT_FOLDERS = ("output", "temp")
_HISTORY = 200  # per-job accounting entries a worker keeps for stats()
BUSY_WAIT_S = 10.0  # a job arriving while the previous one is still cleaning up waits this long


@dataclass(frozen=True)
class WorkerConfig:
    """Everything an actor needs to build its runtime; picklable (paths are strings).

    ``runtime_factory`` is ``"module:function"``; the function gets
    ``argparse.Namespace(**runtime_args)`` (``main.build_runtime`` fits) and returns an object with
    an ``executor`` attribute (and ``models``, the memory manager, for its figures).
    ``outputs_in_place``: write outputs into the runtime's own folders (a worker on the server's
    machine) instead of scratch folders whose files travel back; ``prefetch``: read the models of
    the jobs :meth:`LoomWorker.run_job` is told come next while this one runs.
    """

    runtime_factory: str = "main:build_runtime"
    runtime_args: dict[str, Any] = field(default_factory=dict)
    name: str = ""
    scratch_dir: str | None = None
    python_path: tuple[str, ...] = ()
    outputs_in_place: bool = False
    prefetch: bool = False


@dataclass(frozen=True)
class WorkerEvent:
    """An execution event streamed back while an attempt runs."""

    attempt: int
    event: ev.Event


@dataclass(frozen=True)
class OutputFile:
    folder: str  # "output" or "temp"
    path: str  # relative, with "/" separators
    data: bytes


@dataclass
class JobOutcome:
    """The last item of :meth:`LoomWorker.run_job`: the result, the files, the figures."""

    prompt_id: str
    attempt: int
    worker_id: str
    result: RunResult
    files: list[OutputFile] = field(default_factory=list)
    load_s: float = 0.0  # seconds the memory manager spent bringing models in
    run_s: float = 0.0  # the rest of the run
    resident: list[str] = field(default_factory=list)


class WorkerRuntime(Protocol):
    executor: Executor


class WorkerLost(RuntimeError):
    """The worker's process died or became unreachable; the job it ran must run elsewhere."""


class JobCrashed(RuntimeError):
    """``run_job`` itself raised inside a live worker (not a node failure: those are results)."""


class WorkerBusy(RuntimeError):
    """A second job was sent to a worker that is running one (the server never does this)."""


def resolve_factory(path: str) -> Callable[[argparse.Namespace], Any]:
    """``"package.module:function"`` -> the function, with an error that says what was wrong."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"runtime_factory {path!r}: expected 'module:function', e.g. 'main:build_runtime'")
    module = importlib.import_module(module_name)
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ValueError(f"runtime_factory {path!r}: module {module_name!r} has no callable {attr!r}")
    return factory  # type: ignore[no-any-return]


class LoomWorker:
    """Runs one job at a time with its own executor; see the module docstring."""

    def __init__(self, config: WorkerConfig) -> None:
        for entry in config.python_path:
            if entry not in sys.path:
                sys.path.insert(0, entry)
        self.config = config
        self.worker_id = config.name or f"{WORKER_PREFIX}{socket.gethostname()}-{os.getpid()}"
        self.runtime: WorkerRuntime = resolve_factory(config.runtime_factory)(
            argparse.Namespace(**config.runtime_args)
        )
        self.executor = self.runtime.executor
        self._base_folders = self.executor.folders
        root = Path(config.scratch_dir) if config.scratch_dir else Path(tempfile.gettempdir()) / "loom-worker"
        self.scratch = root / self.worker_id.replace("/", "_")
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._current: str | None = None
        self._cancelled: set[str] = set()
        self._free_request = (False, False)
        self._totals: dict[str, Any] = {"jobs": 0, "loads": 0, "evictions": 0, "load_s": 0.0, "history": []}
        self._prefetch = PlanAwarePrefetch(self.executor) if config.prefetch else None
        log.info("worker %s ready (pid %d)", self.worker_id, os.getpid())

    # --- small calls (served while a job runs) ---------------------------------------------------
    def info(self) -> dict[str, Any]:
        models = getattr(self.runtime, "models", None)
        device = getattr(getattr(models, "policy", None), "device", "cpu")
        return {
            "worker_id": self.worker_id,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "device": device,
        }

    def ping(self) -> str:
        return self.worker_id

    def interrupt(self, prompt_id: str | None = None) -> bool:
        """Interrupt ``prompt_id`` (or whatever runs): now if it runs, at its start if it is on its way."""
        with self._lock:
            if prompt_id is None or prompt_id == self._current:
                if self._current is None:
                    return False
                self.executor.interrupt.set()
                return True
            self._cancelled.add(prompt_id)
            return False

    def free(self, unload_models: bool, free_memory: bool) -> None:
        """ComfyUI's /free: done now when idle, else right after the running job."""
        with self._lock:
            unload, free = self._free_request
            self._free_request = (unload or unload_models, free or free_memory)
            busy = self._current is not None
        if not busy:
            self._do_free()

    def stats(self) -> dict[str, Any]:
        """Lifetime figures (jobs, loads, evictions, load seconds, per-job log) and residency."""
        models = getattr(self.runtime, "models", None)
        now = models.stats() if models is not None and hasattr(models, "stats") else {}
        with self._lock:
            totals = {**self._totals, "history": list(self._totals["history"])}
        return {
            **totals,
            "worker_id": self.worker_id,
            "running": self._current,
            "resident": now.get("resident", []),
            "device": now.get("device", "cpu"),
        }

    # --- the job ------------------------------------------------------------------------------------
    def run_job(
        self, task: JobSpec, following: JobSpec | None = None, queued: Sequence[JobSpec] = ()
    ) -> Iterator[WorkerEvent | JobOutcome]:
        """Stream the events of attempt ``task.attempt`` at the job, then one :class:`JobOutcome`
        (a Ray streaming generator). ``following`` and ``queued``, the jobs after it, are read
        ahead with ``WorkerConfig.prefetch``."""
        with self._idle:
            if not self._idle.wait_for(lambda: self._current is None, timeout=BUSY_WAIT_S):
                raise WorkerBusy(
                    f"worker {self.worker_id} is running {self._current}; "
                    f"{task.prompt_id} must wait for another worker"
                )
            self._current = task.prompt_id
        scratch = attempt_dir(self.scratch, task.prompt_id, task.attempt)
        items: queue.Queue[WorkerEvent | JobOutcome | BaseException] = queue.Queue()
        unsubscribe = self.executor.bus.subscribe(lambda event: self._on_event(task, event, items))
        ahead = (
            self._prefetch.during(following, current=task, queued=queued)
            if self._prefetch is not None
            else nullcontext()
        )
        runner = threading.Thread(
            target=self._run,
            args=(task, scratch, items, ahead),
            daemon=True,
            name=f"loom-job-{task.prompt_id[:8]}",
        )
        try:
            runner.start()
            while True:
                item = items.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if isinstance(item, JobOutcome):
                    return
        finally:
            runner.join()
            unsubscribe()
            if not self.config.outputs_in_place:
                remove_inside(self.scratch, scratch)
            self._do_free()
            with self._idle:
                self._current = None
                self._cancelled.discard(task.prompt_id)
                self._idle.notify_all()

    def _on_event(self, task: JobSpec, event: ev.Event, items: queue.Queue[Any]) -> None:
        if event.prompt_id != task.prompt_id:
            return
        if isinstance(event, ev.ExecutionStart):
            with self._lock:
                if task.prompt_id in self._cancelled:
                    self.executor.interrupt.set()  # cancelled while it was on its way here
        items.put(WorkerEvent(task.attempt, event))

    def _run(
        self, task: JobSpec, scratch: Path, items: queue.Queue[Any], ahead: AbstractContextManager[Any]
    ) -> None:
        try:
            with ahead:
                items.put(self._execute(task, scratch))
        except BaseException as exc:  # the stream must end even if the executor broke
            items.put(exc)

    def _execute(self, task: JobSpec, scratch: Path) -> JobOutcome:
        request = task.request(self.executor.registry.object_info)
        if self.config.outputs_in_place:
            result = self.executor.run(request)
            return self._outcome(task, result, [])
        folders = dataclasses.replace(
            self._base_folders, output_dir=scratch / "output", temp_dir=scratch / "temp"
        )
        folders.ensure()
        self.executor.folders = folders
        # every image is written as a file: the server reads them back from the outcome
        request = dataclasses.replace(request, keep_images=False)
        try:
            result = self.executor.run(request)
        finally:
            self.executor.folders = self._base_folders
        return self._outcome(task, result, collect_files(scratch))

    def _outcome(self, task: JobSpec, result: RunResult, files: list[OutputFile]) -> JobOutcome:
        loads = result.memory.get("loads", []) if isinstance(result.memory, dict) else []
        evictions = result.memory.get("evictions", []) if isinstance(result.memory, dict) else []
        load_s = float(sum(float(x.get("seconds", 0.0)) for x in loads))
        total_s = float(result.timings.get("total_s", 0.0))
        resident = (
            [
                str(r.get("key", r)) if isinstance(r, dict) else str(r)
                for r in result.memory.get("resident", [])
            ]
            if isinstance(result.memory, dict)
            else []
        )
        self._account(task, loads, evictions, load_s)
        return JobOutcome(
            task.prompt_id,
            task.attempt,
            self.worker_id,
            result,
            files,
            load_s=round(load_s, 6),
            run_s=round(max(0.0, total_s - load_s), 6),
            resident=resident,
        )

    def _account(self, task: JobSpec, loads: list[Any], evictions: list[Any], load_s: float) -> None:
        with self._lock:
            t = self._totals
            t["jobs"] += 1
            t["loads"] += len(loads)
            t["evictions"] += len(evictions)
            t["load_s"] = round(t["load_s"] + load_s, 6)
            t["history"].append(
                {
                    "prompt_id": task.prompt_id,
                    "attempt": task.attempt,
                    "loads": [x.get("key") for x in loads if isinstance(x, dict)],
                    "evictions": len(evictions),
                    "at": time.time(),
                }
            )
            del t["history"][:-_HISTORY]

    def _do_free(self) -> None:
        with self._lock:
            unload, free_memory = self._free_request
            self._free_request = (False, False)
        if unload or free_memory:
            self.executor.models.free()
        if free_memory:
            self.executor.cache.clear()


def collect_files(scratch: Path) -> list[OutputFile]:
    """Every file an attempt wrote under its scratch ``output/`` and ``temp/`` folders."""
    files = []
    for folder in OUTPUT_FOLDERS:
        base = scratch / folder
        if not base.is_dir():
            continue
        for path in sorted(p for p in base.rglob("*") if p.is_file()):
            files.append(OutputFile(folder, path.relative_to(base).as_posix(), path.read_bytes()))
    return files
