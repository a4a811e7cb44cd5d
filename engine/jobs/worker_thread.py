"""The worker half of :class:`~engine.jobs.queue.LocalJobQueue`: its thread and how it stays alive.

:class:`JobWorker` starts, stops and drains the queue, pops jobs in order and frees memory between
them. The loop outlives whatever ends it: a worker that dies records its job as failed and a fresh
thread takes over; while the store cannot write (a full disk) finished jobs stay in memory, still
visible, and are written when space returns. What a job does when it runs (coalescing, prefetch,
recording its result) is :class:`~engine.jobs.queue.LocalJobQueue`'s.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from engine import events as ev
from engine.events import Listeners
from engine.executor import Executor
from engine.jobs.records import JobFinished, JobProgress, JobRecord, Notice, QueueChanged, WorkerHealth
from engine.jobs.runner import JobRunner
from engine.jobs.spec import JobSpec
from engine.jobs.store import JobStore, StorageError

WORKER_DIED_MESSAGE = "the job worker stopped unexpectedly while running this job; it was restarted"
STORAGE_RETRY_S = 1.0

log = logging.getLogger("loom.jobs")


class JobWorker:
    """The worker thread of a job queue; :class:`~engine.jobs.queue.LocalJobQueue` builds the state and
    runs each job (``_run_scheduled``).

    ``start()`` launches the worker; ``stop()`` interrupts the running job and leaves it marked
    running in the store, so the next process records it as interrupted by restart. Without
    ``start()``, :meth:`drain` runs the queued jobs on the caller's thread (the CLI's way).
    """

    executor: Executor
    store: JobStore
    runner: JobRunner
    _lock: threading.RLock
    _finished: threading.Condition
    _wake: threading.Event
    _stopping: threading.Event
    _listeners: Listeners[Notice]
    _current: JobSpec | None
    _progress: JobProgress
    _rider_progress: dict[str, JobProgress]
    _messages: list[list[Any]]
    _free_request: tuple[bool, bool]
    _thread: threading.Thread | None
    _unsubscribe: Callable[[], None] | None
    _health: WorkerHealth
    _unsaved: dict[str, JobRecord]  # finished jobs the store could not take (disk full)

    if TYPE_CHECKING:  # defined by LocalJobQueue

        def _run_scheduled(self, spec: JobSpec, *, wait: bool = True) -> JobRecord | None: ...
        def _on_event(self, event: ev.Event) -> None: ...
        def remaining(self) -> int: ...

    # --- lifecycle ----------------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            return
        self._stopping.clear()
        self._subscribe_bus()
        self.runner.start()
        self._launch()

    def _launch(self) -> None:
        self._thread = threading.Thread(target=self._worker_main, name="loom-job-worker", daemon=True)
        self._thread.start()

    def health(self) -> WorkerHealth:
        """The worker's state (restarting it first if it died unnoticed)."""
        self.ensure_worker()
        with self._lock:
            thread = self._thread
            self._health.alive = thread is not None and thread.is_alive()
            self._health.unsaved_records = len(self._unsaved)
            health = WorkerHealth(**asdict(self._health))
        health.process = self.runner.health()
        return health

    def ensure_worker(self) -> None:
        """Restart the worker thread if it died (normally it restarts itself on the way out)."""
        with self._lock:
            thread = self._thread
            dead = thread is not None and not thread.is_alive() and not self._stopping.is_set()
        if dead and thread is not None:
            self._after_death(f"the worker thread {thread.name!r} was found dead", thread)

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the worker; a running job is interrupted and left for the next start to mark."""
        self._stopping.set()
        if self._current is not None:
            self.executor.interrupt.set()
        self._wake.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout)
        self.runner.close()
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None

    def drain(self) -> list[JobRecord]:
        """Run every queued job on this thread (no worker needed); returns their records."""
        self._subscribe_bus()
        records = []
        while (spec := self._pop()) is not None:
            record = self._run_scheduled(spec, wait=False)
            if record is not None:
                records.append(record)
        return records

    # --- the worker -------------------------------------------------------------------------------
    def _subscribe_bus(self) -> None:
        if self._unsubscribe is None:
            self._unsubscribe = self.executor.bus.subscribe(self._on_event)

    def _worker_main(self) -> None:
        """The worker thread: runs :meth:`_worker`; if anything ends it but :meth:`stop`, the job it
        was running is recorded as failed and a fresh worker thread takes over."""
        try:
            self._worker()
            return
        except BaseException as exc:  # noqa: BLE001 - the queue must outlive whatever killed the loop
            reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            log.error("the job worker died: %s", reason, exc_info=exc)
        self._after_death(reason, threading.current_thread())

    def _after_death(self, reason: str, dead: threading.Thread) -> None:
        """Record the job ``dead`` was running as failed and start a fresh worker (once per death)."""
        with self._lock:
            if self._stopping.is_set() or self._thread is not dead:
                return  # stopping, or another caller already replaced it
            spec, self._current = self._current, None
            self._health.restarts += 1
            self._health.last_death = reason
            self._thread = None  # claimed: a concurrent caller now sees it replaced
        if spec is not None:
            self._record_failure(spec, f"{WORKER_DIED_MESSAGE} ({reason})")
        log.warning("restarting the job worker (restart #%d)", self._health.restarts)
        with self._lock:
            if not self._stopping.is_set():
                self._launch()

    def _worker(self) -> None:
        while not self._stopping.is_set():
            self._wake.clear()
            try:
                self._flush_unsaved()
                self._do_free()
                spec = self._pop()
            except StorageError as exc:  # a full disk: keep trying, the server answers 507 meanwhile
                self._storage_failed(exc)
                self._wake.wait(STORAGE_RETRY_S)
                continue
            if spec is None:
                self._wake.wait(1.0)
                continue
            try:
                self._run_scheduled(spec)
            except Exception as exc:  # the worker must survive anything a job does
                log.exception("job %s: unexpected failure in the queue worker", spec.prompt_id)
                self._record_failure(
                    spec, f"unexpected failure in the queue worker: {type(exc).__name__}: {exc}"
                )

    def _record_failure(self, spec: JobSpec, message: str) -> None:
        """Record ``spec`` as failed with ``message`` (when its run cannot record itself)."""
        error = {"type": "worker_failure", "message": message, "exception_message": message}
        note = [
            "execution_error",
            {
                "prompt_id": spec.prompt_id,
                "exception_message": message,
                "exception_type": "WorkerFailure",
                "timestamp": int(time.time() * 1000),
            },
        ]
        record = JobRecord.failed(spec, error, note)
        self._save(record)
        self._notify(JobFinished(record))
        self._notify_remaining()

    def _save(self, record: JobRecord) -> None:
        """Persist a finished job; while the store fails, keep it in memory (still visible)."""
        with self._finished:
            try:
                self.store.finish(record)
            except StorageError as exc:
                self._unsaved[record.spec.prompt_id] = record
                self._storage_failed(exc)
            if self._current is not None and self._current.prompt_id == record.spec.prompt_id:
                self._current = None
            self._finished.notify_all()

    def _flush_unsaved(self) -> None:
        with self._lock:
            pending = list(self._unsaved.values())
        for record in pending:
            self.store.finish(record)  # StorageError: the worker retries later
            with self._lock:
                self._unsaved.pop(record.spec.prompt_id, None)
        with self._lock:
            if pending or self._health.storage_error:
                self._health.storage_error = None

    def _storage_failed(self, exc: StorageError) -> None:
        with self._lock:
            first = self._health.storage_error is None
            self._health.storage_error = str(exc)
        if first:
            log.error("%s", exc)

    def _notify_remaining(self) -> None:
        try:
            self._notify(QueueChanged(self.remaining()))
        except StorageError as exc:
            self._storage_failed(exc)

    def _pop(self) -> JobSpec | None:
        """Take the next job and make it current in one step (so cancel never misses it)."""
        with self._lock:
            spec = self.store.pop_next()
            if spec is not None:
                self._current, self._progress, self._messages = spec, JobProgress(), []
                self._rider_progress.pop(spec.prompt_id, None)
            return spec

    def _do_free(self) -> None:
        with self._lock:
            unload, free_memory = self._free_request
            self._free_request = (False, False)
        if not (unload or free_memory):
            return
        self.runner.free(unload_models=unload, free_memory=free_memory)
        log.info("freed memory (unload_models=%s, free_memory=%s)", unload, free_memory)

    def _notify(self, notice: Notice) -> None:
        self._listeners.notify(notice)
