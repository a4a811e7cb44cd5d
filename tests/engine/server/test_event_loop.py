"""One request never blocks the event loop, and workflows have a node limit (issue 19, item 5).

A real server (aiohttp's test server on a socket) gets a large workflow whose validation is held
open until the test has had other requests answered: with validation on the event loop those
requests could not be answered at all (no clock is read; a generous failsafe only stops a hang)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from engine.formats import MAX_NODES
from engine.server.app import ServerParts

FAILSAFE_S = 60.0


def subgraph_bomb(fanout: int = 10, depth: int = 5) -> dict[str, Any]:
    """A small UI-format file: each subgraph holds ``fanout`` instances of the next one, the last
    holds ``fanout`` real nodes; expanded it has ``fanout ** depth`` nodes (100,000 by default)."""
    definitions = []
    for level in range(depth):
        kind = f"sg{level + 1}" if level + 1 < depth else "StubNumber"
        nodes = [
            {
                "id": i + 1,
                "type": kind,
                "inputs": [],
                "outputs": [],
                **({"widgets_values": [1]} if kind == "StubNumber" else {}),
            }
            for i in range(fanout)
        ]
        definitions.append(
            {
                "id": f"sg{level}",
                "name": f"level {level}",
                "nodes": nodes,
                "links": [],
                "inputs": [],
                "outputs": [],
            }
        )
    return {
        "last_node_id": 1,
        "last_link_id": 0,
        "version": 0.4,
        "links": [],
        "nodes": [{"id": 1, "type": "sg0", "inputs": [], "outputs": []}],
        "definitions": {"subgraphs": definitions},
    }


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


@pytest.fixture
def held_validation(parts: ServerParts) -> HeldValidation:
    """The executor's validation, wrapped so that it waits for the test's go-ahead (installed before
    the ``client`` fixture builds the app, which takes ``parts.executor.validate``)."""
    held = HeldValidation(parts.executor.validate)
    parts.executor.validate = held  # type: ignore[method-assign]
    return held


class HeldValidation:
    """Calls the real validation, but only after ``release``; records whether it ran on an event loop."""

    def __init__(self, real: Callable[..., Any]) -> None:
        self.real = real
        self.entered = threading.Event()
        self.released = threading.Event()
        self.ran_on_event_loop: bool | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            asyncio.get_running_loop()
            self.ran_on_event_loop = True
        except RuntimeError:
            self.ran_on_event_loop = False
        self.entered.set()
        if not self.released.wait(FAILSAFE_S):  # only reached when the loop itself is stuck in here
            raise RuntimeError("validation was never released: the event loop was blocked")
        return self.real(*args, **kwargs)


@pytest.mark.parametrize(("route", "key"), [("/prompt", "prompt"), ("/api/v1/jobs", "workflow")])
async def test_the_loop_answers_others_while_a_large_workflow_is_validated(
    held_validation: HeldValidation, client: TestClient, route: str, key: str
) -> None:
    body = json.dumps({key: big_api_workflow(MAX_NODES)})  # at the limit: accepted, heavy to validate
    heavy = asyncio.create_task(client.post(route, data=body, headers={"Content-Type": "application/json"}))
    while not held_validation.entered.is_set():  # parsing and conversion happen first
        assert not heavy.done(), await heavy.result().text()
        await asyncio.sleep(0.01)
    # The large workflow is now inside validation, held there: other requests must still be answered.
    for _ in range(3):
        ping = await asyncio.wait_for(client.get("/prompt"), FAILSAFE_S)
        assert ping.status == 200
        assert (await ping.json())["exec_info"]["queue_remaining"] == 0  # the held job is not queued yet
    held_validation.released.set()
    resp = await heavy
    assert resp.status in (200, 201), await resp.text()
    assert held_validation.ran_on_event_loop is False
