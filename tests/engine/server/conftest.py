"""Fixtures: a server built from stub nodes on temporary folders, and a test client."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientWebSocketResponse, WSMsgType, web
from aiohttp.test_utils import TestClient

from engine.server.app import ServerParts, create_app
from engine.server.common import ServerConfig
from engine.server.security import ERRORS
from nodes.bench.stubs.server_nodes import make_parts, workflow

AppFactory = Callable[..., web.Application]


@pytest.fixture
def parts(tmp_path: Path) -> ServerParts:
    return make_parts(tmp_path)


@pytest.fixture
def config() -> ServerConfig:
    return ServerConfig(max_upload_bytes=256 * 1024)


@pytest.fixture
async def client(aiohttp_client: Any, parts: ServerParts, config: ServerConfig) -> TestClient:
    app = create_app(parts, config)
    test_client = await aiohttp_client(app)
    yield test_client
    assert app[ERRORS].count == 0, "the server turned an exception into a 500"


async def receive_json(ws: ClientWebSocketResponse, timeout: float = 10.0) -> dict[str, Any]:
    """The next text message (binary preview frames are skipped)."""
    deadline = time.monotonic() + timeout
    while True:
        msg = await ws.receive(timeout=max(0.01, deadline - time.monotonic()))
        if msg.type == WSMsgType.TEXT:
            return json.loads(msg.data)
        if msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSED, WSMsgType.ERROR):
            raise AssertionError(f"websocket closed: {msg}")


async def wait_done(
    ws: ClientWebSocketResponse, prompt_id: str, timeout: float = 15.0
) -> list[dict[str, Any]]:
    """Messages until ``executing`` with node null for ``prompt_id`` (ComfyUI's 'done')."""
    seen = []
    while True:
        msg = await receive_json(ws, timeout)
        seen.append(msg)
        data = msg.get("data", {})
        if msg["type"] == "executing" and data.get("node") is None and data.get("prompt_id") == prompt_id:
            return seen


def blocker(value: int = 0) -> dict[str, Any]:
    """A workflow that runs 500 s unless interrupted (it stops within 50 ms when asked)."""
    return workflow(value, steps=10_000, delay=0.05)


async def wait_running(client: TestClient, prompt_id: str, timeout: float = 30.0) -> None:
    """Until ``prompt_id`` is the running job (fails loudly; never goes on hoping)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        running = (await (await client.get("/queue")).json())["queue_running"]
        if running and running[0][1] == prompt_id:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{prompt_id} never started running")


async def block_queue(client: TestClient, value: int = 0) -> str:
    """Start a job that runs until interrupted, so jobs queued after it stay pending; returns its id
    once it is running."""
    resp = await client.post("/prompt", json={"prompt": blocker(value)})
    assert resp.status == 200, await resp.text()
    prompt_id = str((await resp.json())["prompt_id"])
    await wait_running(client, prompt_id)
    return prompt_id


async def wait_history(client: TestClient, prompt_id: str, timeout: float = 15.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        resp = await client.get(f"/history/{prompt_id}")
        body = await resp.json()
        if prompt_id in body:
            return body[prompt_id]
        await asyncio.sleep(0.02)
    raise AssertionError(f"{prompt_id} never reached the history")
