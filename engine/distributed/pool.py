"""The Ray side of the worker pool: spawning, discovering and talking to :class:`LoomWorker` actors.

Workers are named Ray actors (``loom-worker-...``) in the ``loom`` namespace. The server spawns
its own (``serve --ray auto``) and finds the ones other machines started (``main.py worker``) by
listing named actors every few seconds, so a worker that joins later gets work. Everything Ray
throws when an actor dies (SIGKILL, OOM killer, machine gone) becomes :class:`WorkerLost`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import ObjectLostError, RayActorError, RayTaskError, WorkerCrashedError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from engine.distributed.worker import (
    WORKER_PREFIX,
    JobCrashed,
    JobOutcome,
    LoomWorker,
    WorkerConfig,
    WorkerEvent,
    WorkerLost,
)
from engine.jobs.spec import JobSpec

log = logging.getLogger("loom.distributed.pool")

NAMESPACE = "loom"
ACTOR_CONCURRENCY = 4  # run_job plus interrupt/stats/free calls served while it runs


@dataclass(frozen=True)
class ActorResources:
    """What each worker actor reserves in the cluster (one GPU each on GPU machines)."""

    num_cpus: float = 1.0
    num_gpus: float = 0.0
    max_restarts: int = 0  # a killed worker stays dead; its jobs run elsewhere
    pin_to_this_node: bool = False  # ``main.py worker``: the actor runs on the machine that asked


def actor_options(
    name: str, resources: ActorResources, python_path: tuple[str, ...], namespace: str = NAMESPACE
) -> dict[str, Any]:
    options: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "max_concurrency": ACTOR_CONCURRENCY,
        "num_cpus": resources.num_cpus,
        "num_gpus": resources.num_gpus,
        "max_restarts": resources.max_restarts,
        "max_task_retries": 0,
    }
    if python_path:
        joined = os.pathsep.join([*python_path, os.environ.get("PYTHONPATH", "")]).strip(os.pathsep)
        options["runtime_env"] = {"env_vars": {"PYTHONPATH": joined}}
    if resources.pin_to_this_node:
        node_id = ray.get_runtime_context().get_node_id()
        options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
    return options


def spawn_worker(config: WorkerConfig, resources: ActorResources, namespace: str = NAMESPACE) -> Any:
    """Start one :class:`LoomWorker` actor (named after ``config.name`` or a fresh id)."""
    name = config.name or f"{WORKER_PREFIX}{uuid.uuid4().hex[:8]}"
    if not name.startswith(WORKER_PREFIX):
        raise ValueError(f"worker name {name!r} must start with {WORKER_PREFIX!r} for the server to find it")
    config = WorkerConfig(
        config.runtime_factory, config.runtime_args, name, config.scratch_dir, config.python_path
    )
    actor_class = ray.remote(LoomWorker)
    return actor_class.options(**actor_options(name, resources, config.python_path, namespace)).remote(config)


class RayWorkerPool:
    """The server's view of the workers: handles by name, joining ones, and calls that map Ray's
    failures onto :class:`WorkerLost`. Thread-safe."""

    def __init__(self, namespace: str = NAMESPACE) -> None:
        self.namespace = namespace
        self._lock = threading.Lock()
        self._handles: dict[str, Any] = {}
        self._joining: dict[str, tuple[Any, Any]] = {}  # name -> (handle, ping ref)
        self._owned: dict[str, Any] = {}  # actors this process spawned (killed on shutdown)

    def spawn(self, config: WorkerConfig, resources: ActorResources, count: int) -> list[str]:
        names = []
        for _ in range(count):
            name = f"{config.name or WORKER_PREFIX + 'local'}-{uuid.uuid4().hex[:6]}"
            handle = spawn_worker(
                WorkerConfig(
                    config.runtime_factory, config.runtime_args, name, config.scratch_dir, config.python_path
                ),
                resources,
                self.namespace,
            )
            with self._lock:
                self._owned[name] = handle
            names.append(name)
        return names

    def discover(self) -> tuple[list[str], list[str]]:
        """(workers ready since the last call, known workers whose actor is gone)."""
        listed = {
            entry["name"]
            for entry in ray.util.list_named_actors(all_namespaces=True)
            if entry.get("namespace") == self.namespace and entry["name"].startswith(WORKER_PREFIX)
        }
        with self._lock:
            gone = [name for name in self._handles if name not in listed]
            for name in gone:
                self._handles.pop(name)
            for name in listed - set(self._handles) - set(self._joining):
                try:
                    handle = ray.get_actor(name, namespace=self.namespace)
                except ValueError:  # died between listing and look-up
                    continue
                self._joining[name] = (handle, handle.ping.remote())
            joining = dict(self._joining)
        ready: list[str] = []
        if joining:
            refs = [ref for _, ref in joining.values()]
            done, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            done_set = set(done)
            for name, (handle, ref) in joining.items():
                if ref not in done_set:
                    continue
                with self._lock:
                    self._joining.pop(name, None)
                try:
                    ray.get(ref)
                except (RayActorError, RayTaskError) as exc:  # its __init__ failed: say why, once
                    log.error("worker %s failed to start: %s", name, exc)
                    continue
                with self._lock:
                    self._handles[name] = handle
                ready.append(name)
        return ready, gone

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._handles)

    def forget(self, name: str) -> None:
        with self._lock:
            self._handles.pop(name, None)

    def _handle(self, name: str) -> Any:
        with self._lock:
            handle = self._handles.get(name)
        if handle is None:
            raise WorkerLost(f"worker {name} is not (or no longer) in the pool")
        return handle

    def run(self, name: str, task: JobSpec) -> Iterator[WorkerEvent | JobOutcome]:
        """The attempt's stream; raises :class:`WorkerLost` if the worker dies meanwhile."""
        handle = self._handle(name)
        try:
            for ref in handle.run_job.remote(task):
                yield ray.get(ref)
        except RayTaskError as exc:
            raise JobCrashed(f"worker {name} failed to run {task.prompt_id}: {exc}") from exc
        except (RayActorError, WorkerCrashedError, ObjectLostError) as exc:
            raise WorkerLost(
                f"worker {name} died while running {task.prompt_id} "
                f"(attempt {task.attempt}): {type(exc).__name__}"
            ) from exc

    def call(self, name: str, method: str, *args: Any, timeout: float | None = 10.0) -> Any:
        """A small actor call (``stats``, ``info``, ``free``, ``interrupt``), waited for."""
        try:
            return ray.get(getattr(self._handle(name), method).remote(*args), timeout=timeout)
        except (RayActorError, WorkerCrashedError) as exc:
            raise WorkerLost(f"worker {name} is gone: {type(exc).__name__}") from exc

    def tell(self, name: str, method: str, *args: Any) -> None:
        """Fire-and-forget actor call (interrupts: never block the caller on a busy worker)."""
        try:
            getattr(self._handle(name), method).remote(*args)
        except WorkerLost:
            pass

    def kill(self, name: str) -> None:
        with self._lock:
            handle = self._handles.pop(name, None) or self._owned.get(name)
            self._owned.pop(name, None)
        if handle is not None:
            ray.kill(handle, no_restart=True)

    def shutdown(self, wait_s: float = 10.0) -> None:
        """Kill the workers this process spawned (joined ones belong to their own processes) and
        wait up to ``wait_s`` until the cluster no longer lists them."""
        with self._lock:
            owned = list(self._owned)
        for name in owned:
            self.kill(name)
        deadline = time.monotonic() + wait_s
        while owned and time.monotonic() < deadline:
            listed = {
                e["name"]
                for e in ray.util.list_named_actors(all_namespaces=True)
                if e.get("namespace") == self.namespace
            }
            if not listed.intersection(owned):
                return
            time.sleep(0.1)
