"""ComfyUI's /internal/ routes, as the official frontend reads them:

GET   /internal/logs             "the recent log text"
GET   /internal/logs/raw         {"entries": [{"t", "m"}], "size": {"cols", "rows"}}
PATCH /internal/logs/subscribe   {"clientId", "enabled"} -> new lines as websocket "logs" messages
GET   /internal/folder_paths     {kind: [paths]}
GET   /internal/files/{input|output|temp}   file names, newest first; another type is a 400
"""

from __future__ import annotations

import logging
import os
from typing import Any

from aiohttp.test_utils import TestClient

from engine.server.app import ServerParts
from tests.engine.server.conftest import receive_json


async def test_log_lines_are_served_raw_and_as_text(client: TestClient) -> None:
    logging.getLogger("loom.test").warning("a line for the console panel")
    raw = await (await client.get("/internal/logs/raw")).json()
    assert set(raw) == {"entries", "size"} and set(raw["size"]) == {"cols", "rows"}
    entry = raw["entries"][-1]
    assert set(entry) == {"t", "m"} and "a line for the console panel" in entry["m"]
    text = await (await client.get("/internal/logs")).json()
    assert isinstance(text, str) and "a line for the console panel" in text


async def test_subscribed_clients_get_logs_messages(client: TestClient) -> None:
    ws = await client.ws_connect("/ws?clientId=console-1")
    assert (await receive_json(ws))["type"] == "status"
    resp = await client.patch("/internal/logs/subscribe", json={"clientId": "console-1", "enabled": True})
    assert resp.status == 200
    logging.getLogger("loom.test").warning("pushed to the panel")
    while True:
        message: dict[str, Any] = await receive_json(ws)
        if message["type"] == "logs":
            break
    assert "pushed to the panel" in message["data"]["entries"][0]["m"]
    assert set(message["data"]["size"]) == {"cols", "rows"}
    await client.patch("/internal/logs/subscribe", json={"clientId": "console-1", "enabled": False})
    await ws.close()


async def test_subscribe_needs_a_client_id_and_a_flag(client: TestClient) -> None:
    resp = await client.patch("/internal/logs/subscribe", json={"enabled": "yes"})
    assert resp.status == 400 and "clientId" in (await resp.json())["error"]["message"]


async def test_folder_paths_and_file_listings(client: TestClient, parts: ServerParts) -> None:
    paths = await (await client.get("/internal/folder_paths")).json()
    assert isinstance(paths, dict)
    assert all(isinstance(v, list) and all(isinstance(p, str) for p in v) for v in paths.values())
    older, newer = parts.folders.input_dir / "old.png", parts.folders.input_dir / "new.png"
    older.write_bytes(b"x")
    newer.write_bytes(b"y")
    os.utime(older, (1_000_000, 1_000_000))
    (parts.folders.input_dir / "sub").mkdir()
    assert await (await client.get("/internal/files/input")).json() == ["new.png", "old.png"]
    assert (await client.get("/internal/files/output")).status == 200
    bad = await client.get("/internal/files/models")
    assert bad.status == 400 and "Invalid directory type" in (await bad.json())["error"]["message"]
