"""A worker runtime over stub nodes: a fake checkpoint loader whose model goes through the
worker's own ModelManager with a measurable load time, a sampler that uses it with progress and
interrupt checks, and a saver that writes files with ComfyUI's counter naming. No torch.

``build(args)`` is the ``runtime_factory`` the tests and ``python main.py bench scale_out`` give the
workers ("nodes.bench.stubs.worker_runtime:build").
"""

from __future__ import annotations

import argparse
import hashlib
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from engine.cache import OutputCache
from engine.context import Folders, NodeContext, RunSettings
from engine.events import EventBus
from engine.executor import Executor
from engine.memory.device_policy import DevicePolicy
from engine.memory.manager import ModelManager
from engine.node import Node, NodeOutput
from engine.registry import NodeRegistry
from engine.schema import COMBO, FLOAT, INT, STRING, DynamicOptions, Input, NodeSchema, Output

CHECKPOINTS = ["A.safetensors", "B.safetensors", "C.safetensors"]


@dataclass(frozen=True)
class WorkerSettings(RunSettings):
    """Run settings with the seconds one fake checkpoint 'load' takes (``build``'s ``load_s``)."""

    load_s: float = 0.3


def _schema(node_id: str, inputs: tuple[Input, ...], outputs: tuple[Output, ...], **kw: Any) -> NodeSchema:
    return NodeSchema(
        node_id=node_id,
        display_name=node_id,
        category="test",
        description=f"stub {node_id}",
        inputs=inputs,
        outputs=outputs,
        **kw,
    )


@dataclass(frozen=True)
class FakeCheckpoint:
    """A model handle: 'loading' sleeps ``load_s`` (like reading weights) and returns a dict."""

    name: str
    load_s: float

    @property
    def key(self) -> str:
        return f"ckpt:{self.name}"

    @property
    def kind(self) -> str:
        return "unet"

    def estimate_bytes(self) -> int:
        return 1 << 20

    def load(self) -> Any:
        time.sleep(self.load_s)
        return {"name": self.name, "weights": hashlib.sha256(self.name.encode()).hexdigest()}

    def to_device(self, module: Any, device: str, dtype: str) -> Any:
        return module


def load_seconds(ctx: NodeContext) -> float:
    settings = ctx.settings
    return settings.load_s if isinstance(settings, WorkerSettings) else 0.3


class FakeCheckpointLoader(Node):
    SCHEMA = _schema(
        "FakeCheckpointLoader",
        (Input("ckpt_name", COMBO, "checkpoint file", options=DynamicOptions("checkpoints")),),
        (Output("MODEL", "MODEL", "the model handle"),),
    )

    def run(self, ctx: NodeContext, *, ckpt_name: str) -> tuple[FakeCheckpoint]:
        return (FakeCheckpoint(ckpt_name, load_seconds(ctx)),)


class FakeSampler(Node):
    SCHEMA = _schema(
        "FakeSampler",
        (
            Input("model", "MODEL", "model"),
            Input("seed", INT, "seed", default=0, min=0, max=2**31),
            Input("steps", INT, "steps", default=4, min=1, max=10_000),
            Input("step_s", FLOAT, "seconds per step (sleeping)", default=0.01, min=0.0, max=10.0),
            Input(
                "burn_s",
                FLOAT,
                "seconds per step (busy CPU, for benchmarks)",
                default=0.0,
                min=0.0,
                max=10.0,
                optional=True,
            ),
        ),
        (Output("IMAGE", "IMAGE", "fake image bytes"),),
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        model: FakeCheckpoint,
        seed: int,
        steps: int,
        step_s: float,
        burn_s: float = 0.0,
    ) -> tuple[bytes]:
        with ctx.models.use(model) as weights:
            digest = hashlib.sha256(f"{weights['weights']}:{seed}".encode())
            for i in range(steps):
                time.sleep(step_s)
                _burn(burn_s)
                digest.update(str(i).encode())
                ctx.progress(i + 1, steps)
        return (digest.digest() * 8,)


def _burn(seconds: float) -> None:
    """Busy CPU for ``seconds`` (thread CPU time, so a shared core makes it take longer)."""
    end = time.thread_time() + seconds
    x = 0
    while time.thread_time() < end:
        for _ in range(1000):
            x = (x * 31 + 7) % 1_000_003


class FakeSaveImage(Node):
    SCHEMA = _schema(
        "FakeSaveImage",
        (Input("images", "IMAGE", "image bytes"), Input("filename_prefix", STRING, "prefix", default="Loom")),
        (),
        output_node=True,
    )

    def run(self, ctx: NodeContext, *, images: bytes, filename_prefix: str) -> NodeOutput:
        subfolder, _, stem = filename_prefix.rpartition("/")  # "renders/cat": a subfolder, as SaveImage
        out = ctx.folders.output_dir / subfolder
        out.mkdir(parents=True, exist_ok=True)
        counter = 1 + sum(1 for p in out.glob(f"{stem}_*_.png"))
        name = f"{stem}_{counter:05d}_.png"
        (out / name).write_bytes(images)
        return NodeOutput(ui={"images": [{"filename": name, "subfolder": subfolder, "type": "output"}]})


NODES: list[type[Node]] = [FakeCheckpointLoader, FakeSampler, FakeSaveImage]


def make_registry() -> NodeRegistry:
    registry = NodeRegistry()
    registry.register_all(NODES)
    registry.add_options_source("checkpoints", lambda: list(CHECKPOINTS))
    return registry


def build(args: argparse.Namespace) -> SimpleNamespace:
    """The runtime factory: registry, folders, a ModelManager with no RAM tier, an executor."""
    root = Path(getattr(args, "root", "/tmp/loom-stub"))
    folders = Folders(root / "input", root / "output", root / "temp")
    folders.ensure()
    models = ModelManager(DevicePolicy.cpu(), ram_budget_bytes=0, prefetch=False)
    registry = make_registry()
    settings = WorkerSettings(load_s=float(getattr(args, "load_s", 0.3)))
    executor = Executor(
        registry, OutputCache(64 << 20), folders, models=models, bus=EventBus(), settings=settings
    )
    return SimpleNamespace(registry=registry, executor=executor, models=models, folders=folders)


def workflow(
    ckpt: str, seed: int, *, steps: int = 4, step_s: float = 0.01, prefix: str = "Loom", burn_s: float = 0.0
) -> dict[str, Any]:
    sampler: dict[str, Any] = {"model": ["1", 0], "seed": seed, "steps": steps, "step_s": step_s}
    if burn_s:
        sampler["burn_s"] = burn_s
    return {
        "1": {"class_type": "FakeCheckpointLoader", "inputs": {"ckpt_name": ckpt}},
        "2": {"class_type": "FakeSampler", "inputs": sampler},
        "3": {"class_type": "FakeSaveImage", "inputs": {"images": ["2", 0], "filename_prefix": prefix}},
    }
