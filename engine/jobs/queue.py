"""The job-queue boundary: a :class:`JobQueue` protocol and its in-process implementation.

:class:`LocalJobQueue` owns one worker thread that pops jobs in ComfyUI's order (lowest
``number`` first; ``front`` jobs get negative numbers), runs them with the shared
:class:`~engine.executor.Executor` and records each outcome in a history. Queue and history live
in SQLite (:class:`JobStore`, ``user/loom.sqlite`` by default): jobs queued before a restart run
after it, and a job that was running when the process stopped is recorded as failed
("interrupted by restart").

Everything that happens is told to subscribers as :data:`Notice` values, from the worker thread
(the server crosses them to its event loop). The CLI may use :meth:`LocalJobQueue.drain` to run
queued jobs on its own thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from engine import events as ev
from engine.events import Listeners
from engine.executor import Executor, RunResult
from engine.jobs.coalesce import Coalescer
from engine.jobs.overlap import PlanAwarePrefetch
from engine.jobs.records import (
    RESTART_MESSAGE,
    STATUS_MESSAGES,
    InterruptState,
    JobEvent,
    JobFinished,
    JobProgress,
    JobRecord,
    JobView,
    KeptImageStore,
    Notice,
    NoticeListener,
    QueueChanged,
    WorkerHealth,
)
from engine.jobs.runner import InProcessRunner, JobPrefetch, JobRunner
from engine.jobs.spec import JobSpec
from engine.jobs.store import JobStore, StorageError
from engine.jobs.worker_thread import JobWorker

log = logging.getLogger("loom.jobs")


class JobQueue(Protocol):
    """What the server (and anything else) needs from a job queue."""

    def submit(self, spec: JobSpec, *, front: bool = False, number: float | None = None) -> JobSpec: ...
    def cancel(self, prompt_id: str, *, record: bool = True) -> bool: ...
    def interrupt(self, prompt_id: str | None = None) -> bool: ...
    def clear_pending(self) -> int: ...
    def get(self, prompt_id: str) -> JobView | None: ...
    def running(self) -> list[JobSpec]: ...
    def pending(self) -> list[JobSpec]: ...
    def remaining(self) -> int: ...
    def history(self, max_items: int | None = None, offset: int = 0) -> list[JobRecord]: ...
    def delete_history(self, prompt_ids: list[str]) -> None: ...
    def clear_history(self) -> None: ...
    def schedule_free(self, *, unload_models: bool, free_memory: bool) -> None: ...
    def subscribe(self, listener: NoticeListener) -> Callable[[], None]: ...
    def start(self) -> None: ...
    def stop(self) -> None: ...


# --- the in-process queue --------------------------------------------------------------------------
class LocalJobQueue(JobWorker):
    """One worker thread running jobs from a :class:`JobStore` with a shared :class:`Executor`.

    The thread itself (``start``, ``stop``, ``drain``, surviving its own death and a full disk) is
    :class:`~engine.jobs.worker_thread.JobWorker`'s; this class submits, cancels, looks up and runs jobs.
    Each job's workflow runs in ``runner`` (engine/jobs/runner.py): by default ``executor`` in this
    process; a worker process with ``serve --isolate-jobs``. ``executor`` is the queue's either way:
    its registry, its bus (the run's events) and its interrupt flag.
    """

    def __init__(
        self,
        executor: Executor,
        store: JobStore,
        *,
        coalescer: Coalescer | None = None,
        prefetch: JobPrefetch | None = None,
        runner: JobRunner | None = None,
        kept: KeptImageStore | None = None,
    ) -> None:
        self.executor = executor
        self.store = store
        self.runner: JobRunner = runner if runner is not None else InProcessRunner(executor)
        self.coalescer = coalescer  # engine/jobs/coalesce.py: batch compatible queued jobs (None: off)
        self.prefetch = prefetch  # engine/jobs/coalesce.py: read the next job's models during this one
        # images of jobs that asked for bytes (never written to SQLite); inside the process RAM budget
        self.kept = kept if kept is not None else kept_images_for(executor)
        self._lock = threading.RLock()
        self._finished = threading.Condition(self._lock)
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._listeners: Listeners[Notice] = Listeners(isolate=True, what="job queue listener")
        self._current: JobSpec | None = None
        self._progress = JobProgress()
        # queued jobs whose sampler runs batched with the current one (coalescing): their progress
        self._riders: dict[str, JobSpec] = {}
        self._rider_progress: dict[str, JobProgress] = {}
        self._messages: list[list[Any]] = []
        # the current job's final ``executing`` (node None), sent once its record is saved: a client
        # that reads /history on that message finds the job there (ComfyUI's order)
        self._done_event: JobEvent | None = None
        self._cancel_requested: set[str] = set()
        self._free_request = (False, False)
        self._thread: threading.Thread | None = None
        self._unsubscribe: Callable[[], None] | None = None
        self._health = WorkerHealth()
        # finished jobs the store could not take (disk full): still visible, written when space returns
        self._unsaved: dict[str, JobRecord] = {}
        try:
            self.recovered: list[JobRecord] = store.recover()
        except StorageError as exc:  # a full disk at start-up: the jobs stay 'running' until next time
            log.error("could not record the jobs interrupted by the last stop: %s", exc)
            self.recovered = []
        for record in self.recovered:
            log.warning(
                "job %s was running when the process stopped; recorded as failed (%s)",
                record.spec.prompt_id,
                RESTART_MESSAGE,
            )

    # --- submitting and cancelling ------------------------------------------------------------------
    def submit(self, spec: JobSpec, *, front: bool = False, number: float | None = None) -> JobSpec:
        """Queue a job. ``number`` orders it (ComfyUI's field); ``front`` puts it before the others."""
        self.store.enqueue(spec, front=front, number=number)
        self.ensure_worker()
        self._wake.set()
        self._notify(QueueChanged(self.remaining()))
        return spec

    def cancel(self, prompt_id: str, *, record: bool = True) -> bool:
        """Pending → removed (recorded as cancelled if ``record``); running → interrupted."""
        if self.interrupt(prompt_id):
            return True
        spec = self.store.remove(prompt_id, "pending")
        if spec is None:
            return False
        if record:
            cancelled = JobRecord.cancelled_before_start(spec)
            self.store.finish(cancelled)
            self._notify(JobFinished(cancelled))
        self._notify(QueueChanged(self.remaining()))
        return True

    def interrupt(self, prompt_id: str | None = None) -> bool:
        """Interrupt the running job (only if it is ``prompt_id``, when given)."""
        with self._lock:
            current = self._current
            if current is None or (prompt_id is not None and prompt_id != current.prompt_id):
                return False
            self._cancel_requested.add(current.prompt_id)
        self.executor.interrupt.set()
        return True

    def clear_pending(self) -> int:
        """Remove every queued job; each is recorded as cancelled, its event streams end and its
        webhook is called, as with :meth:`cancel`."""
        removed = 0
        for spec in self.store.jobs("pending"):
            taken = self.store.remove(spec.prompt_id, "pending")
            if taken is not None:
                cancelled = JobRecord.cancelled_before_start(taken)
                self.store.finish(cancelled)
                self._notify(JobFinished(cancelled))
                removed += 1
        self._notify(QueueChanged(self.remaining()))
        return removed

    def schedule_free(self, *, unload_models: bool, free_memory: bool) -> None:
        """Free models / caches between jobs (ComfyUI's /free), on the worker thread."""
        with self._lock:
            unload, free = self._free_request
            self._free_request = (unload or unload_models, free or free_memory)
        if self._thread is None:
            self._do_free()
        self._wake.set()

    # --- looking ----------------------------------------------------------------------------------
    def get(self, prompt_id: str) -> JobView | None:
        with self._lock:
            if self._current is not None and self._current.prompt_id == prompt_id:
                stopping = None
                if prompt_id in self._cancel_requested and self.executor.interrupt.is_requested():
                    stopping = InterruptState(
                        self.executor.interrupt.unheeded_for(), forced_in_s=self.runner.force_stop_in()
                    )
                return JobView(self._current, "running", self._progress, interrupt=stopping)
            ridden = self._rider_progress.get(prompt_id)
            unsaved = self._unsaved.get(prompt_id)
        if unsaved is not None:
            return JobView(unsaved.spec, unsaved.status, record=unsaved)
        queued = self.store.queued(prompt_id)
        if queued is not None and queued[0] == "pending":
            return JobView(queued[1], "queued", ridden)
        record = self.store.record(prompt_id)
        return JobView(record.spec, record.status, record=record) if record else None

    def running(self) -> list[JobSpec]:
        with self._lock:
            return [self._current] if self._current is not None else []

    def pending(self) -> list[JobSpec]:
        running = {s.prompt_id for s in self.running()}
        return [s for s in self.store.jobs("pending") if s.prompt_id not in running]

    def remaining(self) -> int:
        return self.store.count()

    def history(self, max_items: int | None = None, offset: int = 0) -> list[JobRecord]:
        records = self.store.history(max_items, offset, ran_only=True)
        with self._lock:
            unsaved = [r for r in self._unsaved.values() if r.ran]
        return records + unsaved if offset == 0 else records

    def delete_history(self, prompt_ids: list[str]) -> None:
        self.store.delete_history(prompt_ids)
        self.kept.discard(prompt_ids)

    def clear_history(self) -> None:
        self.store.clear_history()
        self.kept.discard()

    def damaged_report(self) -> dict[str, Any]:
        """The job database's rows that could not be read as jobs, set aside (count and the newest)."""
        return self.store.damaged_report()

    def kept_images(self, prompt_id: str) -> dict[str, bytes]:
        """The encoded images a finished job kept in memory (``KeptImages.key`` -> bytes); empty
        unless it was submitted with ``JobSpec.returns`` "bytes" or "base64"."""
        return self.kept.get(prompt_id)

    def wait(self, prompt_id: str, timeout: float | None = None) -> JobRecord | None:
        """Block until the job is in the history (or the timeout passes)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._finished:
            while (record := self._unsaved.get(prompt_id) or self.store.record(prompt_id)) is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self._finished.wait(0.5 if left is None else min(left, 0.5))
            return record

    def subscribe(self, listener: NoticeListener) -> Callable[[], None]:
        return self._listeners.subscribe(listener)

    def _run_scheduled(self, spec: JobSpec, *, wait: bool = True) -> JobRecord | None:
        """Run ``spec``, first coalescing compatible queued jobs with it and hinting the next
        job's models (both optional, see ``engine/jobs/coalesce.py``)."""
        group: list[JobSpec] = []
        if self.coalescer is not None:
            try:
                group = self._companions(spec, wait)
                if group:
                    with self._lock:
                        self._riders = {g.prompt_id: g for g in group}
                        self._rider_progress = {}  # an earlier group's riders have all run (or left)
                    self.coalescer.prefill([spec, *group], forward=self.executor.bus.emit)
            except Exception:  # coalescing only saves work; each job still runs on its own
                log.exception("coalescing with job %s failed; running the jobs one by one", spec.prompt_id)
            finally:
                with self._lock:
                    self._riders = {}
        if self.prefetch is None:
            return self._run(spec)
        skip = {spec.prompt_id, *(g.prompt_id for g in group)}
        following = next((s for s in self.pending() if s.prompt_id not in skip), None)
        with self.prefetch.during(
            following, current=spec, queued=[s for s in self.pending() if s.prompt_id not in skip]
        ):
            return self._run(spec)

    def _companions(self, spec: JobSpec, wait: bool) -> list[JobSpec]:
        """Pending jobs to coalesce with ``spec``; a lone job waits at most the window for some."""
        assert self.coalescer is not None
        if self.coalescer.signature(spec) is None or not self.coalescer.has_work(spec):
            return []
        deadline = time.monotonic() + (self.coalescer.config.window_s if wait else 0.0)
        while True:
            group = self.coalescer.companions(spec, self.pending())
            if group or time.monotonic() >= deadline or self._stopping.is_set():
                return group
            time.sleep(min(0.005, max(0.0, deadline - time.monotonic())))

    def _run(self, spec: JobSpec) -> JobRecord | None:
        self._notify_remaining()
        started = time.time()
        try:
            result = self.runner.run(spec)
        except BaseException as exc:  # noqa: BLE001 - the executor promises not to raise; be safe anyway
            log.exception("job %s: the executor raised", spec.prompt_id)
            result = RunResult(
                spec.prompt_id, "error", error={"type": type(exc).__name__, "message": str(exc)}
            )
        with self._lock:
            messages = list(self._messages)
            self._cancel_requested.discard(spec.prompt_id)
        if self._stopping.is_set() and result.status == "interrupted":
            with self._lock:
                self._current = None
            self._send_done_event()
            return None  # left 'running' in the store: the next start records it
        if result.status == "invalid" and not any(m[0] == "execution_error" for m in messages):
            messages.append(["execution_error", {"prompt_id": spec.prompt_id, **(result.error or {})}])
        record = JobRecord.from_result(spec, result, messages, started)
        if result.images:
            self.kept.put(spec.prompt_id, result.images)  # before the record: a GET must find both
        self._save(record)
        self._send_done_event()
        self._notify(JobFinished(record))
        self._notify_remaining()
        return record

    def _send_done_event(self) -> None:
        with self._lock:
            held, self._done_event = self._done_event, None
        if held is not None:
            self._notify(held)

    def _on_event(self, event: ev.Event) -> None:
        with self._lock:
            spec = self._current
            rider = self._riders.get(event.prompt_id) if isinstance(event, ev.Progress) else None
            if rider is not None:  # a queued job's sampler, running batched with the current job
                self._rider_progress[rider.prompt_id] = JobProgress().after(event)
                spec = rider
            elif spec is None or event.prompt_id != spec.prompt_id:
                return
            else:
                if isinstance(event, ev.ExecutionStart) and (
                    spec.prompt_id in self._cancel_requested or self._stopping.is_set()
                ):
                    self.executor.interrupt.set()  # cancelled between pop and the executor's start
                self._progress = self._progress.after(event)
                if event.type in STATUS_MESSAGES:
                    self._messages.append([event.type, event.data()])
                if isinstance(event, ev.Executing) and event.node is None:
                    self._done_event = JobEvent(spec, event)
                    return
        self._notify(JobEvent(spec, event))


def kept_images_for(executor: Executor) -> KeptImageStore:
    """The kept job images, inside the executor's process RAM budget when it has one."""
    ram = executor.ram
    if ram is None:
        return KeptImageStore()
    return ram.add(KeptImageStore(max_bytes=ram.kept_cap(), room=ram.room))


def make_local_queue(executor: Executor, store: JobStore) -> LocalJobQueue:
    """The in-process queue as the server and the CLI run it: coalescing of compatible queued jobs
    and plan-aware model prefetch on (engine/jobs/overlap.py; all leave every image as it would be alone)."""
    return LocalJobQueue(executor, store, coalescer=Coalescer(executor), prefetch=PlanAwarePrefetch(executor))
