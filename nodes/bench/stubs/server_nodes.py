"""A stub node pack without torch: numbers, a slow node with progress and previews, a PNG writer,
a failing node. Enough to drive every route and event of the server (its tests and
``python main.py bench server``); ``make_parts`` builds a server over it, ``make_isolated_parts``
one whose jobs run in a worker process (``--isolate-jobs``) built by :func:`build_runtime`."""

from __future__ import annotations

import argparse
import io
import time
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace

from PIL import Image

from engine.cache import OutputCache
from engine.context import Folders, NodeContext
from engine.events import Preview
from engine.executor import Executor
from engine.jobs.queue import LocalJobQueue
from engine.jobs.store import JobStore
from engine.jobs.worker_process import make_isolated_queue
from engine.node import Node, NodeOutput
from engine.registry import NodeRegistry
from engine.schema import BOOLEAN, FLOAT, INT, STRING, Input, NodeSchema, Output
from engine.server.app import ServerParts
from nodes.compat.shim import load_plugins_with_shim

CHECKOUT = Path(__file__).resolve().parents[3]  # main.py's folder: the worker process imports from it


def png_bytes(value: int, size: int = 8) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (size, size), (value % 256, 40, 200)).save(buffer, format="PNG")
    return buffer.getvalue()


def jpeg_bytes(value: int, size: int = 8) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (size, size), (value % 256, 90, 10)).save(buffer, format="JPEG")
    return buffer.getvalue()


class StubNumber(Node):
    SCHEMA = NodeSchema(
        node_id="StubNumber",
        display_name="Number",
        category="test",
        description="Outputs its value.",
        inputs=(Input("value", INT, "the number", default=0, min=-(10**9), max=10**9),),
        outputs=(Output("INT", INT, "the number"),),
    )

    def run(self, ctx: NodeContext, *, value: int) -> tuple[int]:
        return (value,)


class StubSlow(Node):
    SCHEMA = NodeSchema(
        node_id="StubSlow",
        display_name="Slow",
        category="test",
        description="Adds one after `steps` steps of `delay` seconds, reporting progress (and previews).",
        inputs=(
            Input("value", INT, "input number"),
            Input("steps", INT, "how many steps", default=3, min=1, max=10_000),
            Input("delay", FLOAT, "seconds per step", default=0.01, min=0.0, max=0.5),
            Input("previews", BOOLEAN, "send a preview per step", default=False),
        ),
        outputs=(Output("INT", INT, "value + 1"),),
    )

    def run(self, ctx: NodeContext, *, value: int, steps: int, delay: float, previews: bool) -> tuple[int]:
        for step in range(steps):
            time.sleep(delay)
            preview = None
            if previews:
                preview = (
                    Preview("JPEG", jpeg_bytes(step)) if step % 2 == 0 else Preview("PNG", png_bytes(step))
                )
            ctx.progress(step + 1, steps, preview)
        return (value + 1,)


class StubSave(Node):
    SCHEMA = NodeSchema(
        node_id="StubSave",
        display_name="Save",
        category="test",
        output_node=True,
        description="Writes a small PNG whose colour depends on the value.",
        inputs=(
            Input("value", INT, "the number to draw"),
            Input("filename_prefix", STRING, "file name prefix", default="stub"),
        ),
    )

    def run(self, ctx: NodeContext, *, value: int, filename_prefix: str) -> NodeOutput:
        name = f"{filename_prefix}_{value:05d}_{ctx.prompt_id[:8]}.png"
        (ctx.folders.output_dir / name).write_bytes(png_bytes(value))
        return NodeOutput(ui={"images": [{"filename": name, "subfolder": "", "type": "output"}]})


class StubFail(Node):
    SCHEMA = NodeSchema(
        node_id="StubFail",
        display_name="Fail",
        category="test",
        description="Always raises.",
        inputs=(Input("value", INT, "ignored"),),
        outputs=(Output("INT", INT, "never"),),
    )

    def run(self, ctx: NodeContext, *, value: int) -> tuple[int]:
        raise RuntimeError(f"stub failure on {value}")


STUB_NODES = (StubNumber, StubSlow, StubSave, StubFail)


def register_stubs(registry: NodeRegistry) -> None:
    registry.register_all(STUB_NODES, origin="core")


def workflow(
    value: int = 1,
    *,
    steps: int = 2,
    delay: float = 0.0,
    previews: bool = False,
    fail: bool = False,
    prefix: str = "stub",
) -> dict:
    """Number → Slow (or Fail) → Save, in API format."""
    middle = (
        {"class_type": "StubFail", "inputs": {"value": ["1", 0]}}
        if fail
        else {
            "class_type": "StubSlow",
            "inputs": {"value": ["1", 0], "steps": steps, "delay": delay, "previews": previews},
        }
    )
    return {
        "1": {"class_type": "StubNumber", "inputs": {"value": value}},
        "2": middle,
        "3": {"class_type": "StubSave", "inputs": {"value": ["2", 0], "filename_prefix": prefix}},
    }


def make_parts(root: Path, *, db: Path | None = None, history_size: int = 10_000) -> ServerParts:
    """A server's parts over the stub nodes, everything under ``root`` (a stub ``web/index.html``)."""
    registry = NodeRegistry()
    register_stubs(registry)
    folders = Folders(root / "input", root / "output", root / "temp")
    folders.ensure()
    executor = Executor(registry, OutputCache(), folders)
    store = JobStore(db or root / "user" / "loom.sqlite", history_size=history_size)
    web_dir = root / "web"
    web_dir.mkdir(exist_ok=True)
    (web_dir / "index.html").write_text("<!doctype html><title>Loom</title>")
    return ServerParts(
        registry, executor, LocalJobQueue(executor, store), folders, root / "user", web_dir=web_dir
    )


def build_runtime(args: argparse.Namespace) -> SimpleNamespace:
    """A runtime over the stub nodes and the plugin packs in ``args.custom_nodes``, its folders
    under ``args.root``: the ``runtime_factory`` of ``make_isolated_parts``' worker process
    (``"nodes.bench.stubs.server_nodes:build_runtime"``), and that server's own registry."""
    root = Path(args.root)
    registry = NodeRegistry()
    register_stubs(registry)
    folders = Folders(root / "input", root / "output", root / "temp")
    folders.ensure()
    packs = [Path(p) for p in getattr(args, "custom_nodes", [])]
    report = load_plugins_with_shim(registry, packs, folders) if packs else None
    executor = Executor(registry, OutputCache(), folders)
    return SimpleNamespace(
        registry=registry, executor=executor, folders=folders, models=executor.models, plugin_report=report
    )


def make_isolated_parts(
    root: Path, *, custom_nodes: Sequence[Path] = (), grace_s: float = 5.0
) -> ServerParts:
    """``make_parts`` with ``--isolate-jobs``: every job runs in a worker process built by
    :func:`build_runtime` (started when the app starts, restarted when it dies or is ended)."""
    args = argparse.Namespace(
        root=str(root), custom_nodes=[str(p) for p in custom_nodes], isolate_grace=grace_s
    )
    runtime = build_runtime(args)
    store = JobStore(root / "user" / "loom.sqlite")
    shim = getattr(runtime.plugin_report, "environment", None)
    queue, models = make_isolated_queue(
        args,
        runtime.executor,
        store,
        root=CHECKOUT,
        runtime_factory="nodes.bench.stubs.server_nodes:build_runtime",
        on_plugin_message=getattr(shim, "send_event", None),
    )
    web_dir = root / "web"
    web_dir.mkdir(exist_ok=True)
    (web_dir / "index.html").write_text("<!doctype html><title>Loom</title>")
    return ServerParts(
        runtime.registry,
        runtime.executor,
        queue,
        runtime.folders,
        root / "user",
        web_dir=web_dir,
        models=models,
        plugins=runtime.plugin_report,
    )
