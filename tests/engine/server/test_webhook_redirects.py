"""A webhook POST never follows a redirect: the allow-list is checked on the URL the client
gave, so a 30x to another host would hand the job to a target the server refused (issue 33,
item 4). A redirect answer is logged as a failed delivery."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from nodes.bench.stubs.server_nodes import workflow


@pytest.mark.parametrize("status", [307, 308, 302, 303, 301])
async def test_a_webhook_redirect_is_not_followed_and_is_logged_as_failed(
    client: TestClient, aiohttp_server: Any, caplog: pytest.LogCaptureFixture, status: int
) -> None:
    target_hits: list[str] = []

    async def target(request: web.Request) -> web.Response:
        target_hits.append(request.method)
        return web.Response(text="ok")

    elsewhere = web.Application()
    elsewhere.router.add_route("*", "/stolen", target)
    other = await aiohttp_server(elsewhere, host="127.0.0.1")
    redirect_to = f"http://127.0.0.1:{other.port}/stolen"

    async def hook(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(status=status, headers={"Location": redirect_to})

    receiver = web.Application()
    receiver.router.add_post("/hook", hook)
    server = await aiohttp_server(receiver, host="127.0.0.1")
    url = f"http://127.0.0.1:{server.port}/hook"

    caplog.set_level(logging.WARNING)
    resp = await client.post("/api/v1/jobs", json={"workflow": workflow(2), "webhook": url})
    assert resp.status == 201

    def failed() -> list[logging.LogRecord]:
        return [r for r in caplog.records if "webhook" in r.getMessage() and "redirect" in r.getMessage()]

    for _ in range(1500):  # until the delivery ended one way or the other (bounded, not timed)
        if failed() or target_hits:
            break
        await asyncio.sleep(0.01)
    assert target_hits == []
    (record,) = failed()
    assert str(status) in record.getMessage() and redirect_to in record.getMessage()
