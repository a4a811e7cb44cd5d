"""20 clients submit concurrently over HTTP and listen on their own websocket: every job completes,
each client receives exactly its own events, in order, none lost or duplicated."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp.test_utils import TestClient

from nodes.bench.stubs.server_nodes import workflow
from tests.engine.server.conftest import receive_json

CLIENTS = 20
JOBS_PER_CLIENT = 2
EXPECTED = [
    "execution_start",
    "execution_cached",
    "executing",
    "executing",
    "progress",
    "progress",
    "executing",
    "executed",
    "execution_success",
    "executing",
]


async def one_client(client: TestClient, index: int) -> dict[str, list[dict[str, Any]]]:
    sid = f"client-{index}"
    ws = await client.ws_connect(f"/ws?clientId={sid}")
    assert (await receive_json(ws))["type"] == "status"
    mine: list[str] = []
    for job in range(JOBS_PER_CLIENT):
        value = index * 100 + job  # distinct values: nothing is served from the cache
        resp = await client.post("/prompt", json={"prompt": workflow(value), "client_id": sid})
        assert resp.status == 200
        mine.append((await resp.json())["prompt_id"])
    events: dict[str, list[dict[str, Any]]] = {p: [] for p in mine}
    done: set[str] = set()
    while done != set(mine):
        msg = await receive_json(ws, timeout=60)
        if msg["type"] == "status":
            assert msg["data"]["sid"] == sid
            continue
        prompt_id = msg["data"]["prompt_id"]
        assert prompt_id in events, f"{sid} received an event of someone else's prompt"
        events[prompt_id].append(msg)
        if msg["type"] == "executing" and msg["data"]["node"] is None:
            done.add(prompt_id)
    await ws.close()
    return events


async def test_twenty_concurrent_clients(client: TestClient) -> None:
    results = await asyncio.gather(*(one_client(client, i) for i in range(CLIENTS)))
    seen_prompts = set()
    for events in results:
        for prompt_id, msgs in events.items():
            seen_prompts.add(prompt_id)
            assert [m["type"] for m in msgs] == EXPECTED, prompt_id
            assert [m["data"]["node"] for m in msgs if m["type"] == "executing"] == ["1", "2", "3", None]
            assert [m["data"]["value"] for m in msgs if m["type"] == "progress"] == [1, 2]
    assert len(seen_prompts) == CLIENTS * JOBS_PER_CLIENT
    history = await (await client.get("/history")).json()
    assert set(history) == seen_prompts
    assert all(entry["status"]["status_str"] == "success" for entry in history.values())
    assert await (await client.get("/prompt")).json() == {"exec_info": {"queue_remaining": 0}}
