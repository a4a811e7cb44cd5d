"""The websocket: ComfyUI's message shapes and routing.

{"type": "status", "data": {"status": {"exec_info": {"queue_remaining": n}}, "sid": id}}
{"type": "execution_start", "data": {"prompt_id", "timestamp"}}
{"type": "execution_cached", "data": {"nodes": [...], "prompt_id", "timestamp"}}
{"type": "executing", "data": {"node": id | null, "display_node", "prompt_id"}}
{"type": "progress", "data": {"value", "max", "prompt_id", "node"}}
{"type": "executed", "data": {"node", "display_node", "output": {...}, "prompt_id"}}
{"type": "execution_success" | "execution_interrupted" | "execution_error", "data": {...}}
binary: 4-byte big-endian event type (1 = preview image), 4-byte format (1 = JPEG, 2 = PNG), image bytes
"""

from __future__ import annotations

import struct

from aiohttp import WSMsgType
from aiohttp.test_utils import TestClient

from engine.server.app import HUB, RELAY
from nodes.bench.stubs.server_nodes import workflow
from tests.engine.server.conftest import receive_json, wait_done, wait_history


async def test_status_on_connect_and_queue_change(client: TestClient) -> None:
    ws = await client.ws_connect("/ws?clientId=me")
    assert await receive_json(ws) == {
        "type": "status",
        "data": {"status": {"exec_info": {"queue_remaining": 0}}, "sid": "me"},
    }
    await client.post("/prompt", json={"prompt": workflow(1), "client_id": "me"})
    status = await receive_json(ws)
    assert status["type"] == "status" and status["data"]["status"]["exec_info"]["queue_remaining"] == 1
    anonymous = await client.ws_connect("/ws")
    first = await receive_json(anonymous)
    assert first["type"] == "status" and len(first["data"]["sid"]) >= 16
    await ws.close()
    await anonymous.close()


async def test_event_sequence_and_cached_rerun(client: TestClient) -> None:
    ws = await client.ws_connect("/ws?clientId=seq")
    await receive_json(ws)
    body = await (await client.post("/prompt", json={"prompt": workflow(2), "client_id": "seq"})).json()
    msgs = [m for m in await wait_done(ws, body["prompt_id"]) if m["type"] != "status"]
    kinds = [m["type"] for m in msgs]
    assert kinds == [
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
    assert all(m["data"]["prompt_id"] == body["prompt_id"] for m in msgs)
    assert [m["data"]["node"] for m in msgs if m["type"] == "executing"] == ["1", "2", "3", None]
    progress = [m["data"] for m in msgs if m["type"] == "progress"]
    assert progress[-1] == {"value": 2, "max": 2, "prompt_id": body["prompt_id"], "node": "2"}
    executed = next(m["data"] for m in msgs if m["type"] == "executed")
    assert executed["node"] == "3" and executed["output"]["images"][0]["type"] == "output"

    again = await (await client.post("/prompt", json={"prompt": workflow(2), "client_id": "seq"})).json()
    msgs = [m for m in await wait_done(ws, again["prompt_id"]) if m["type"] != "status"]
    cached = next(m["data"] for m in msgs if m["type"] == "execution_cached")
    assert cached["nodes"] == ["1", "2", "3"]  # every node taken from the cache, as ComfyUI lists them
    assert any(m["type"] == "executed" for m in msgs)  # cached output nodes re-send their UI
    await ws.close()


async def test_events_go_to_their_client_only(client: TestClient) -> None:
    a = await client.ws_connect("/ws?clientId=a")
    b = await client.ws_connect("/ws?clientId=b")
    await receive_json(a)
    await receive_json(b)
    body = await (await client.post("/prompt", json={"prompt": workflow(3), "client_id": "a"})).json()
    await wait_done(a, body["prompt_id"])
    # then a job of b's own: b's messages arrive in order, so everything b could have been sent about
    # a's job comes before b's own job is done (no waiting for something not to happen)
    own = await (await client.post("/prompt", json={"prompt": workflow(5), "client_id": "b"})).json()
    seen_by_b = await wait_done(b, own["prompt_id"])
    assert all(m["data"].get("prompt_id") in (None, own["prompt_id"]) for m in seen_by_b)
    assert not [m for m in seen_by_b if m["type"] != "status" and m["data"]["prompt_id"] == body["prompt_id"]]
    # a prompt without client_id goes to everyone
    anon = await (await client.post("/prompt", json={"prompt": workflow(4)})).json()
    await wait_done(a, anon["prompt_id"])
    await wait_done(b, anon["prompt_id"])
    await a.close()
    await b.close()


async def test_binary_previews(client: TestClient) -> None:
    client.app[HUB].max_waiting_previews = 100  # no frame dropped for a slow reader: both formats arrive
    ws = await client.ws_connect("/ws?clientId=p")
    await receive_json(ws)
    body = await (
        await client.post(
            "/prompt", json={"prompt": workflow(1, steps=4, delay=0.15, previews=True), "client_id": "p"}
        )
    ).json()
    frames = []
    while True:
        msg = await ws.receive(timeout=10)
        if msg.type == WSMsgType.BINARY:
            frames.append(msg.data)
        elif msg.type == WSMsgType.TEXT:
            data = msg.json()
            if data["type"] == "executing" and data["data"]["node"] is None:
                break
    assert frames, "no preview frames arrived"
    formats = set()
    for frame in frames:
        event, fmt = struct.unpack(">II", frame[:8])
        assert event == 1 and fmt in (1, 2)
        formats.add(fmt)
        magic = frame[8:12]
        assert magic.startswith(b"\xff\xd8") if fmt == 1 else magic == b"\x89PNG"
    assert formats == {1, 2}
    await wait_history(client, body["prompt_id"])
    await ws.close()


async def test_previews_are_paced(client: TestClient) -> None:
    ws = await client.ws_connect("/ws?clientId=fast")
    await receive_json(ws)
    body = await (
        await client.post(
            "/prompt", json={"prompt": workflow(1, steps=200, delay=0.0, previews=True), "client_id": "fast"}
        )
    ).json()
    frames = 0
    while True:
        msg = await ws.receive(timeout=10)
        if msg.type == WSMsgType.BINARY:
            frames += 1
        elif (
            msg.type == WSMsgType.TEXT
            and msg.json()["type"] == "executing"
            and msg.json()["data"]["node"] is None
        ):
            break
    await wait_history(client, body["prompt_id"])
    job = await (await client.get(f"/api/v1/jobs/{body['prompt_id']}")).json()
    seconds = job["timings"]["total_s"]
    interval = client.app[RELAY].min_preview_interval
    allowed = 1 + seconds / interval  # frames are paced in the job's own time: at most one per interval
    assert frames <= allowed, (
        f"{frames} frames in {seconds:.2f} s (at most {allowed:.0f}): previews are not paced"
    )
    assert frames < 200
    await ws.close()


async def test_reconnect_resumes(client: TestClient) -> None:
    ws = await client.ws_connect("/ws?clientId=r")
    await receive_json(ws)
    await ws.close()
    body = await (await client.post("/prompt", json={"prompt": workflow(7), "client_id": "r"})).json()
    await wait_history(client, body["prompt_id"])
    back = await client.ws_connect("/ws?clientId=r")
    first = await receive_json(back)
    assert first["type"] == "status" and first["data"]["sid"] == "r"
    missed = await wait_done(back, body["prompt_id"])
    kinds = [m["type"] for m in missed]
    assert "execution_start" in kinds and "executed" in kinds and "execution_success" in kinds
    await back.close()


async def test_client_messages_ignored(client: TestClient) -> None:
    ws = await client.ws_connect("/ws?clientId=chatty")
    await receive_json(ws)
    await ws.send_str("not json")
    await ws.send_str('{"type": "something", "data": 1}')
    await ws.send_bytes(b"\x00\x01")
    await ws.send_str('{"type": "feature_flags", "data": {"supports_preview_metadata": true}}')
    flags = await receive_json(ws)
    assert flags["type"] == "feature_flags"
    body = await (await client.post("/prompt", json={"prompt": workflow(8), "client_id": "chatty"})).json()
    await wait_done(ws, body["prompt_id"])
    assert "chatty" in client.app[HUB].connected()
    await ws.close()


async def test_interrupted_event(client: TestClient) -> None:
    ws = await client.ws_connect("/ws?clientId=i")
    await receive_json(ws)
    body = await (
        await client.post("/prompt", json={"prompt": workflow(1, steps=2000, delay=0.005), "client_id": "i"})
    ).json()
    while (await receive_json(ws))["type"] != "progress":
        pass
    await client.post("/api/interrupt", json={"prompt_id": body["prompt_id"]})
    msgs = await wait_done(ws, body["prompt_id"])
    interrupted = next(m["data"] for m in msgs if m["type"] == "execution_interrupted")
    assert interrupted["node_id"] == "2" and interrupted["node_type"] == "StubSlow"
    assert interrupted["executed"] == ["1"]
    await ws.close()
