"""One attempt of a job on a worker, as the Ray queue (``ray_queue.py``) tracks it.

A :class:`Flight` is a job out on a worker: the attempt sent, the progress seen, the status messages
its history record keeps, and the events held back until the attempt's files are stored under
their final names (``executed`` events that name files, the closing events and whatever follows
them); progress, previews and ``executing`` events pass straight through. The queue publishes every
event of an attempt as an :class:`AttemptEvent`, and an :class:`ExecutionRetry` when a worker died
and the job runs again. The queue holds its lock around the calls that change a flight.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from engine import events as ev
from engine.executor import RunResult
from engine.jobs.records import JobEvent, JobProgress
from engine.jobs.spec import JobSpec

_STATUS_MESSAGES = frozenset(
    {"execution_start", "execution_cached", "execution_success", "execution_error", "execution_interrupted"}
)
_CLOSING = (ev.ExecutionSuccess, ev.ExecutionError, ev.ExecutionInterrupted)


@dataclass(frozen=True)
class ExecutionRetry(ev.Event):
    """A job's worker died; the job runs again (``attempt`` is the new attempt's number)."""

    type: ClassVar[str] = "execution_retry"
    attempt: int = 2
    previous_worker: str = ""
    reason: str = ""
    timestamp: int = field(default_factory=lambda: int(time.time() * 1000))


@dataclass(frozen=True)
class AttemptEvent(JobEvent):
    """A job event with the attempt that produced it and the worker it ran on."""

    attempt: int = 1
    worker_id: str = ""


@dataclass
class Flight:
    """A job out on a worker."""

    spec: JobSpec
    worker_id: str
    attempt: int
    started_at: float = field(default_factory=time.time)
    progress: JobProgress = field(default_factory=JobProgress)
    messages: list[list[Any]] = field(default_factory=list)
    held: list[ev.Event] = field(default_factory=list)
    began: bool = False  # the worker reported execution_start
    cancel: bool = False

    def task(self) -> JobSpec:
        """What the worker is sent for this attempt: the job, with its attempt number."""
        return replace(self.spec, attempt=self.attempt)

    def observe(self, event: ev.Event) -> bool:
        """Account for a streamed event; True when it is held back (published by :meth:`release`)."""
        if isinstance(event, ev.ExecutionStart):
            self.began = True
        self.progress = self.progress.after(event)
        if event.type in _STATUS_MESSAGES:
            self.messages.append([event.type, event.data()])
        hold = (
            bool(self.held)
            or isinstance(event, _CLOSING)
            or (isinstance(event, ev.Executed) and _names_files(event.output))
        )
        if hold or (isinstance(event, ev.Executing) and event.node is None and self.held):
            self.held.append(event)
            return True
        return False

    def release(self, outputs: dict[str, Any]) -> list[ev.Event]:
        """The held events, ``executed`` ones naming the stored files (``outputs``, per node)."""
        released = []
        for event in self.held:
            if isinstance(event, ev.Executed) and event.node in outputs:
                event = ev.Executed(event.prompt_id, node=event.node, output=outputs[event.node])
            released.append(event)
        return released

    def use_outputs(self, outputs: dict[str, Any]) -> None:
        """Point the recorded ``executed`` messages at the stored files."""
        self.messages = [
            [m[0], {**m[1], "output": outputs[m[1]["node"]]}]
            if m[0] == "executed" and m[1].get("node") in outputs
            else m
            for m in self.messages
        ]

    def record_messages(self, result: RunResult) -> list[list[Any]]:
        """The status messages for the history record (an invalid job's error added if missing)."""
        messages = list(self.messages)
        if result.status == "invalid" and not any(m[0] == "execution_error" for m in messages):
            messages.append(["execution_error", {"prompt_id": self.spec.prompt_id, **(result.error or {})}])
        return messages


def _names_files(output: dict[str, Any]) -> bool:
    return any(
        isinstance(item, dict) and "filename" in item
        for items in output.values()
        if isinstance(items, list)
        for item in items
    )
