"""Fixtures for plugin tests: a registry with a stub core node, a bound shim, the fixture packs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from engine.context import Folders, NodeContext
from engine.node import Node
from engine.plugins.loader import PluginConfig, PluginReport, load_plugins
from engine.registry import NodeRegistry
from engine.schema import STRING, Input, NodeSchema, Output
from nodes.compat.shim import ComfyShim

PACKS = Path(__file__).parent / "packs"
REPO = Path(__file__).resolve().parents[3]


class CoreConcat(Node):
    """Stands in for the core StringConcatenate node (a pack must not replace it)."""

    SCHEMA = NodeSchema(
        node_id="StringConcatenate",
        display_name="Concatenate",
        category="utils/string",
        description="Joins two strings.",
        inputs=(
            Input("string_a", STRING, "first", default=""),
            Input("string_b", STRING, "second", default=""),
        ),
        outputs=(Output("STRING", STRING, "joined"),),
    )

    def run(self, ctx: NodeContext, *, string_a: str, string_b: str) -> tuple[str]:
        return (string_a + string_b,)


@dataclass
class Env:
    registry: NodeRegistry
    shim: ComfyShim
    folders: Folders
    models_dir: Path
    events: list[tuple[str, Any, str | None]] = field(default_factory=list)

    def load(self, *dirs: Path, config: PluginConfig | None = None) -> PluginReport:
        return load_plugins(self.registry, list(dirs), config=config, shim=self.shim)

    def ctx(self, node_id: str = "7") -> NodeContext:
        return NodeContext(node_id=node_id, prompt_id="p1", folders=self.folders)


def make_env(tmp: Path) -> Env:
    folders = Folders(tmp / "input", tmp / "output", tmp / "temp")
    folders.ensure()
    models = tmp / "models"
    (models / "checkpoints").mkdir(parents=True)
    (models / "checkpoints" / "tiny.safetensors").write_bytes(b"x")
    (models / "checkpoints" / "readme.txt").write_text("not a model")
    registry = NodeRegistry()
    registry.register(CoreConcat)
    events: list[tuple[str, Any, str | None]] = []
    shim = ComfyShim(
        folders, None, lambda event, data, sid: events.append((event, data, sid)), models_dir=models
    )
    return Env(registry, shim, folders, models, events)


@pytest.fixture
def env(tmp_path: Path) -> Env:
    return make_env(tmp_path)


@pytest.fixture
def loaded(env: Env) -> tuple[Env, PluginReport]:
    return env, env.load(PACKS)
