"""The job worker process of ``serve --isolate-jobs``: the child side of
:class:`~engine.jobs.worker_process.ProcessRunner`.

:func:`child_main` runs in a fresh interpreter (multiprocessing's ``spawn``). It builds a
:class:`~engine.distributed.worker.LoomWorker` from the :class:`~engine.distributed.worker.WorkerConfig`
the server sends, so the runtime (registry, plugins, memory manager, executor) comes from the same
factory ``main.py`` uses (an import path such as ``"main:build_worker_runtime"``), and runs the jobs
the server sends, one at a time, on a thread of their own, while this process's main thread keeps
reading the pipe (so an interrupt arrives while a node runs).

Messages are tuples whose first item says what they are. From the server:

- ``("run", spec, following, queued)``: run the job ``spec`` (the jobs after it are read ahead);
- ``("interrupt", prompt_id)``: stop that job cooperatively (the executor's interrupt flag);
- ``("free", unload_models, free_memory)``: ComfyUI's /free (now when idle, else after the job);
- ``("stop",)``: exit.

To the server: ``("ready", pid, stats)`` once the runtime is built (or ``("failed", message)``),
then per job its ``("event", event)`` messages and one ``("result", result)``; ``("stats", stats)``
(the memory manager's figures) after each job and each /free; ``("plugin_message", event, data, sid)``
for a pack's ``PromptServer.instance.send_sync``.

The process ignores Ctrl-C (the server ends it) and exits when the pipe closes (the server is gone).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Any

from engine import events as ev
from engine.distributed.worker import JobOutcome, LoomWorker, WorkerConfig
from engine.executor import RunResult
from engine.jobs.spec import JobSpec

log = logging.getLogger("loom.jobs.worker_process")


class Outbox:
    """The pipe to the server, shared by the job thread and the main thread."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._lock = threading.Lock()

    def send(self, message: tuple[Any, ...]) -> None:
        try:
            with self._lock:
                self.conn.send(message)
        except (BrokenPipeError, EOFError, ConnectionResetError):
            os._exit(0)  # the server is gone: nothing is left to run for
        except Exception:  # something in the message does not pickle: say so, keep the job going
            log.exception("could not send %r to the server", message[0])
            if message[0] == "result":
                with self._lock:
                    self.conn.send(("result", plain_result(message[1])))


def plain_result(result: RunResult) -> RunResult:
    """``result`` with its JSON parts made plain (for a plugin's value that does not pickle)."""
    data = json.loads(json.dumps(result.to_json(), default=str))
    return RunResult(
        result.prompt_id,
        result.status,
        executed=data["executed"],
        cached=data["cached"],
        outputs=data["outputs"],
        node_errors=data["node_errors"],
        error=data["error"],
        timings=data["timings"],
        memory=data["memory"],
        images=dict(result.images),
    )


class ChildWorker:
    """This process's :class:`LoomWorker` behind the pipe."""

    def __init__(self, worker: LoomWorker, outbox: Outbox) -> None:
        self.worker = worker
        self.outbox = outbox
        self.models = getattr(worker.runtime, "models", None)
        self._job: threading.Thread | None = None
        self._client_id: str | None = None
        self._plugins = getattr(getattr(worker.runtime, "plugin_report", None), "environment", None)
        if self._plugins is not None and hasattr(self._plugins, "event_sink"):
            self._plugins.event_sink = self._plugin_message
        # sent from the thread that emits, before the node it announces runs: a node that ends the
        # process leaves its ``executing`` event in the pipe, so the server can name it
        worker.executor.bus.subscribe(self._forward)

    def stats(self) -> dict[str, Any]:
        stats = getattr(self.models, "stats", None)
        return dict(stats()) if callable(stats) else {}

    def serve(self, conn: Connection) -> None:
        """Read the server's messages until it says stop or goes away."""
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                return
            kind = message[0]
            if kind == "run":
                self._start(*message[1:])
            elif kind == "interrupt":
                self.worker.interrupt(message[1])
            elif kind == "free":
                self.worker.free(bool(message[1]), bool(message[2]))
                if self._job is None or not self._job.is_alive():
                    self.outbox.send(("stats", self.stats()))
            elif kind == "stop":
                return
            else:
                log.warning("the server sent an unknown message %r; ignored", kind)

    def _start(self, spec: JobSpec, following: JobSpec | None, queued: Sequence[JobSpec]) -> None:
        if self._job is not None:
            self._job.join()  # the server sends one job at a time; the last one is finishing
        self._job = threading.Thread(
            target=self._run, args=(spec, following, queued), name="loom-job", daemon=True
        )
        self._job.start()

    def _run(self, spec: JobSpec, following: JobSpec | None, queued: Sequence[JobSpec]) -> None:
        result: RunResult | None = None
        self._client_id = spec.client_id
        try:
            for item in self.worker.run_job(spec, following, queued):  # its events went out as emitted
                if isinstance(item, JobOutcome):
                    result = item.result
        except BaseException as exc:  # noqa: BLE001 - the executor promises not to raise; be safe anyway
            log.exception("job %s: the worker raised", spec.prompt_id)
            result = RunResult(
                spec.prompt_id, "error", error={"type": type(exc).__name__, "message": str(exc)}
            )
        if result is None:
            result = RunResult(spec.prompt_id, "error", error={"type": "no_result", "message": "no result"})
        self.outbox.send(("result", result))
        self.outbox.send(("stats", self.stats()))

    def _forward(self, event: ev.Event) -> None:
        if self._plugins is not None and isinstance(event, ev.Executing):
            # the shim's client_id / last_node_id, as the server's plugin bridge keeps them
            self._plugins.client_id = self._client_id
            self._plugins.last_node_id = event.node
        self.outbox.send(("event", event))

    def _plugin_message(self, event: str, data: Any, sid: str | None = None) -> None:
        self.outbox.send(("plugin_message", event, data, sid))


def child_main(conn: Connection, config: WorkerConfig, verbose: bool = False) -> None:
    """The worker process: build the runtime, say ready, serve the server's messages."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the server decides
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s [job worker %(process)d]: %(message)s",
        stream=sys.stderr,
    )
    outbox = Outbox(conn)
    try:
        worker = LoomWorker(config)
    except BaseException as exc:  # noqa: BLE001 - a plugin may even sys.exit() at import
        log.exception("the job worker process could not build its runtime")
        outbox.send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    child = ChildWorker(worker, outbox)
    outbox.send(("ready", os.getpid(), child.stats()))
    child.serve(conn)
