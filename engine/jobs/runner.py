"""Who runs a job's workflow for :class:`~engine.jobs.queue.LocalJobQueue`: the executor of this
process (:class:`InProcessRunner`, the default) or a worker process the queue starts and restarts
(``serve --isolate-jobs``: :class:`~engine.jobs.worker_process.ProcessRunner`).

Either way the queue keeps the queue, the history and the notices: a runner turns one
:class:`~engine.jobs.spec.JobSpec` into a :class:`~engine.executor.RunResult`, emitting the run's
events on the executor's bus as it goes, stops when the executor's interrupt flag is set, and frees
memory between jobs when asked.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from engine.executor import Executor, RunResult
from engine.jobs.spec import JobSpec


class JobRunner(Protocol):
    def start(self) -> None:
        """Get ready to run jobs (a worker process starts here, so the first job finds it up)."""
        ...

    def run(self, spec: JobSpec) -> RunResult:
        """Run one job; never raises for the job's fault."""
        ...

    def free(self, *, unload_models: bool, free_memory: bool) -> None:
        """ComfyUI's /free, between jobs: unload models; with ``free_memory`` drop the output cache too."""
        ...

    def force_stop_in(self) -> float | None:
        """Seconds until an interrupted job that has not stopped is ended by force (None: never)."""
        ...

    def health(self) -> dict[str, Any] | None:
        """What ``/system_stats`` shows of the runner (None: nothing beyond the queue's own figures)."""
        ...

    def close(self) -> None:
        """Stop for good (a worker process is ended)."""
        ...


class JobPrefetch(Protocol):
    """What the queue asks of its prefetch (``engine/jobs/coalesce.py``, ``engine/jobs/overlap.py``):
    while inside ``during``, the models of the next jobs are read ahead."""

    def during(
        self, next_spec: JobSpec | None, *, current: JobSpec | None = None, queued: Sequence[JobSpec] = ()
    ) -> AbstractContextManager[None]: ...


class InProcessRunner:
    """The executor of this process runs the job on the queue's worker thread."""

    def __init__(self, executor: Executor) -> None:
        self.executor = executor

    def start(self) -> None:
        return None

    def run(self, spec: JobSpec) -> RunResult:
        return self.executor.run(spec.request(self.executor.registry.object_info))

    def free(self, *, unload_models: bool, free_memory: bool) -> None:
        if unload_models or free_memory:
            self.executor.models.free()
        if free_memory:
            self.executor.cache.clear()

    def force_stop_in(self) -> float | None:
        return None  # a node that never checks the flag runs to its end

    def health(self) -> dict[str, Any] | None:
        return None

    def close(self) -> None:
        return None
