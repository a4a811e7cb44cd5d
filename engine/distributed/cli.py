"""Command-line glue for the Ray extra: flags, ``serve --ray`` and ``main.py worker --ray``.

``main.py`` calls these (this module imports Ray only when a function runs):

- ``add_ray_arguments(serve_parser)`` and ``add_ray_arguments(worker_parser, worker=True)``;
- ``make_ray_queue(args, runtime, store, root=ROOT)`` instead of ``LocalJobQueue(...)`` when
  ``args.ray`` is set: it starts or joins the cluster, starts this machine's workers if asked, and
  returns a :class:`~engine.distributed.ray_queue.RayJobQueue` (``start()``/``stop()`` as usual);
- ``worker_main(args, root=ROOT)`` for ``python main.py worker --ray ADDRESS``: joins the cluster,
  starts this machine's worker actors (one per GPU), and blocks until Ctrl-C or SIGTERM.

Workers build their runtime with ``runtime_factory`` (default ``"main:build_runtime"``) from this
process's parsed flags (models dir, custom nodes, ``--cpu``, ...), inside the actor.
"""

from __future__ import annotations

import argparse
import logging
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

from engine.distributed.ray_queue import QueueSettings, RayJobQueue
from engine.distributed.router import first_model_finder
from engine.distributed.worker import WORKER_PREFIX, WorkerConfig
from engine.jobs.store import JobStore

log = logging.getLogger("loom.distributed")

REQUIREMENT = "ray>=2.50"  # the extra's requirement; tested with ray 2.60.0
_NOT_FOR_WORKERS = ("func",)


def add_ray_arguments(parser: argparse.ArgumentParser, *, worker: bool = False) -> None:
    """The Ray flags: ``--ray`` (required for ``worker``) and how many workers of what size."""
    group = parser.add_argument_group(
        "scale-out on Ray (pip install 'loom[ray]'; see engine/distributed/README.md)"
    )
    if worker:
        group.add_argument(
            "--ray",
            required=True,
            metavar="ADDRESS",
            help="the cluster to join: the head's host:port (or 'auto' on the head machine)",
        )
    else:
        group.add_argument(
            "--ray",
            default=None,
            metavar="ADDRESS|auto",
            help="run jobs on a Ray cluster: 'auto' joins the cluster on this machine or "
            "starts a private one; host:port joins that cluster",
        )
    group.add_argument(
        "--ray-workers",
        type=int,
        default=None,
        metavar="N",
        help="worker actors to start on this machine (default: one per GPU, at least one; "
        "for 'serve' joining an existing cluster: none)",
    )
    group.add_argument(
        "--ray-gpus-per-worker",
        type=float,
        default=None,
        metavar="G",
        help="GPUs each worker reserves (default: 1 on GPU machines, 0 with --cpu)",
    )
    group.add_argument(
        "--ray-cpus-per-worker",
        type=float,
        default=1.0,
        metavar="C",
        help="CPUs each worker reserves (default 1)",
    )
    group.add_argument(
        "--ray-max-attempts",
        type=int,
        default=3,
        metavar="K",
        help="attempts whose worker died before a job is recorded as failed (default 3)",
    )
    group.add_argument("--ray-namespace", default="loom", help=argparse.SUPPRESS)


def connect(address: str, *, namespace: str, root: Path) -> bool:
    """Join the cluster at ``address`` ('auto': the local one, else start a private loopback one).
    Returns True when this process started the cluster."""
    import ray  # lazy: optional extra (ray)

    env = {"env_vars": {"PYTHONPATH": str(root)}}
    if address != "auto":
        ray.init(address=address, namespace=namespace, runtime_env=env)
        return False
    try:
        ray.init(address="auto", namespace=namespace, runtime_env=env)
        return False
    except ConnectionError:
        log.info("no Ray cluster is running on this machine; starting a private one (loopback only)")
        ray.init(namespace=namespace, runtime_env=env, include_dashboard=False, _node_ip_address="127.0.0.1")
        return True


def local_gpus() -> float:
    """GPUs Ray sees on this machine's node."""
    import ray  # lazy: optional extra (ray)

    node_id = ray.get_runtime_context().get_node_id()
    for node in ray.nodes():
        if node.get("NodeID") == node_id:
            return float(node.get("Resources", {}).get("GPU", 0.0))
    return 0.0


def worker_config(args: argparse.Namespace, root: Path, runtime_factory: str) -> WorkerConfig:
    """This process's flags, minus the Ray ones, for the workers' runtime factory."""
    runtime_args = {
        k: v for k, v in vars(args).items() if k not in _NOT_FOR_WORKERS and not k.startswith("ray")
    }
    return WorkerConfig(runtime_factory, runtime_args, python_path=(str(root),))


def _resources(args: argparse.Namespace, *, pin: bool) -> tuple[Any, int]:
    from engine.distributed.pool import ActorResources  # lazy: imports ray (optional extra)

    gpus = 0.0 if getattr(args, "cpu", False) else local_gpus()
    per_worker = args.ray_gpus_per_worker if args.ray_gpus_per_worker is not None else (1.0 if gpus else 0.0)
    count = max(1, int(gpus // per_worker)) if per_worker else 1
    return ActorResources(num_cpus=args.ray_cpus_per_worker, num_gpus=per_worker, pin_to_this_node=pin), count


def make_ray_queue(
    args: argparse.Namespace,
    runtime: Any,
    store: JobStore,
    *,
    root: Path,
    runtime_factory: str = "main:build_runtime",
) -> RayJobQueue:
    """The server's queue on Ray. ``runtime``: the server's own (its registry routes, its folders
    receive the outputs). Workers this call starts are stopped with the queue."""
    from engine.distributed.pool import RayWorkerPool  # lazy: imports ray (optional extra)

    started = connect(args.ray, namespace=args.ray_namespace, root=root)
    pool = RayWorkerPool(namespace=args.ray_namespace)
    resources, per_machine = _resources(args, pin=True)
    count = args.ray_workers if args.ray_workers is not None else (per_machine if started else 0)
    if count > 0:
        names = pool.spawn(worker_config(args, root, runtime_factory), resources, count)
        log.info("started %d worker(s) on this machine: %s", count, ", ".join(names))
    elif not started:
        log.info("joined the Ray cluster; waiting for workers (python main.py worker --ray %s)", args.ray)
    settings = QueueSettings(max_attempts=args.ray_max_attempts)
    return RayJobQueue(
        store,
        pool,
        runtime.folders,
        model_of=first_model_finder(runtime.registry),
        settings=settings,
        on_stop=pool.shutdown,
    )


def worker_main(args: argparse.Namespace, *, root: Path, runtime_factory: str = "main:build_runtime") -> int:
    """``python main.py worker --ray ADDRESS``: serve jobs from this machine until stopped."""
    from engine.distributed.pool import RayWorkerPool  # lazy: imports ray (optional extra)

    connect(args.ray, namespace=args.ray_namespace, root=root)
    pool = RayWorkerPool(namespace=args.ray_namespace)
    resources, per_machine = _resources(args, pin=True)
    count = args.ray_workers if args.ray_workers is not None else per_machine
    config = worker_config(args, root, runtime_factory)
    config = WorkerConfig(
        config.runtime_factory,
        config.runtime_args,
        f"{WORKER_PREFIX}{socket.gethostname()}",
        config.scratch_dir,
        config.python_path,
    )
    names = pool.spawn(config, resources, count)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        waiting = set(names)
        deadline = time.monotonic() + 600
        while waiting and not stop.is_set():
            ready, _ = pool.discover()
            waiting -= set(ready)
            if waiting - _listed(args.ray_namespace):
                print(
                    f"loom: worker(s) {sorted(waiting - _listed(args.ray_namespace))} failed to start; "
                    "the error is in the log above and in the Ray logs",
                    flush=True,
                )
                return 1
            if time.monotonic() > deadline:
                print(f"loom: workers {sorted(waiting)} did not start in 10 minutes; see the Ray logs")
                return 1
            stop.wait(0.5)
        if not stop.is_set():
            print(
                f"loom: {len(names)} worker(s) serving jobs for the cluster at {args.ray}: {', '.join(names)}",
                flush=True,
            )
        while not stop.wait(2.0):
            _, gone = pool.discover()
            for name in set(gone) & set(names):
                print(f"loom: worker {name} died; the server re-runs its job elsewhere", flush=True)
    finally:
        pool.shutdown()
    return 0


def _listed(namespace: str) -> set[str]:
    import ray  # lazy: optional extra (ray)

    return {
        e["name"] for e in ray.util.list_named_actors(all_namespaces=True) if e.get("namespace") == namespace
    }
