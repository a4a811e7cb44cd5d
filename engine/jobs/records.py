"""What the job queue records: a finished job, where a job stands, and the notices a queue sends.

The job itself is :class:`~engine.jobs.spec.JobSpec`."""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from engine import events as ev
from engine.executor import RunResult, Status
from engine.jobs.spec import JobSpec, Number, check_stored

log = logging.getLogger("loom.jobs")

JobStatus = Literal["queued", "running", "succeeded", "failed", "cancelled"]
FINAL: frozenset[str] = frozenset({"succeeded", "failed", "cancelled"})
# A finished job's status from its run's (the one translation; ComfyUI's words are produced only
# where ComfyUI's shapes are, in JobRecord.comfy_history).
JOB_STATUS: Mapping[Status, JobStatus] = {
    "success": "succeeded",
    "error": "failed",
    "invalid": "failed",
    "interrupted": "cancelled",
}
_RUN_STATUS: Mapping[str, Status] = {"succeeded": "success", "cancelled": "interrupted"}  # else "error"
RESTART_MESSAGE = "interrupted by restart"
# Events ComfyUI keeps in a history entry's status.messages.
STATUS_MESSAGES = frozenset(
    {"execution_start", "execution_cached", "execution_success", "execution_error", "execution_interrupted"}
)
# The type of each stored field of a record (JobRecord.to_json), checked when one is read back.
RECORD_TYPES: Mapping[str, type | tuple[type, ...]] = {
    "spec": dict,
    "status": str,
    "run_status": (str, type(None)),
    "executed": list,
    "cached": list,
    "outputs": dict,
    "node_errors": dict,
    "error": (dict, type(None)),
    "timings": dict,
    "memory": dict,
    "messages": list,
    "started_at": (*Number, type(None)),
    "finished_at": Number,
}


@dataclass(frozen=True)
class JobProgress:
    value: int = 0
    max: int = 0
    node: str | None = None

    def after(self, event: ev.Event) -> JobProgress:
        """Where the job stands once ``event`` happened: a sampler step, or a node starting."""
        if isinstance(event, ev.Progress):
            return JobProgress(event.value, event.max, event.node)
        if isinstance(event, ev.Executing) and event.node is not None:
            return JobProgress(0, 0, event.node)
        return self


@dataclass
class JobRecord:
    """A finished job: its request (``spec``), its run's result (without image bytes, which
    :class:`KeptImageStore` keeps), the events ComfyUI's history lists, and when it ran."""

    spec: JobSpec
    result: RunResult
    messages: list[list[Any]] = field(default_factory=list)
    started_at: float | None = None
    finished_at: float = field(default_factory=time.time)

    @property
    def status(self) -> JobStatus:
        return JOB_STATUS[self.result.status]

    @property
    def outputs(self) -> dict[str, Any]:
        return self.result.outputs

    @property
    def error(self) -> dict[str, Any] | None:
        return self.result.error

    @property
    def node_errors(self) -> dict[str, Any]:
        return self.result.node_errors

    @property
    def executed(self) -> list[str]:
        return self.result.executed

    @property
    def cached(self) -> list[str]:
        return self.result.cached

    @property
    def timings(self) -> dict[str, Any]:
        return self.result.timings

    @property
    def memory(self) -> dict[str, Any]:
        return self.result.memory

    @property
    def ran(self) -> bool:
        """False for a job cancelled before it started (ComfyUI's /history does not list those)."""
        return self.started_at is not None

    def comfy_history(self) -> dict[str, Any]:
        """ComfyUI's ``/history/{id}`` value: prompt tuple, outputs, status, meta."""
        return {
            "prompt": self.spec.comfy_tuple(),
            "outputs": self.outputs,
            "status": {
                "status_str": "success" if self.status == "succeeded" else "error",
                "completed": self.status == "succeeded",
                "messages": self.messages,
            },
            "meta": {
                nid: {"node_id": nid, "display_node": nid, "parent_node": None, "real_node_id": nid}
                for nid in self.outputs
            },
        }

    def to_json(self) -> dict[str, Any]:
        """Flat, as stored since the first version (``run_status`` added: "invalid" vs "error")."""
        data = self.result.to_json()
        del data["prompt_id"]
        data.update(
            spec=self.spec.to_json(),
            status=self.status,
            run_status=self.result.status,
            messages=self.messages,
            started_at=self.started_at,
            finished_at=self.finished_at,
        )
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JobRecord:
        """The record :meth:`to_json` stored; raises ``TypeError``/``KeyError``/``ValueError`` naming
        the field when ``data`` is not one (a damaged row)."""
        check_stored(data, RECORD_TYPES, "job record", ("spec",))
        spec = JobSpec.from_json(data["spec"])
        status = data.get("run_status") or _RUN_STATUS.get(str(data.get("status")), "error")
        if status not in JOB_STATUS:
            raise ValueError(
                f"a stored job record's 'run_status' must be one of {sorted(JOB_STATUS)}, found {status!r}"
            )
        kept = {
            k: data[k]
            for k in ("executed", "cached", "outputs", "node_errors", "error", "timings", "memory")
            if k in data
        }
        result = RunResult(spec.prompt_id, status, **kept)
        return cls(
            spec, result, **{k: data[k] for k in ("messages", "started_at", "finished_at") if k in data}
        )

    @classmethod
    def failed(cls, spec: JobSpec, error: dict[str, Any], message: list[Any]) -> JobRecord:
        """A job whose run could not record itself (a restart, a worker failure)."""
        return cls(
            spec,
            RunResult(spec.prompt_id, "error", error=error, timings={}),
            messages=[message],
            started_at=spec.created_at,
        )

    @classmethod
    def cancelled_before_start(cls, spec: JobSpec) -> JobRecord:
        """A queued job removed before it ran (its history messages as ComfyUI records an interrupt)."""
        message = [
            "execution_interrupted",
            {
                "prompt_id": spec.prompt_id,
                "node_id": None,
                "node_type": None,
                "executed": [],
                "timestamp": int(time.time() * 1000),
            },
        ]
        error = {"type": "cancelled", "message": "cancelled before it started"}
        return cls(
            spec, RunResult(spec.prompt_id, "interrupted", error=error, timings={}), messages=[message]
        )

    @classmethod
    def from_result(
        cls, spec: JobSpec, result: RunResult, messages: list[list[Any]], started: float
    ) -> JobRecord:
        return cls(spec, replace(result, images={}), messages, started)


UNSTOPPABLE_AFTER_S = 2.0  # an interrupt nothing polled for this long: the node cannot be stopped


@dataclass(frozen=True)
class InterruptState:
    """A running job whose interrupt was requested: ``unheeded_s`` is how long the running code has
    not polled the flag since (None: it has, so it is stopping); ``forced_in_s``, with
    ``--isolate-jobs``, is when its worker process is ended if the job has not stopped by then."""

    unheeded_s: float | None
    forced_in_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        late = self.unheeded_s is not None and self.unheeded_s >= UNSTOPPABLE_AFTER_S
        stuck = late and self.forced_in_s is None
        if stuck:
            message = (
                f"the running node has not checked for an interrupt in {self.unheeded_s:.1f} s: it cannot "
                "be stopped and the job ends when the node finishes (the node should call "
                "ctx.check_interrupt() in its loops)"
            )
        elif self.forced_in_s is not None:
            message = (
                f"stopping: if the job has not stopped in {self.forced_in_s:.1f} s its worker process is "
                "ended (--isolate-jobs; the next job loads its models again)"
            )
        else:
            message = "stopping"
        return {
            "requested": True,
            "stoppable": not stuck,
            "unheeded_s": None if self.unheeded_s is None else round(self.unheeded_s, 3),
            "forced_in_s": None if self.forced_in_s is None else round(self.forced_in_s, 3),
            "message": message,
        }


@dataclass(frozen=True)
class JobView:
    """Where a job stands now."""

    spec: JobSpec
    status: JobStatus
    progress: JobProgress | None = None
    record: JobRecord | None = None
    interrupt: InterruptState | None = None  # a running job asked to stop


class KeptImageStore:
    """The in-memory images (``RunResult.images``) of the last ``max_jobs`` finished jobs that
    asked for bytes, within ``max_bytes`` and, given ``room`` (``ProcessRam.room``), within what the
    process RAM budget leaves them; older ones are dropped first (their files, where written,
    remain). Thread-safe."""

    def __init__(
        self, max_jobs: int = 32, *, max_bytes: int | None = None, room: Callable[[int], int] | None = None
    ) -> None:
        if max_jobs < 1:
            raise ValueError(f"max_jobs must be at least 1, got {max_jobs}")
        self.max_jobs = max_jobs
        self.max_bytes = max_bytes
        self.room = room
        self._lock = threading.Lock()
        self._jobs: OrderedDict[str, dict[str, bytes]] = OrderedDict()
        self._bytes = 0

    def put(self, prompt_id: str, images: Mapping[str, bytes]) -> None:
        with self._lock:
            self._pop(prompt_id)
            nbytes = _images_bytes(images)
            limit = self._limit(self._bytes + nbytes)  # the images are in the process already
            if limit is not None and nbytes > limit:
                log.warning(
                    "the images of job %s (%d bytes) do not fit the memory kept for job images (%d bytes); "
                    "they were not kept (files that were written remain)",
                    prompt_id,
                    nbytes,
                    limit,
                )
                return
            self._jobs[prompt_id] = dict(images)
            self._bytes += nbytes
            while len(self._jobs) > self.max_jobs or (limit is not None and self._bytes > limit):
                self._pop(next(iter(self._jobs)))  # the oldest first; the new one fits on its own

    def _pop(self, prompt_id: str) -> None:
        images = self._jobs.pop(prompt_id, None)
        if images is not None:
            self._bytes -= _images_bytes(images)

    def _limit(self, held: int) -> int | None:
        if self.room is None:
            return self.max_bytes
        room = self.room(held)
        return room if self.max_bytes is None else min(room, self.max_bytes)

    def held_bytes(self) -> int:
        """The bytes of the images kept (``engine.memory.process_ram.RamPart``)."""
        return self._bytes

    def give_back(self, nbytes: int) -> int:
        """Drop the oldest jobs' images until about ``nbytes`` are freed; returns the bytes freed."""
        with self._lock:
            before = self._bytes
            while self._jobs and before - self._bytes < nbytes:
                self._pop(next(iter(self._jobs)))
            return before - self._bytes

    def get(self, prompt_id: str) -> dict[str, bytes]:
        with self._lock:
            return dict(self._jobs.get(prompt_id, {}))

    def discard(self, prompt_ids: list[str] | None = None) -> None:
        """Forget these jobs' images (all with ``None``), as the history forgets them."""
        with self._lock:
            for prompt_id in list(self._jobs) if prompt_ids is None else prompt_ids:
                self._pop(prompt_id)


def _images_bytes(images: Mapping[str, bytes]) -> int:
    return sum(len(data) for data in images.values())


@dataclass
class WorkerHealth:
    """What ``/system_stats`` says about the job worker: alive, how often it was restarted after
    dying, why it died last, and whether the job database is failing right now; ``process``, with
    ``--isolate-jobs``, the worker process's own figures (``ProcessRunner.health``)."""

    alive: bool = False
    restarts: int = 0
    last_death: str | None = None
    storage_error: str | None = None
    unsaved_records: int = 0
    process: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# --- notices to subscribers ------------------------------------------------------------------------
@dataclass(frozen=True)
class JobEvent:
    """An execution event of a job the queue is running (``spec`` says whose it is)."""

    spec: JobSpec
    event: ev.Event


@dataclass(frozen=True)
class QueueChanged:
    remaining: int


@dataclass(frozen=True)
class JobFinished:
    record: JobRecord


Notice = JobEvent | QueueChanged | JobFinished
NoticeListener = Callable[[Notice], None]
