"""The Ray implementation of the :class:`~engine.jobs.queue.JobQueue` protocol.

The server's SQLite :class:`~engine.jobs.store.JobStore` stays the record of truth; Ray carries the work.
A dispatcher thread asks the :class:`~engine.distributed.router.Router` where pending jobs go and
starts one driver thread per running job, which streams the attempt's events from its worker and,
at the end, stores the returned files (:class:`~engine.distributed.outputs.OutputStore`) and the
history record.

Faults. A job stays ``pending`` in the store until its record is in the history, so a server that
stops or crashes re-runs its unfinished jobs when it starts again (jobs a single-process server
left ``running`` are re-queued too). A worker that dies mid-job (:class:`WorkerLost`) leaves no
files behind; the job keeps its place in the queue and runs again with ``attempt + 1`` and subscribers get
an :class:`~engine.distributed.attempt.ExecutionRetry` event. Every event notice is an
:class:`~engine.distributed.attempt.AttemptEvent` (a :class:`~engine.jobs.records.JobEvent` carrying the
attempt and the worker).

Outputs reach the server when the attempt ends, so ``executed`` events that name files, and the
closing events, are held back until the files are stored under their final names; progress,
previews and ``executing`` events stream live (each attempt's state and what it holds back:
:class:`~engine.distributed.attempt.Flight`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from engine import events as ev
from engine.context import Folders
from engine.distributed.attempt import AttemptEvent, ExecutionRetry, Flight
from engine.distributed.outputs import OutputRefused, OutputStore
from engine.distributed.router import Router, Ticket
from engine.distributed.worker import JobOutcome, WorkerEvent, WorkerLost
from engine.events import Listeners
from engine.executor import RunResult, Status
from engine.jobs.records import JobFinished, JobRecord, JobView, Notice, NoticeListener, QueueChanged
from engine.jobs.spec import JobSpec
from engine.jobs.store import JobStore

log = logging.getLogger("loom.distributed.queue")

ModelOf = Callable[[dict[str, Any]], str | None]


class WorkerPool(Protocol):
    """What the queue needs from the pool (``pool.RayWorkerPool``; tests may fake it)."""

    def discover(self) -> tuple[list[str], list[str]]: ...
    def run(self, name: str, task: JobSpec) -> Any: ...
    def tell(self, name: str, method: str, *args: Any) -> None: ...
    def forget(self, name: str) -> None: ...


@dataclass(frozen=True)
class QueueSettings:
    max_attempts: int = 3  # attempts that started and lost their worker before the job fails
    discover_every_s: float = 2.0
    default_load_s: float = 5.0  # routing estimates until workers have measured some
    default_run_s: float = 5.0


class RayJobQueue:
    """Jobs from a :class:`JobStore`, run by a pool of workers with model-affinity routing."""

    def __init__(
        self,
        store: JobStore,
        pool: WorkerPool,
        folders: Folders,
        *,
        model_of: ModelOf | None = None,
        settings: QueueSettings | None = None,
        router: Router | None = None,
        on_stop: Callable[[], None] | None = None,
    ) -> None:
        self.store = store
        self.on_stop = on_stop
        self.pool = pool
        self.settings = settings or QueueSettings()
        self.router = router or Router(
            default_load_s=self.settings.default_load_s, default_run_s=self.settings.default_run_s
        )
        self.model_of: ModelOf = model_of or (lambda prompt: None)
        self.outputs = OutputStore(folders.output_dir, folders.temp_dir)
        self._lock = threading.RLock()
        self._finished = threading.Condition(self._lock)
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._listeners: Listeners[Notice] = Listeners(isolate=True, what="job queue listener")
        self._flights: dict[str, Flight] = {}
        self._attempts: dict[str, int] = {}  # next attempt number of jobs that lost a worker
        self._started_losses: dict[str, int] = {}
        self._model_names: dict[str, str | None] = {}  # prompt id -> the model its workflow loads (routing)
        self._drivers: set[threading.Thread] = set()
        self._thread: threading.Thread | None = None
        self._last_discovery = 0.0
        self.recovered = self._requeue_running()

    # --- lifecycle ----------------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            return
        self._stopping.clear()
        self._thread = threading.Thread(target=self._dispatch_loop, name="loom-ray-dispatch", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop dispatching; running jobs are interrupted and stay queued for the next start."""
        self._stopping.set()
        with self._lock:
            flights = list(self._flights.values())
        for flight in flights:
            self.pool.tell(flight.worker_id, "interrupt", flight.spec.prompt_id)
        self._wake.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout)
        for driver in list(self._drivers):
            driver.join(timeout)
        if self.on_stop is not None:
            self.on_stop()

    def wait(self, prompt_id: str, timeout: float | None = None) -> JobRecord | None:
        """Block until the job is in the history (or the timeout passes)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._finished:
            while (record := self.store.record(prompt_id)) is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self._finished.wait(0.5 if left is None else min(left, 0.5))
            return record

    def drain(self, timeout: float | None = None) -> list[JobRecord]:
        """Start if needed and wait until every queued job has finished; returns their records."""
        ids = [s.prompt_id for s in self.store.jobs("pending")]
        self.start()
        records = [self.wait(pid, timeout) for pid in ids]
        return [r for r in records if r is not None]

    # --- the JobQueue protocol ------------------------------------------------------------------------
    def submit(self, spec: JobSpec, *, front: bool = False, number: float | None = None) -> JobSpec:
        self.store.enqueue(spec, front=front, number=number)
        self._wake.set()
        self._notify(QueueChanged(self.remaining()))
        return spec

    def cancel(self, prompt_id: str, *, record: bool = True) -> bool:
        """Pending → removed (recorded as cancelled if ``record``); running → interrupted on its worker."""
        with self._lock:
            if self.interrupt(prompt_id):
                return True
            spec = self.store.remove(prompt_id, "pending")
            self._model_names.pop(prompt_id, None)
            self._attempts.pop(prompt_id, None)
        if spec is None:
            return False
        if record:
            cancelled = JobRecord.cancelled_before_start(spec)
            self.store.finish(cancelled)
            self._notify(JobFinished(cancelled))
        self._notify(QueueChanged(self.remaining()))
        return True

    def interrupt(self, prompt_id: str | None = None) -> bool:
        """Interrupt the running job ``prompt_id`` (every running job when None) on its worker."""
        with self._lock:
            flights = [f for f in self._flights.values() if prompt_id in (None, f.spec.prompt_id)]
            for flight in flights:
                flight.cancel = True
        for flight in flights:
            self.pool.tell(flight.worker_id, "interrupt", flight.spec.prompt_id)
        return bool(flights)

    def clear_pending(self) -> int:
        with self._lock:
            flying = set(self._flights)
            removed = [
                s
                for s in self.store.jobs("pending")
                if s.prompt_id not in flying and self.store.remove(s.prompt_id, "pending")
            ]
        self._notify(QueueChanged(self.remaining()))
        return len(removed)

    def schedule_free(self, *, unload_models: bool, free_memory: bool) -> None:
        """ComfyUI's /free on every worker (each does it between jobs)."""
        for name in self.router_workers():
            self.pool.tell(name, "free", unload_models, free_memory)
        if unload_models:
            with self._lock:
                self.router.forget_resident()

    def get(self, prompt_id: str) -> JobView | None:
        with self._lock:
            flight = self._flights.get(prompt_id)
            if flight is not None:
                return JobView(flight.spec, "running", flight.progress)
        queued = self.store.queued(prompt_id)
        if queued is not None:
            return JobView(queued[1], "queued")
        record = self.store.record(prompt_id)
        return JobView(record.spec, record.status, record=record) if record else None

    def running(self) -> list[JobSpec]:
        with self._lock:
            return sorted((f.spec for f in self._flights.values()), key=lambda s: s.number)

    def pending(self) -> list[JobSpec]:
        with self._lock:
            flying = set(self._flights)
        return [s for s in self.store.jobs("pending") if s.prompt_id not in flying]

    def remaining(self) -> int:
        return self.store.count()

    def history(self, max_items: int | None = None, offset: int = 0) -> list[JobRecord]:
        return self.store.history(max_items, offset, ran_only=True)

    def delete_history(self, prompt_ids: list[str]) -> None:
        self.store.delete_history(prompt_ids)

    def clear_history(self) -> None:
        self.store.clear_history()

    def damaged_report(self) -> dict[str, Any]:
        """The job database's damaged rows, set aside (see :meth:`JobStore.damaged_report`)."""
        return self.store.damaged_report()

    def subscribe(self, listener: NoticeListener) -> Callable[[], None]:
        return self._listeners.subscribe(listener)

    # --- looking at the cluster ----------------------------------------------------------------------
    def router_workers(self) -> list[str]:
        with self._lock:
            return [slot.worker_id for slot in self.router.workers()]

    def cluster(self) -> dict[str, Any]:
        """Per-worker figures for ``/system_stats`` and logs: what the router believes (resident
        model, running job) and, when the pool can ask, the worker's own accounting."""
        with self._lock:
            slots = [(s.worker_id, s.resident, s.job_id) for s in self.router.workers()]
        ask = getattr(self.pool, "call", None)
        workers: dict[str, Any] = {}
        for name, resident, job in slots:
            entry: dict[str, Any] = {"resident_model": resident, "running": job}
            if callable(ask):
                try:
                    stats = ask(name, "stats", timeout=2.0)
                    entry.update(
                        {k: stats.get(k) for k in ("jobs", "loads", "evictions", "load_s", "device")}
                    )
                except Exception as exc:  # a busy or dying worker must not break the stats page
                    entry["error"] = f"{type(exc).__name__}: {exc}"
            workers[name] = entry
        est = self.router.estimates
        return {"workers": workers, "load_s": dict(est.load_s), "run_s": dict(est.run_s)}

    def assignments(self) -> dict[str, str]:
        """Running job id -> worker id."""
        with self._lock:
            return {pid: f.worker_id for pid, f in self._flights.items()}

    # --- dispatching -------------------------------------------------------------------------------
    def _requeue_running(self) -> list[JobSpec]:
        """Jobs a previous process left 'running' go back to the queue (keeping their place)."""
        requeued = []
        for spec in self.store.jobs("running"):
            if self.store.remove(spec.prompt_id, "running") is not None:
                self.store.add_pending(spec)
                requeued.append(spec)
                log.warning("job %s was running when the server stopped; queued again", spec.prompt_id)
        return requeued

    def _dispatch_loop(self) -> None:
        while not self._stopping.is_set():
            self._wake.clear()
            try:
                self._discover()
                self._schedule()
            except Exception:  # the dispatcher must survive a flaky cluster
                log.exception("dispatching failed; retrying")
            self._wake.wait(min(1.0, self.settings.discover_every_s))

    def _discover(self) -> None:
        now = time.monotonic()
        if now - self._last_discovery < self.settings.discover_every_s and self.router.workers():
            return
        self._last_discovery = now
        ready, gone = self.pool.discover()
        with self._lock:
            for name in gone:
                self.router.remove_worker(name)
                log.warning("worker %s left the cluster", name)
            for name in ready:
                if self.router.slot(name) is None:
                    self.router.add_worker(name)
                    log.info("worker %s joined", name)

    def _schedule(self) -> None:
        with self._lock:
            if self._stopping.is_set():
                return
            pending = [s for s in self.store.jobs("pending") if s.prompt_id not in self._flights]
            if not pending:
                return
            tickets = [Ticket(s.prompt_id, self._model(s)) for s in pending]
            by_id = {s.prompt_id: s for s in pending}
            flights = []
            for assignment in self.router.plan(tickets):
                spec = by_id[assignment.job_id]
                attempt = self._attempts.get(spec.prompt_id, 1)
                flight = Flight(spec, assignment.worker_id, attempt)
                self._flights[spec.prompt_id] = flight
                flights.append(flight)
                log.info(
                    "job %s -> %s (%s, attempt %d)",
                    spec.prompt_id[:8],
                    assignment.worker_id,
                    assignment.reason,
                    attempt,
                )
        for flight in flights:
            driver = threading.Thread(
                target=self._drive,
                args=(flight,),
                daemon=True,
                name=f"loom-ray-job-{flight.spec.prompt_id[:8]}",
            )
            self._drivers.add(driver)
            driver.start()
        if flights:
            self._notify(QueueChanged(self.remaining()))

    def _model(self, spec: JobSpec) -> str | None:
        if spec.prompt_id not in self._model_names:
            try:
                self._model_names[spec.prompt_id] = self.model_of(spec.prompt)
            except Exception:  # an odd workflow must not stop routing; the worker will report it
                self._model_names[spec.prompt_id] = None
        return self._model_names[spec.prompt_id]

    # --- one attempt -------------------------------------------------------------------------------
    def _drive(self, flight: Flight) -> None:
        spec = flight.spec
        outcome: JobOutcome | None = None
        try:
            for item in self.pool.run(flight.worker_id, flight.task()):  # to its end: the worker is idle then
                if isinstance(item, WorkerEvent):
                    self._on_event(flight, item.event)
                elif isinstance(item, JobOutcome):
                    outcome = item
            if outcome is None:
                raise RuntimeError(
                    f"worker {flight.worker_id} ended the stream of {spec.prompt_id} without a result"
                )
            self._complete(flight, outcome)
        except WorkerLost as exc:
            self._lost(flight, str(exc))
        except OutputRefused as exc:  # the job's own mistake (a link out of the output folder): no traceback
            log.warning("job %s: outputs refused: %s", spec.prompt_id, exc)
            self._fail(flight, "output_refused", str(exc))
        except Exception as exc:
            log.exception("job %s: attempt %d failed on %s", spec.prompt_id, flight.attempt, flight.worker_id)
            self._fail(flight, type(exc).__name__, str(exc))
        finally:
            self._drivers.discard(threading.current_thread())
            self._wake.set()

    def _fail(self, flight: Flight, kind: str, message: str) -> None:
        result = RunResult(flight.spec.prompt_id, "error", error={"type": kind, "message": message})
        with self._lock:
            self.router.finished(flight.worker_id, run_s=0.0, load_s=0.0)
        self._record(flight, result)

    def _on_event(self, flight: Flight, event: ev.Event) -> None:
        with self._lock:
            if flight.observe(event):
                return  # published when the attempt's files are stored
        self._notify(AttemptEvent(flight.spec, event, flight.attempt, flight.worker_id))

    def _complete(self, flight: Flight, outcome: JobOutcome) -> None:
        if self._stopping.is_set() and outcome.result.status == "interrupted":
            with self._lock:
                self._flights.pop(flight.spec.prompt_id, None)
            return  # stays queued in the store: the next start runs it
        result = outcome.result
        outputs = self.outputs.commit(flight.spec.prompt_id, outcome.attempt, outcome.files, result.outputs)
        if outputs is None:
            log.warning(
                "job %s: attempt %d finished after another attempt's outputs were stored; dropped",
                flight.spec.prompt_id,
                outcome.attempt,
            )
            with self._lock:
                if self._flights.get(flight.spec.prompt_id) is flight:
                    self._flights.pop(flight.spec.prompt_id)
                self.router.finished(flight.worker_id, run_s=outcome.run_s, load_s=outcome.load_s)
            return
        result.outputs = outputs
        for event in flight.release(outputs):  # now the files exist under their final names
            self._notify(AttemptEvent(flight.spec, event, flight.attempt, flight.worker_id))
        with self._lock:
            flight.use_outputs(outputs)
            self.router.finished(flight.worker_id, run_s=outcome.run_s, load_s=outcome.load_s)
        self._record(flight, result)

    def _record(self, flight: Flight, result: RunResult) -> None:
        spec = flight.spec
        record = JobRecord.from_result(spec, result, flight.record_messages(result), flight.started_at)
        with self._finished:
            self.store.finish(record)
            self._flights.pop(spec.prompt_id, None)
            self._attempts.pop(spec.prompt_id, None)
            self._started_losses.pop(spec.prompt_id, None)
            self._model_names.pop(spec.prompt_id, None)
            self._finished.notify_all()
        self._notify(JobFinished(record))
        self._notify(QueueChanged(self.remaining()))

    def _lost(self, flight: Flight, reason: str) -> None:
        """The worker died mid-attempt: forget it and queue the job again (or give up on it)."""
        spec = flight.spec
        self.pool.forget(flight.worker_id)
        with self._lock:
            self.router.remove_worker(flight.worker_id)
            losses = self._started_losses.get(spec.prompt_id, 0) + int(flight.began)
            self._started_losses[spec.prompt_id] = losses
            give_up = flight.cancel or losses >= self.settings.max_attempts
            if not give_up:
                self._attempts[spec.prompt_id] = flight.attempt + 1
                self._flights.pop(spec.prompt_id, None)
        log.warning("job %s: %s", spec.prompt_id, reason)
        if give_up:
            status: Status = "interrupted" if flight.cancel else "error"
            message = (
                "cancelled; its worker died meanwhile"
                if flight.cancel
                else f"its worker died {losses} times while running it (last: {reason}); "
                "the job may need more memory than a worker has"
            )
            result = RunResult(spec.prompt_id, status, error={"type": "worker_lost", "message": message})
            self._record(flight, result)
            return
        retry = ExecutionRetry(
            spec.prompt_id, attempt=flight.attempt + 1, previous_worker=flight.worker_id, reason=reason
        )
        self._notify(AttemptEvent(spec, retry, flight.attempt + 1, ""))
        self._notify(QueueChanged(self.remaining()))

    def _notify(self, notice: Notice) -> None:
        self._listeners.notify(notice)
