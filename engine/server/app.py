"""Building and running the aiohttp application.

``create_app(parts, config)`` wires the route groups, each given only the parts it uses;
``serve_main(args, build_runtime, root)`` is what ``python main.py serve`` calls.

    parts = ServerParts(registry, executor, queue, folders, user_dir, web_dir=..., models=..., extensions=...)
    app = create_app(parts, ServerConfig(host="127.0.0.1", port=8188))
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any

from aiohttp import web

from engine.context import Folders, ModelManagerLike
from engine.distributed.cli import make_ray_queue
from engine.executor import Executor
from engine.jobs.queue import JobQueue, make_local_queue
from engine.jobs.store import JobStore
from engine.jobs.worker_process import make_isolated_queue
from engine.registry import NodeRegistry
from engine.server.common import ApiError, ServerConfig, add_routes
from engine.server.frontend_choice import LOOM_EDITOR_PATH, FrontEndError, resolve_front_end
from engine.server.offload import BlockingWork
from engine.server.openapi import OpenApiRoutes
from engine.server.presence import OutputPresence
from engine.server.relay import EventRelay, ProgressLog
from engine.server.routes_comfy import QueueRoutes
from engine.server.routes_files import FileRoutes
from engine.server.routes_frontend_internal import FrontendInternalRoutes, LogRing
from engine.server.routes_frontend_jobs import FrontendJobRoutes
from engine.server.routes_frontend_misc import FrontendMiscRoutes
from engine.server.routes_frontend_models import FrontendModelRoutes
from engine.server.routes_info import InfoRoutes
from engine.server.routes_jobs import JobRoutes
from engine.server.routes_plugins import PluginBridge, PluginRoutes
from engine.server.routes_static import StaticRoutes
from engine.server.security import (
    ERRORS,
    ErrorCounter,
    InsecureBindError,
    RequestGuard,
    check_bind,
)
from engine.server.userdata import UserdataRoutes
from engine.server.ws import WsHub

log = logging.getLogger("loom.server")

QUEUE = web.AppKey("loom_queue", JobQueue)
HUB = web.AppKey("loom_ws_hub", WsHub)
RELAY = web.AppKey("loom_relay", EventRelay)
JOBS = web.AppKey("loom_job_routes", JobRoutes)


@dataclass
class ServerParts:
    """What the server is made of. ``models``: the memory manager (``stats``/``free``), optional.
    ``extensions``: plugin pack name → its web folder. ``own_queue``: start and stop the queue's
    worker with the app."""

    registry: NodeRegistry
    executor: Executor
    queue: JobQueue
    folders: Folders
    user_dir: Path
    web_dir: Path | None = None
    models: ModelManagerLike | None = None
    extensions: Mapping[str, Path] = field(default_factory=dict)
    own_queue: bool = True
    plugins: Any = None  # engine.plugins.loader.PluginReport, when plugins were loaded
    describe_model: Callable[[str, Path], dict[str, Any]] | None = None  # family + preset of a model file
    presets: Callable[[], dict[str, Any]] | None = None  # the model presets and where they go, as JSON
    logs: LogRing | None = None  # the recent log lines (attached to the root logger by its maker)


def loom_version() -> str:
    try:
        return version("loom")
    except Exception:
        return "0.1.0"


def create_app(parts: ServerParts, config: ServerConfig) -> web.Application:
    request_guard = RequestGuard(config)
    app = web.Application(
        middlewares=[request_guard.errors, request_guard.access],
        client_max_size=config.max_upload_bytes + (1 << 20),
    )
    app[ERRORS] = ErrorCounter()
    app.on_response_prepare.append(request_guard.add_cors_headers)
    queue = parts.queue
    relay = EventRelay(queue, preview_fps=config.preview_fps)
    hub = WsHub(queue, max_waiting_previews=config.max_waiting_previews)
    presence = OutputPresence(parts.folders)
    jobs = JobRoutes(queue, parts.executor.validate, parts.registry.object_info, config, presence)
    bridge = PluginBridge(parts.plugins, hub)
    for sink in (hub, jobs, ProgressLog(), bridge):
        relay.add_sink(sink)
    app[QUEUE], app[HUB], app[RELAY], app[JOBS] = queue, hub, relay, jobs

    add_routes(app, QueueRoutes(queue, parts.executor.validate, presence, bridge.on_prompt).routes())
    add_routes(app, FrontendJobRoutes(queue, presence).routes())
    folder_work = BlockingWork(config.folder_threads, name="loom-model-folders")
    info = InfoRoutes(
        parts.registry,
        config,
        model_files=parts.folders.model_files,
        models=parts.models,
        extensions=parts.extensions,
        queue=queue,
        describe_model=parts.describe_model,
        presets=parts.presets,
        work=folder_work,
    )
    add_routes(app, info.routes())
    add_routes(app, info.static_routes(), comfy=False)
    add_routes(app, FileRoutes(parts.folders, config, getattr(parts.executor, "image_guard", None)).routes())
    add_routes(app, UserdataRoutes(parts.user_dir).routes())
    add_routes(app, [("GET", "/ws", hub.handle)])
    add_routes(app, jobs.routes(), comfy=False)
    add_routes(app, OpenApiRoutes(config.version).routes(), comfy=False)
    add_routes(app, PluginRoutes(parts.plugins).routes(), comfy=False)
    logs = parts.logs if parts.logs is not None else LogRing()
    model_files = parts.folders.model_files
    add_routes(
        app,
        FrontendInternalRoutes(
            logs,
            parts.folders,
            folder_kinds=info.folder_kinds,
            model_folders=getattr(model_files, "folders", None),
        ).routes(),
        comfy=False,
    )
    add_routes(app, FrontendModelRoutes(info.folder_kinds, model_files).routes())
    misc = FrontendMiscRoutes(pack_roots(parts.plugins), docs_source=node_description(parts.registry))
    add_routes(app, misc.routes())
    add_routes(app, misc.static_routes(), comfy=False)
    bridge.mount(app)
    app.router.add_route("*", "/api/{tail:.*}", _unknown_api)
    if config.front_end_root is None:
        StaticRoutes(parts.web_dir).install(app)
    else:  # the official frontend at "/", Loom's editor at a path of its own
        StaticRoutes(parts.web_dir, prefix=LOOM_EDITOR_PATH).install(app)
        StaticRoutes(Path(config.front_end_root)).install(app)

    async def on_startup(app: web.Application) -> None:
        loop = asyncio.get_running_loop()

        def push_logs(client_id: str, data: dict[str, Any]) -> None:
            try:
                loop.call_soon_threadsafe(hub.send_custom, "logs", data, client_id)
            except RuntimeError:  # the loop has closed: the server is stopping
                pass

        logs.push = push_logs
        if parts.logs is None:
            logging.getLogger().addHandler(logs)
        relay.start(asyncio.get_running_loop())
        bridge.start(asyncio.get_running_loop())
        if parts.own_queue:
            queue.start()

    async def on_shutdown(app: web.Application) -> None:
        await hub.close_all()

    async def on_cleanup(app: web.Application) -> None:
        logs.push = None
        if parts.logs is None:
            logging.getLogger().removeHandler(logs)
        relay.stop()
        folder_work.close()
        await jobs.close()
        if parts.own_queue:
            await asyncio.to_thread(queue.stop)

    app.on_startup.append(on_startup)
    app.on_shutdown.append(on_shutdown)
    app.on_cleanup.append(on_cleanup)
    return app


def frontend_extensions(front_end: Path, loom_web: Path) -> dict[str, Path]:
    """The web extensions that go with the official frontend: its own (``extensions/core``, listed
    by ``/extensions`` as ComfyUI lists them) and Loom's (``web/extension``: links to Loom's views)."""
    found = {}
    folder = front_end / "extensions"
    if folder.is_dir():
        found = {path.name: path for path in sorted(folder.iterdir()) if path.is_dir()}
    if (loom_web / "extension").is_dir():
        found["loom"] = loom_web / "extension"
    return found


def pack_roots(report: Any) -> dict[str, Path]:
    """The loaded plugin packs' folders by name (single-file packs have no folder of their own)."""
    packs = getattr(report, "packs", None) or []
    return {pack.name: Path(pack.path) for pack in packs if pack.ok and Path(pack.path).is_dir()}


def node_description(registry: NodeRegistry) -> Callable[[str], dict[str, Any] | None]:
    """A node's ``/object_info`` entry (its display name, description, category), None if unknown."""

    def describe(name: str) -> dict[str, Any] | None:
        entry = registry.object_info(name).get(name)
        return entry if isinstance(entry, dict) else None

    return describe


async def _unknown_api(request: web.Request) -> web.Response:
    raise ApiError(
        404, "not_found", f"no API route {request.method} {request.path}; see /api/v1/openapi.json"
    )


def log_memory(models: ModelManagerLike | None) -> None:
    if models is not None:
        figures = models.stats()
        log.info(
            "memory manager: device %s, RAM budget %.1f GiB, %d resident, RAM tier %.0f MiB",
            figures.get("device"),
            figures.get("ram_budget_bytes", 0) / 2**30,
            len(figures.get("resident", [])),
            figures.get("ram_tier_bytes", 0) / 2**20,
        )


def serve_main(
    args: argparse.Namespace,
    build_runtime: Callable[[argparse.Namespace], Any],
    root: Path,
    *,
    worker_factory: str = "main:build_runtime",
) -> int:
    """``python main.py serve``: check the bind, build the runtime, open the queue, serve until stopped.
    ``worker_factory`` (``"module:function"``) builds the job worker process's runtime with
    ``--isolate-jobs``."""
    try:
        front_end = resolve_front_end(
            getattr(args, "front_end_root", None),
            getattr(args, "front_end_version", None),
            loom_web=root / "web",
        )
    except FrontEndError as exc:
        print(f"loom: {exc}", file=sys.stderr)
        return 2
    config = ServerConfig(
        front_end_root=str(front_end) if front_end is not None else None,
        host=args.host,
        port=args.port,
        token=args.token,
        insecure=args.insecure,
        version=loom_version(),
        argv=tuple(sys.argv),
        allowed_hosts=tuple(getattr(args, "allowed_host", None) or ()),
        allowed_origins=tuple(getattr(args, "allowed_origin", None) or ()),
        extra_stats={"safety": getattr(args, "safety", None) or "off"},
    )
    try:
        check_bind(config)
    except InsecureBindError as exc:
        print(f"loom: {exc}", file=sys.stderr)
        return 2
    isolate = bool(getattr(args, "isolate_jobs", False))
    if isolate and getattr(args, "ray", None):
        print(
            "loom: --isolate-jobs and --ray: Ray already runs every job in a worker process of its own "
            "(a worker that dies has its job run again elsewhere); give one of the two",
            file=sys.stderr,
        )
        return 2
    logs = LogRing()  # the Console panel's lines: from here on, start-up included
    logging.getLogger().addHandler(logs)
    runtime = build_runtime(args)
    user_dir = Path(args.user_dir)
    store = JobStore(
        user_dir / "loom.sqlite", history_size=int(getattr(args, "history_size", 10_000) or 10_000)
    )
    queue: JobQueue
    report = getattr(runtime, "plugin_report", None)
    models = runtime.models
    if getattr(args, "ray", None):
        queue = make_ray_queue(args, runtime, store, root=root)
    elif isolate:
        shim = getattr(report, "environment", None)
        queue, models = make_isolated_queue(
            args,
            runtime.executor,
            store,
            root=root,
            runtime_factory=worker_factory,
            on_plugin_message=getattr(shim, "send_event", None),
        )
        log.info("jobs run in a worker process the server restarts (--isolate-jobs)")
    else:
        queue = make_local_queue(runtime.executor, store)
    web_dirs = getattr(report, "web_directories", None)
    extensions = web_dirs() if callable(web_dirs) else {}
    if config.front_end_root is not None:
        extensions = {**frontend_extensions(Path(config.front_end_root), root / "web"), **extensions}
    parts = ServerParts(
        runtime.registry,
        runtime.executor,
        queue,
        runtime.folders,
        user_dir,
        web_dir=root / "web",
        models=models,
        extensions=extensions,
        plugins=report,
        describe_model=getattr(runtime, "describe_model", None),
        presets=getattr(runtime, "presets", None),
        logs=logs,
    )
    pending = len(queue.pending())
    if pending:
        log.info("resuming %d queued job(s) from %s", pending, store.path)
    log_memory(runtime.models)
    shown = f"[{config.host}]" if ":" in config.host else config.host
    log.info(
        "Loom %s: open http://%s:%d/ (%d node types)",
        config.version,
        shown,
        config.port,
        len(runtime.registry),
    )
    if config.front_end_root is not None:
        log.info(
            "the editor at / is ComfyUI's official frontend (%s); Loom's editor is at http://%s:%d%s/",
            config.front_end_root,
            shown,
            config.port,
            LOOM_EDITOR_PATH,
        )
    web.run_app(
        create_app(parts, config),
        host=config.host,
        port=config.port,
        print=None,
        access_log=None,
        handle_signals=True,
    )
    store.close()
    return 0
