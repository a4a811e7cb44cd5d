"""One request never blocks the event loop, and workflows have a node limit (issue 19, item 5).

A real server (aiohttp's test server on a socket) gets a heavy request while a second client pings
it; the pings must keep being answered while the heavy request is worked on (counted, and the
slowest ping compared with the heavy request's duration as a ratio, never an absolute time)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from engine.workflow import MAX_NODES


def subgraph_bomb(fanout: int = 10, depth: int = 5) -> dict[str, Any]:
    """A small UI-format file: each subgraph holds ``fanout`` instances of the next one, the last
    holds ``fanout`` real nodes; expanded it has ``fanout ** depth`` nodes (100,000 by default)."""
    definitions = []
    for level in range(depth):
        kind = f"sg{level + 1}" if level + 1 < depth else "StubNumber"
        nodes = [{"id": i + 1, "type": kind, "inputs": [], "outputs": [],
                  **({"widgets_values": [1]} if kind == "StubNumber" else {})} for i in range(fanout)]
        definitions.append({"id": f"sg{level}", "name": f"level {level}", "nodes": nodes, "links": [],
                            "inputs": [], "outputs": []})
    return {"last_node_id": 1, "last_link_id": 0, "version": 0.4, "links": [],
            "nodes": [{"id": 1, "type": "sg0", "inputs": [], "outputs": []}],
            "definitions": {"subgraphs": definitions}}


def big_api_workflow(count: int) -> dict[str, Any]:
    prompt = {str(i): {"class_type": "StubNumber", "inputs": {"value": i}} for i in range(1, count)}
    prompt[str(count)] = {"class_type": "StubSave", "inputs": {"value": ["1", 0], "filename_prefix": "big"}}
    return prompt


async def test_a_subgraph_bomb_is_refused_with_413(client: TestClient) -> None:
    bomb = subgraph_bomb()
    assert len(json.dumps(bomb)) < 5000  # a small file ...
    for route, body in (("/api/v1/workflows/convert", bomb), ("/api/v1/jobs", {"workflow": bomb})):
        resp = await client.post(route, json=body)
        assert resp.status == 413, (route, await resp.text())
        error = (await resp.json())["error"]
        assert error["type"] == "workflow_too_large" and str(MAX_NODES) in error["message"]


async def test_an_api_workflow_over_the_node_limit_is_refused_with_413(client: TestClient) -> None:
    huge = big_api_workflow(MAX_NODES + 1)
    resp = await client.post("/prompt", json={"prompt": huge})
    assert resp.status == 413 and (await resp.json())["error"]["type"] == "workflow_too_large"
    resp = await client.post("/api/v1/jobs", json={"workflow": huge})
    assert resp.status == 413


@pytest.mark.parametrize(("route", "key"), [("/prompt", "prompt"), ("/api/v1/jobs", "workflow")])
async def test_the_loop_answers_others_while_a_large_workflow_is_validated(
        client: TestClient, route: str, key: str) -> None:
    body = json.dumps({key: big_api_workflow(MAX_NODES)})  # at the limit: accepted, heavy to validate
    latencies: list[float] = []
    done = asyncio.Event()

    async def ping() -> None:
        while not done.is_set():
            started = time.perf_counter()
            assert (await client.get("/prompt")).status == 200
            latencies.append(time.perf_counter() - started)
            await asyncio.sleep(0.005)

    pinger = asyncio.create_task(ping())
    await asyncio.sleep(0.05)
    before = len(latencies)
    started = time.perf_counter()
    resp = await client.post(route, data=body, headers={"Content-Type": "application/json"})
    heavy = time.perf_counter() - started
    done.set()
    await pinger
    assert resp.status in (200, 201), await resp.text()
    during = latencies[before:]
    ratio = max(during) / heavy
    print(f"\n{route}: heavy request {heavy:.3f} s, {len(during)} pings answered meanwhile, "
          f"slowest ping {max(during) * 1000:.1f} ms = {ratio:.2f} of the heavy request")
    assert len(during) >= 3, "the event loop answered no other request while it worked on the large workflow"
    assert ratio < 0.5
