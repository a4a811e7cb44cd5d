"""/system_stats shows the device budget and, per model placed within it, the run the sampler
announced, its activation estimate, what that left to the weights and the block split chosen."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.memory.device_budget import DeviceBudget, RunShape
from engine.memory.manager import ModelManager
from engine.memory.streaming import StreamPlan, plan_split
from engine.server.app import create_app
from engine.server.common import ServerConfig
from tests.engine.server.conftest import make_parts


class SplitHandle:
    """A model handle whose placement streams per ``plan_split`` (four 100-byte blocks)."""

    key, kind = "unet:split", "unet"

    def estimate_bytes(self) -> int:
        return 400

    def load(self) -> Any:
        return object()

    def to_device(self, module: Any, device: str, dtype: str) -> Any:
        return module

    def activation_bytes(self, module: Any, run: RunShape, dtype: str) -> int:
        return run.batch * run.cells

    def to_device_within(
        self, module: Any, device: str, dtype: str, budget: DeviceBudget, activation_bytes: int = 0
    ) -> Any:
        return module, Placed(plan_split([100] * 4, 0, budget, activation_bytes))


class Placed:
    """The streaming state the manager keeps (``nodes.core.module_streaming.Streaming``'s interface)."""

    def __init__(self, plan: StreamPlan) -> None:
        self.plan = plan

    def describe(self) -> dict[str, Any]:
        return self.plan.describe()

    def close(self) -> None:
        return None


async def test_system_stats_show_the_runs_estimate_and_the_split(aiohttp_client: Any, tmp_path: Path) -> None:
    manager = ModelManager(ram_budget_bytes=1 << 20, prefetch=False)
    manager.device_budget = DeviceBudget(total_bytes=500, simulated=True)
    handle = SplitHandle()
    manager.plan_run(handle, RunShape((1, 4, 8, 8), branches=2, text_tokens=77))  # 128 bytes
    with manager.use(handle):
        pass
    parts = make_parts(tmp_path)
    parts.models = manager
    client = await aiohttp_client(create_app(parts, ServerConfig()))

    stats = (await (await client.get("/system_stats")).json())["loom"]["memory_manager"]

    assert stats["device_budget"]["total_bytes"] == 500
    (placement,) = stats["placements"]
    assert placement["run"] == {"latent": [1, 4, 8, 8], "branches": 2, "text_tokens": 77}
    assert placement["activation_bytes"] == 128 and placement["weights_budget_bytes"] == 372
    assert placement["split"]["resident"] == 1 and placement["split"]["streamed"] == 3  # 100 + 2 slots of 100
    manager.close()
