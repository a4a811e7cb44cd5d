"""A job whose declared tensors cannot fit the process RAM budget is refused at submission, on
ComfyUI's route and on the native one, with ComfyUI's 400 shape naming the node, the size and the
budget; nothing is queued and the server answers the next job as usual."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from engine.context import NodeContext
from engine.memory.process_ram import ProcessRam
from engine.memory.ram_budget import GIB, RamBudget
from engine.node import Node, OutputSizes, TensorSize
from engine.schema import INT, Input, Output
from engine.server.app import ServerParts
from nodes.bench.stubs.server_nodes import make_parts, workflow
from tests.engine.server.conftest import wait_history
from tests.engine.stub_nodes import schema


class StubEmptyImage(Node):
    """Declares a batch of RGB float32 images from its widgets, as EmptyImage does (makes none)."""

    SCHEMA = schema(
        "StubEmptyImage",
        (
            Input("width", INT, "width", default=64, min=1, max=16384),
            Input("height", INT, "height", default=64, min=1, max=16384),
            Input("batch_size", INT, "batch", default=1, min=1, max=4096),
        ),
        (Output("INT", INT, "stands in for the images"),),
    )

    @classmethod
    def estimate_outputs(
        cls, *, width: Any = None, height: Any = None, batch_size: Any = None
    ) -> OutputSizes:
        return (TensorSize((batch_size, height, width, 3)),)

    def run(self, ctx: NodeContext, *, width: int, height: int, batch_size: int) -> tuple[int]:
        return (width * height * batch_size,)


@pytest.fixture
def parts(tmp_path: Path) -> ServerParts:
    made = make_parts(tmp_path)
    made.registry.register_all([StubEmptyImage])
    made.executor.ram = ProcessRam(RamBudget(process_bytes=3 * GIB // 2, rss=lambda: GIB // 2))
    return made


def _big(batch: int) -> dict[str, Any]:
    return {
        "1": {"class_type": "StubEmptyImage", "inputs": {"width": 4096, "height": 4096, "batch_size": batch}},
        "2": {"class_type": "StubSave", "inputs": {"value": ["1", 0], "filename_prefix": "big"}},
    }


async def test_prompt_over_the_budget_is_refused_with_node_size_and_budget(client: TestClient) -> None:
    resp = await client.post("/prompt", json={"prompt": _big(8)})
    assert resp.status == 400
    body = await resp.json()
    node = body["node_errors"]["1"]
    assert node["class_type"] == "StubEmptyImage"
    issue = node["errors"][0]
    assert issue["type"] == "exceeds_ram_budget"
    assert issue["details"].startswith(
        "node 1 (StubEmptyImage) would make 1.50 GiB of tensors (8x4096x4096x3 values of 4 bytes), but "
        "the process RAM budget of 1.50 GiB leaves 1.00 GiB for a job's tensors"
    )
    assert body["error"]["details"] == issue["details"]
    queue = await (await client.get("/queue")).json()
    assert queue == {"queue_running": [], "queue_pending": []}


async def test_native_jobs_route_refuses_it_too_and_the_next_job_runs(client: TestClient) -> None:
    resp = await client.post("/api/v1/jobs", json={"prompt": _big(8)})
    assert resp.status == 400
    assert "exceeds_ram_budget" in await resp.text()
    fits = await client.post("/prompt", json={"prompt": _big(1)})  # 192 MiB of declared tensors
    assert fits.status == 200
    plain = await client.post("/prompt", json={"prompt": workflow(3)})
    prompt_id = (await plain.json())["prompt_id"]
    entry = await wait_history(client, prompt_id)
    assert entry["status"]["status_str"] == "success"
