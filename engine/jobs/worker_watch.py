"""What the server tracks of its job worker process (``engine/jobs/worker_process.py``): the
process and its pipe, the running job as its events tell it, and how a process ended, in words."""

from __future__ import annotations

import queue
import signal
import threading
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from engine import events as ev
from engine.jobs.spec import JobSpec

CRASH_SIGNALS = {signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT}


@dataclass(frozen=True)
class Exited:
    """The worker process is gone (``code``: its exit status, negative for a signal)."""

    code: int | None


@dataclass(frozen=True)
class StartFailed:
    message: str


WAKE = "wake"  # an interrupt was requested, or the process became ready: look at the deadline again


@dataclass
class Child:
    """One worker process and the thread reading its pipe."""

    process: Any  # multiprocessing's SpawnProcess
    conn: Connection
    inbox: queue.Queue[Any] = field(default_factory=queue.Queue)  # results, exits, wake-ups
    ready_at: float | None = None  # monotonic time its runtime was built
    pid: int | None = None
    send_lock: threading.Lock = field(default_factory=threading.Lock)
    reader: threading.Thread | None = None  # relays its messages; ends once its pipe closed

    def send(self, message: tuple[Any, ...]) -> bool:
        try:
            with self.send_lock:
                self.conn.send(message)
            return True
        except (OSError, ValueError):  # it died meanwhile: its reader reports the exit
            return False


@dataclass
class Watch:
    """What the server knows of the job running in the worker process (from its events)."""

    spec: JobSpec
    node: str | None = None
    executed: list[str] = field(default_factory=list)
    cached: list[str] = field(default_factory=list)
    outputs: dict[str, Any] = field(default_factory=dict)
    stop_requested_at: float | None = None

    def observe(self, event: ev.Event) -> None:
        if event.prompt_id != self.spec.prompt_id:
            return
        if isinstance(event, ev.Executing):
            if self.node is not None:
                self.executed.append(self.node)  # a node's Executing comes once the one before ran
            self.node = event.node
        elif isinstance(event, ev.ExecutionCached):
            self.cached.extend(n for n in event.nodes if n not in self.cached)
        elif isinstance(event, ev.Executed):
            self.outputs[event.node] = event.output

    def node_type(self) -> str | None:
        if self.node is None:
            return None
        entry = self.spec.prompt.get(self.node)
        return str(entry.get("class_type")) if isinstance(entry, dict) else None


def describe_exit(code: int | None) -> str:
    """How a process ended, in words: ``exited with code 3``, ``exited with signal 11 (SIGSEGV, ...)``."""
    if code is None:
        return "stopped answering"
    if code >= 0:
        return f"exited with code {code}"
    number = -code
    try:
        sig = signal.Signals(number)
    except ValueError:
        return f"exited with signal {number}"
    if sig in CRASH_SIGNALS:
        return f"exited with signal {number} ({sig.name}: a crash in native code)"
    if sig == signal.SIGKILL:
        return f"exited with signal {number} (SIGKILL: killed, often by the kernel's out-of-memory killer)"
    return f"exited with signal {number} ({sig.name})"
