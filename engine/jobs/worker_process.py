"""``serve --isolate-jobs``: each job's workflow runs in a worker process the server starts and
restarts, so ``/interrupt`` always works and a crash fails one job.

:class:`ProcessRunner` is the :class:`~engine.jobs.runner.JobRunner` of a
:class:`~engine.jobs.queue.LocalJobQueue` that keeps, in the server's process, the queue, the
history, the websocket events and the previews. One worker process at a time
(``engine/jobs/worker_child.py``, started with multiprocessing's ``spawn``) holds the runtime —
registry, plugins, memory manager, output cache, built by the same factory ``main.py`` uses — and
runs the jobs it is sent; its events come back over a pipe and are emitted on the queue's bus as
the in-process executor emits them, and it writes outputs into the same folders. Its models stay
resident between jobs: a fresh process starts only after the last one died or was ended.

- ``/interrupt`` (or deleting the running job) sets the queue's interrupt flag; the runner passes
  it on, and a node that has not returned ``grace_s`` seconds later has its process ended
  (SIGKILL): the job ends as interrupted, the next runs in a fresh process.
- A process that dies (``os._exit``, a segfault, the kernel's OOM killer) fails only its job, with
  an error naming the exit and the node that was running; the next job runs in a fresh process.

The cost: models load again after a process was ended or died, and queued jobs are not coalesced
(each job's models are still read ahead during the job before it, inside the worker process).
"""

from __future__ import annotations

import argparse
import atexit
import logging
import multiprocessing
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from engine import events as ev
from engine.context import NoModels
from engine.distributed.cli import worker_config
from engine.distributed.worker import WorkerConfig
from engine.executor import Executor, RunResult, Status
from engine.jobs.queue import LocalJobQueue
from engine.jobs.spec import JobSpec
from engine.jobs.store import JobStore
from engine.jobs.worker_child import child_main
from engine.jobs.worker_watch import WAKE, Child, Exited, StartFailed, Watch, describe_exit

log = logging.getLogger("loom.jobs.worker_process")

DEFAULT_GRACE_S = 5.0
STOP_WAIT_S = 10.0  # how long a worker process may take to exit when asked, before it is killed
PluginMessage = Callable[[str, Any, str | None], None]


class ProcessRunner:
    """Runs each job in a worker process (see the module docstring). ``executor`` is the server's:
    its bus receives the worker's events, its interrupt flag stops the job, its registry names the
    plugin pack of a node that crashed."""

    def __init__(
        self,
        config: WorkerConfig,
        executor: Executor,
        *,
        grace_s: float = DEFAULT_GRACE_S,
        verbose: bool = False,
        on_plugin_message: PluginMessage | None = None,
    ) -> None:
        self.config = config
        self.executor = executor
        self.grace_s = grace_s
        self.verbose = verbose
        self.on_plugin_message = on_plugin_message
        self._context = multiprocessing.get_context("spawn")
        self._lock = threading.Lock()
        self._child: Child | None = None
        self._watch: Watch | None = None
        self._upcoming: tuple[JobSpec | None, list[JobSpec]] = (None, [])
        self._stats: dict[str, Any] = {}
        self._health: dict[str, Any] = {"pid": None, "starts": 0, "ended": 0, "died": 0, "last_exit": None}
        self._closed = False
        executor.interrupt.on_set(self._on_interrupt)
        # before multiprocessing's own exit hook, which would wait for a worker still reading its pipe
        atexit.register(self.close)

    # --- JobRunner ---------------------------------------------------------------------------------
    def start(self) -> None:
        with self._lock:
            self._closed = False
            self._child_locked()

    def run(self, spec: JobSpec) -> RunResult:
        started = time.perf_counter()
        self.executor.interrupt.clear()  # as Executor.run does; a cancel between pop and here is re-sent
        watch = Watch(spec)
        following, queued = self._upcoming
        with self._lock:
            child = self._child_locked()
            self._watch = watch
        try:
            child.send(("run", spec, following, queued))
            outcome = self._wait(child, watch)
        finally:
            with self._lock:
                self._watch = None
        if isinstance(outcome, RunResult):
            return outcome
        result = self._unfinished(child, watch, outcome)
        result.timings["total_s"] = round(time.perf_counter() - started, 6)
        return result

    def free(self, *, unload_models: bool, free_memory: bool) -> None:
        with self._lock:
            child = self._child
        if child is not None:
            child.send(("free", unload_models, free_memory))

    def force_stop_in(self) -> float | None:
        with self._lock:
            watch, child = self._watch, self._child
        deadline = self._deadline(child, watch)
        return None if deadline is None else max(0.0, deadline - time.monotonic())

    def health(self) -> dict[str, Any] | None:
        with self._lock:
            child = self._child
            alive = child is not None and child.process.is_alive()
            return {
                **self._health,
                "mode": "worker process (--isolate-jobs)",
                "alive": alive,
                "ready": alive and child is not None and child.ready_at is not None,
                "grace_s": self.grace_s,
            }

    def stats(self) -> dict[str, Any]:
        """The worker process's memory figures as it last reported them (after each job and /free)."""
        with self._lock:
            return dict(self._stats)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            child, self._child = self._child, None
        if child is not None:
            self._end(child, politely=True)

    @contextmanager
    def during(
        self, next_spec: JobSpec | None, *, current: JobSpec | None = None, queued: Sequence[JobSpec] = ()
    ) -> Iterator[None]:
        """The queue's prefetch seam: the job sent next is told which jobs follow it, and the worker
        process reads their models ahead (its own ``PlanAwarePrefetch``)."""
        self._upcoming = (next_spec, list(queued))
        try:
            yield
        finally:
            self._upcoming = (None, [])

    # --- the worker process ------------------------------------------------------------------------
    def _child_locked(self) -> Child:
        """The running worker process, started first if there is none (caller holds the lock)."""
        if self._child is not None and self._child.process.is_alive():
            return self._child
        mine, theirs = self._context.Pipe(duplex=True)
        process = self._context.Process(
            target=child_main, args=(theirs, self.config, self.verbose), name="loom-job-worker"
        )
        process.start()
        theirs.close()  # this end is the child's now: its exit closes the pipe (EOF here)
        child = Child(process, mine)
        self._child = child
        self._health["starts"] += 1
        self._health["pid"] = process.pid
        child.reader = threading.Thread(
            target=self._read, args=(child,), name="loom-job-worker-pipe", daemon=True
        )
        child.reader.start()
        log.info("started the job worker process (pid %d)", process.pid)
        return child

    def _read(self, child: Child) -> None:
        """Relay the worker's messages until its pipe closes, then report its exit."""
        while True:
            try:
                message = child.conn.recv()
            except (EOFError, OSError):
                break
            except Exception:  # one message that does not unpickle here; the stream goes on
                log.exception("a message from the job worker process could not be read")
                continue
            try:
                self._dispatch(child, message)
            except Exception:  # a listener's bug must not end the relay
                log.exception("relaying %r from the job worker process failed", message[0])
        child.process.join(STOP_WAIT_S)
        child.conn.close()
        code = child.process.exitcode
        with self._lock:
            on_its_own = self._child is child  # not ended by this runner
            if on_its_own:
                self._child = None
                self._health["died"] += 1
                self._health["last_exit"] = describe_exit(code)
        if on_its_own and self._watch is None:
            log.warning(
                "the job worker process %s while idle; the next job starts a fresh one", describe_exit(code)
            )
        child.inbox.put(Exited(code))

    def _dispatch(self, child: Child, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "event":
            event: ev.Event = message[1]
            with self._lock:
                watch = self._watch
            if watch is not None and watch.spec.prompt_id == event.prompt_id:
                watch.observe(event)
                if isinstance(event, ev.ExecutionStart) and watch.stop_requested_at is not None:
                    child.send(("interrupt", event.prompt_id))  # it may have reached the worker too early
            self.executor.bus.emit(event)
        elif kind == "result":
            child.inbox.put(message[1])
        elif kind == "ready":
            child.pid, child.ready_at = int(message[1]), time.monotonic()
            with self._lock:
                self._stats = dict(message[2])
            log.info("the job worker process (pid %d) is ready", child.pid)
            child.inbox.put(WAKE)
        elif kind == "stats":
            with self._lock:
                self._stats = dict(message[1])
        elif kind == "failed":
            log.error("the job worker process could not start: %s", message[1])
            child.inbox.put(StartFailed(str(message[1])))
        elif kind == "plugin_message" and self.on_plugin_message is not None:
            self.on_plugin_message(message[1], message[2], message[3])

    def _on_interrupt(self) -> None:
        """The queue's interrupt flag was set (from any thread): pass it on, start the grace period."""
        with self._lock:
            watch, child = self._watch, self._child
            if watch is None or child is None or watch.stop_requested_at is not None:
                return
            watch.stop_requested_at = time.monotonic()
        child.send(("interrupt", watch.spec.prompt_id))
        child.inbox.put(WAKE)

    def _deadline(self, child: Child | None, watch: Watch | None) -> float | None:
        """When the interrupted job's process is ended: ``grace_s`` after the request, counted from
        when the process was ready (a job cancelled while it starts up is stopped as it begins)."""
        if child is None or watch is None or watch.stop_requested_at is None or child.ready_at is None:
            return None
        return max(watch.stop_requested_at, child.ready_at) + self.grace_s

    def _wait(self, child: Child, watch: Watch) -> RunResult | Exited | StartFailed | str:
        """The job's result, the process's exit, or ``"ended"`` when it was ended after the grace period."""
        while True:
            deadline = self._deadline(child, watch)
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                item = child.inbox.get(timeout=timeout)
            except queue.Empty:
                log.warning(
                    "job %s: node %s did not stop within %.1f s of the interrupt; ending its worker process",
                    watch.spec.prompt_id,
                    watch.node,
                    self.grace_s,
                )
                self._end(child, politely=False)
                return "ended"
            if isinstance(item, RunResult | Exited | StartFailed):
                return item

    def _end(self, child: Child, *, politely: bool) -> None:
        """End ``child``: asked to stop (then killed if it lingers), or killed at once."""
        with self._lock:
            if self._child is child:
                self._child = None
        if politely and child.send(("stop",)):
            child.process.join(STOP_WAIT_S)
        if child.process.is_alive():
            child.process.kill()
            child.process.join(STOP_WAIT_S)
        if not politely:
            with self._lock:
                self._health["ended"] += 1
                self._health["last_exit"] = (
                    "ended: its job did not stop within the grace period of an interrupt"
                )

    def _unfinished(self, child: Child, watch: Watch, outcome: Exited | StartFailed | str) -> RunResult:
        """The result of a job whose process did not return one; its events sent as the executor's."""
        if child.reader is not None:
            child.reader.join(STOP_WAIT_S)  # what the process sent before it ended is relayed first
        spec, node, node_type = watch.spec, watch.node, watch.node_type()
        if outcome == "ended":
            message = (
                f"Interrupted by the user; node {node} ({node_type}) did not stop within {self.grace_s:g} s, "
                "so its worker process was ended (the next job loads its models again)"
                if node is not None
                else "Interrupted by the user; its worker process was ended"
            )
            self._emit(
                ev.ExecutionInterrupted(
                    spec.prompt_id, node_id=node, node_type=node_type, executed=list(watch.executed)
                )
            )
            error: dict[str, Any] = {"type": "interrupted", "message": message, "node_id": node}
            status: Status = "interrupted"
        else:
            text = self._crash_message(watch, outcome)
            event = ev.ExecutionError(
                spec.prompt_id,
                node_id=node or "",
                node_type=node_type or "",
                executed=list(watch.executed),
                exception_message=text,
                exception_type="WorkerProcessExited"
                if isinstance(outcome, Exited)
                else "WorkerProcessFailed",
            )
            self._emit(event)
            error, status = event.data(), "error"
        self._emit(ev.Executing(spec.prompt_id, node=None))
        self._after_loss(child, outcome)
        return RunResult(
            spec.prompt_id,
            status,
            executed=list(watch.executed),
            cached=list(watch.cached),
            outputs=dict(watch.outputs),
            error=error,
            timings={"total_s": 0.0, "nodes": {}},
            memory=self.stats(),
        )

    def _crash_message(self, watch: Watch, outcome: Exited | StartFailed | str) -> str:
        if isinstance(outcome, StartFailed):
            return (
                f"the job worker process could not start: {outcome.message}; fix the cause (the server "
                "log has the traceback) — the next job tries a fresh worker process"
            )
        code = outcome.code if isinstance(outcome, Exited) else None
        node, node_type = watch.node, watch.node_type()
        if node is not None:
            definition = self.executor.registry.get(node_type or "")
            origin = getattr(definition, "origin", "core")
            pack = f" from plugin pack '{origin}'" if origin != "core" else ""
            where = f"while running node {node} ({node_type}{pack})"
        else:
            where = "before the job's first node ran (starting up, or reading models ahead)"
        return (
            f"the worker process {describe_exit(code)} {where}; only this job failed: the server is up "
            "and the next job runs in a fresh worker process (its models load again). "
            + (
                "The node's code ended the process: report it to the node's author or leave the node out"
                if node is not None
                else "The server log says more"
            )
        )

    def _after_loss(self, child: Child, outcome: Exited | StartFailed | str) -> None:
        """Forget a worker process that died or was ended; start the next one now unless it could
        not start at all (then the next job tries again)."""
        with self._lock:
            if self._child is child:
                self._child = None
            if not self._closed and not isinstance(outcome, StartFailed):
                self._child_locked()

    def _emit(self, event: ev.Event) -> None:
        try:
            self.executor.bus.emit(event)
        except Exception:  # a listener's bug must not fail the run
            log.exception("event listener failed on %s", event.type)


class WorkerModels(NoModels):
    """The server's view of the worker process's memory manager: ``/system_stats`` figures as the
    worker last reported them; ``/free`` goes through the queue."""

    def __init__(self, runner: ProcessRunner) -> None:
        self.runner = runner

    def stats(self) -> dict[str, Any]:
        return {**self.runner.stats(), "in_worker_process": True}


def make_isolated_queue(
    args: argparse.Namespace,
    executor: Executor,
    store: JobStore,
    *,
    root: Path,
    runtime_factory: str,
    on_plugin_message: PluginMessage | None = None,
) -> tuple[LocalJobQueue, WorkerModels]:
    """The server's queue with ``--isolate-jobs``: jobs run in a worker process built by
    ``runtime_factory`` (``"module:function"``, given this process's flags), restarted as needed.
    Returns the queue and the worker's memory figures for ``/system_stats``."""
    config = worker_config(args, root, runtime_factory)
    config = WorkerConfig(
        config.runtime_factory,
        config.runtime_args,
        "loom-job-worker",
        python_path=config.python_path,
        outputs_in_place=True,
        prefetch=True,
    )
    runner = ProcessRunner(
        config,
        executor,
        grace_s=float(getattr(args, "isolate_grace", DEFAULT_GRACE_S)),
        verbose=bool(getattr(args, "verbose", False)),
        on_plugin_message=on_plugin_message,
    )
    return LocalJobQueue(executor, store, prefetch=runner, runner=runner), WorkerModels(runner)
