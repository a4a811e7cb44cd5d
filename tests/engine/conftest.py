from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine.cache import OutputCache
from engine.context import Folders
from engine.events import Event, EventBus
from engine.executor import Executor, RunRequest, RunResult
from engine.registry import NodeRegistry
from tests.engine.stub_nodes import STUBS, StubSettings


class Harness:
    """An executor over the stub nodes, recording events and node calls."""

    def __init__(
        self, tmp: Path, cache: OutputCache | None = None, registry: NodeRegistry | None = None
    ) -> None:
        if registry is None:
            registry = NodeRegistry()
            registry.register_all(STUBS)
        self.registry = registry
        self.folders = Folders(tmp / "in", tmp / "out", tmp / "temp")
        self.folders.ensure()
        self.bus = EventBus()
        self.events: list[Event] = []
        self.bus.subscribe(self.events.append)
        self.settings = StubSettings()
        self.cache = cache if cache is not None else OutputCache()
        self.executor = Executor(registry, self.cache, self.folders, bus=self.bus, settings=self.settings)

    def run(self, prompt: dict[str, Any], **kw: Any) -> RunResult:
        self.settings.record["calls"] = []
        self.events.clear()
        return self.executor.run(RunRequest(prompt=prompt, **kw))

    @property
    def calls(self) -> list[tuple[str, str]]:
        return list(self.settings.record.get("calls", []))

    def ran(self) -> set[str]:
        return {node_id for node_id, _ in self.calls}


@pytest.fixture
def harness(tmp_path: Path) -> Harness:
    return Harness(tmp_path)
