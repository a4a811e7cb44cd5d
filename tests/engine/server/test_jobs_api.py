"""Loom's native job API under /api/v1 (job resources, SSE, cancel, webhooks, conversion, OpenAPI)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient

from engine.formats import to_saved
from nodes.bench.stubs.server_nodes import workflow
from tests.engine.server.conftest import block_queue

UI_WORKFLOW: dict[str, Any] = {
    "last_node_id": 3,
    "last_link_id": 2,
    "version": 0.4,
    "nodes": [
        {
            "id": 1,
            "type": "StubNumber",
            "mode": 0,
            "inputs": [],
            "outputs": [{"name": "INT", "type": "INT", "links": [1]}],
            "widgets_values": [4],
        },
        {
            "id": 2,
            "type": "StubSlow",
            "mode": 0,
            "inputs": [{"name": "value", "type": "INT", "link": 1}],
            "outputs": [{"name": "INT", "type": "INT", "links": [2]}],
            "widgets_values": [0, 2, 0.0, False],
        },
        {
            "id": 3,
            "type": "StubSave",
            "mode": 0,
            "inputs": [{"name": "value", "type": "INT", "link": 2}],
            "outputs": [],
            "widgets_values": [0, "ui"],
        },
    ],
    "links": [[1, 1, 0, 2, 0, "INT"], [2, 2, 0, 3, 0, "INT"]],
}


async def wait_final(client: TestClient, job_id: str, timeout: float = 15.0) -> dict[str, Any]:
    for _ in range(int(timeout / 0.02)):
        job = await (await client.get(f"/api/v1/jobs/{job_id}")).json()
        if job["status"] in ("succeeded", "failed", "cancelled"):
            return job
        await asyncio.sleep(0.02)
    raise AssertionError(f"job {job_id} did not finish")


async def test_job_lifecycle_api_format(client: TestClient) -> None:
    blocker = await block_queue(client)  # the new job is certainly still queued when created
    resp = await client.post("/api/v1/jobs", json={"workflow": workflow(3), "client_id": "n"})
    assert resp.status == 201
    job = await resp.json()
    assert resp.headers["Location"] == f"/api/v1/jobs/{job['id']}"
    assert job["status"] == "queued" and job["outputs"] == [] and job["errors"] == []
    assert set(job) >= {"id", "status", "progress", "outputs", "errors", "created_at"}
    assert (await client.delete(f"/api/v1/jobs/{blocker}")).status == 202
    final = await wait_final(client, job["id"])
    assert final["status"] == "succeeded" and final["finished_at"] and final["started_at"]
    (output,) = final["outputs"]
    assert output["node"] == "3" and output["type"] == "output"
    image = await client.get(output["url"])
    assert image.status == 200 and (await image.read()).startswith(b"\x89PNG")
    listed = await (await client.get("/api/v1/jobs")).json()
    assert job["id"] in [j["id"] for j in listed["jobs"]]


async def test_ui_and_saved_formats_are_converted(client: TestClient) -> None:
    converted = await (await client.post("/api/v1/workflows/convert", json=UI_WORKFLOW)).json()
    assert converted["source_format"] == "ui"
    prompt = converted["prompt"]
    assert prompt["1"]["inputs"] == {"value": 4}
    assert prompt["2"]["inputs"]["value"] == ["1", 0] and prompt["2"]["inputs"]["steps"] == 2
    ui_job = await (await client.post("/api/v1/jobs", json={"workflow": UI_WORKFLOW})).json()
    assert (await wait_final(client, ui_job["id"]))["status"] == "succeeded"
    history = await (await client.get(f"/history/{ui_job['id']}")).json()
    assert history[ui_job["id"]]["prompt"][3]["extra_pnginfo"]["workflow"]["nodes"]  # editor JSON kept

    saved = to_saved(workflow(6))
    assert (await (await client.post("/api/v1/workflows/convert", json=saved)).json())[
        "source_format"
    ] == "loom"
    saved_job = await (await client.post("/api/v1/jobs", json={"workflow": saved})).json()
    assert (await wait_final(client, saved_job["id"]))["status"] == "succeeded"
    api = await (await client.post("/api/v1/workflows/convert", json={"workflow": workflow(1)})).json()
    assert api["source_format"] == "api" and api["prompt"] == workflow(1)


async def test_job_errors(client: TestClient) -> None:
    assert (await client.post("/api/v1/jobs", json={})).status == 400
    bad = await client.post("/api/v1/jobs", json={"workflow": {"x": 1}})
    assert bad.status == 400 and (await bad.json())["error"]["type"] == "invalid_workflow"
    invalid = workflow(1)
    invalid["2"]["inputs"]["steps"] = -5
    resp = await client.post("/api/v1/jobs", json={"workflow": invalid})
    body = await resp.json()
    assert resp.status == 400 and "2" in body["error"]["node_errors"]
    assert (await client.get("/api/v1/jobs/nope")).status == 404
    assert (await client.delete("/api/v1/jobs/nope")).status == 404
    assert (await client.post("/api/v1/workflows/convert", data=b"[")).status == 400
    failing = await (await client.post("/api/v1/jobs", json={"workflow": workflow(1, fail=True)})).json()
    final = await wait_final(client, failing["id"])
    assert final["status"] == "failed" and "stub failure" in final["errors"][0]["exception_message"]
    assert (await client.delete(f"/api/v1/jobs/{failing['id']}")).status == 409


async def test_cancel_queued_and_running(client: TestClient) -> None:
    running = {"id": await block_queue(client)}
    queued = await (await client.post("/api/v1/jobs", json={"workflow": workflow(1)})).json()
    resp = await client.delete(f"/api/v1/jobs/{queued['id']}")
    assert resp.status == 202 and (await resp.json())["status"] == "cancelled"
    assert (await client.delete(f"/api/v1/jobs/{running['id']}")).status == 202
    assert (await wait_final(client, running["id"]))["status"] == "cancelled"
    assert (await wait_final(client, queued["id"]))["status"] == "cancelled"
    history = await (await client.get("/history")).json()
    assert queued["id"] not in history and running["id"] in history


async def test_sse_events(client: TestClient) -> None:
    blocker = await block_queue(client)  # the job waits in the queue while its stream opens
    job = await (await client.post("/api/v1/jobs", json={"workflow": workflow(2, steps=3)})).json()
    resp = await client.get(f"/api/v1/jobs/{job['id']}/events")
    assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
    first = await resp.content.readuntil(b"\n\n")  # the stream is open and subscribed
    assert first.startswith(b"event: job")
    await client.delete(f"/api/v1/jobs/{blocker}")
    text = (first + await resp.read()).decode()
    events = []
    for block in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if not line.startswith(":"))
        events.append((lines["event"], json.loads(lines["data"])))
    assert events[0][0] == "job" and events[-1][0] == "job"
    assert events[-1][1]["status"] == "succeeded"
    kinds = [e[0] for e in events]
    assert kinds.count("progress") == 3 and "executed" in kinds
    # a finished job's stream is one event
    again = (await (await client.get(f"/api/v1/jobs/{job['id']}/events")).read()).decode()
    assert again.count("event: job") == 1
    assert (await client.get("/api/v1/jobs/nope/events")).status == 404


async def test_webhook(client: TestClient, aiohttp_server: Any) -> None:
    received: list[dict[str, Any]] = []
    got = asyncio.Event()

    async def hook(request: web.Request) -> web.Response:
        received.append(await request.json())
        got.set()
        return web.Response(text="ok")

    receiver = web.Application()
    receiver.router.add_post("/hook", hook)
    server = await aiohttp_server(receiver, host="127.0.0.1")
    url = f"http://127.0.0.1:{server.port}/hook"
    job = await (await client.post("/api/v1/jobs", json={"workflow": workflow(5), "webhook": url})).json()
    await asyncio.wait_for(got.wait(), 15)
    assert received[0]["id"] == job["id"] and received[0]["status"] == "succeeded"
    assert received[0]["outputs"][0]["node"] == "3"
    remote = await client.post(
        "/api/v1/jobs", json={"workflow": workflow(5), "webhook": "http://example.com/x"}
    )
    assert remote.status == 400 and (await remote.json())["error"]["type"] == "webhook_not_allowed"
    assert (
        await client.post("/api/v1/jobs", json={"workflow": workflow(5), "webhook": "ftp://x"})
    ).status == 400


async def test_the_editor_gets_the_converters_ui_rules(client: TestClient) -> None:
    from engine.formats.ui_rules import RULES_FILE

    resp = await client.get("/api/v1/workflows/ui-rules")
    assert resp.status == 200 and resp.content_type == "application/json"  # a JSON module needs the type
    assert await resp.json() == json.loads(RULES_FILE.read_text())
    doc = await (await client.get("/api/v1/openapi.json")).json()
    assert "/api/v1/workflows/ui-rules" in doc["paths"]


async def test_openapi(client: TestClient) -> None:
    doc = await (await client.get("/api/v1/openapi.json")).json()
    assert doc["openapi"].startswith("3.")
    for path in (
        "/api/v1/jobs",
        "/api/v1/jobs/{job_id}",
        "/api/v1/jobs/{job_id}/events",
        "/api/v1/workflows/convert",
        "/prompt",
        "/queue",
        "/history",
        "/view",
        "/object_info",
    ):
        assert path in doc["paths"], path
    assert "Job" in doc["components"]["schemas"]
