"""ComfyUI's HTTP routes, with the shapes ComfyUI documents (server.py / the API examples):

POST /prompt  {prompt, client_id?, prompt_id?, number?, front?, extra_data?, partial_execution_targets?}
  200 {"prompt_id": str, "number": int, "node_errors": {}}
  400 {"error": {"type", "message", "details", "extra_info"}, "node_errors": {id: {"errors", "dependent_outputs",
       "class_type"}}}
GET  /prompt  {"exec_info": {"queue_remaining": int}}
GET  /queue   {"queue_running": [[number, prompt_id, prompt, extra_data, outputs_to_execute]], "queue_pending": [...]}
POST /queue   {"delete": [ids]} | {"clear": true}
GET  /history[?max_items=n]  {prompt_id: {"prompt": [5-tuple], "outputs": {node: ui}, "status": {"status_str",
       "completed", "messages": [[event, data]]}, "meta": {node: {...}}}}
GET  /object_info[/{class}]   unknown class -> {}
"""

from __future__ import annotations

import asyncio

from aiohttp.test_utils import TestClient

from nodes.bench.stubs.server_nodes import workflow
from tests.engine.server.conftest import block_queue, receive_json, wait_done, wait_history


async def _block_queue(client: TestClient) -> str:
    """A job that runs until interrupted, so later ones stay pending; returns its id once running."""
    return await block_queue(client)


async def test_post_prompt_shape_and_history(client: TestClient) -> None:
    workflow_json = {"nodes": [], "links": [], "version": 0.4}
    resp = await client.post(
        "/prompt",
        json={
            "prompt": workflow(5),
            "client_id": "c1",
            "extra_data": {"extra_pnginfo": {"workflow": workflow_json}},
        },
    )
    assert resp.status == 200
    body = await resp.json()
    assert set(body) == {"prompt_id", "number", "node_errors"}
    assert isinstance(body["number"], int) and body["node_errors"] == {}
    entry = await wait_history(client, body["prompt_id"])
    assert set(entry) == {"prompt", "outputs", "status", "meta"}
    number, prompt_id, prompt, extra, outputs = entry["prompt"]
    assert (number, prompt_id, outputs) == (body["number"], body["prompt_id"], ["3"])
    assert prompt == workflow(5)
    assert extra["client_id"] == "c1" and extra["extra_pnginfo"]["workflow"] == workflow_json
    assert entry["status"]["status_str"] == "success" and entry["status"]["completed"] is True
    kinds = [m[0] for m in entry["status"]["messages"]]
    assert kinds[0] == "execution_start" and kinds[-1] == "execution_success"
    assert all(isinstance(m, list) and len(m) == 2 for m in entry["status"]["messages"])
    image = entry["outputs"]["3"]["images"][0]
    assert set(image) == {"filename", "subfolder", "type"} and image["type"] == "output"
    assert entry["meta"]["3"]["node_id"] == "3"
    all_history = await (await client.get("/history")).json()
    assert list(all_history) == [body["prompt_id"]]


async def test_prompt_given_id_and_duplicate(client: TestClient) -> None:
    resp = await client.post("/prompt", json={"prompt": workflow(1), "prompt_id": "my-id"})
    assert (await resp.json())["prompt_id"] == "my-id"
    again = await client.post("/prompt", json={"prompt": workflow(1), "prompt_id": "my-id"})
    assert again.status == 400
    assert (await again.json())["error"]["type"] == "duplicate_prompt_id"


async def test_prompt_errors(client: TestClient) -> None:
    resp = await client.post("/prompt", json={"client_id": "x"})
    assert resp.status == 400
    body = await resp.json()
    assert body == {
        "error": {
            "type": "no_prompt",
            "message": "No prompt provided",
            "details": "No prompt provided",
            "extra_info": {},
        },
        "node_errors": {},
    }
    bad = workflow(1)
    bad["2"]["inputs"]["steps"] = "many"
    resp = await client.post("/prompt", json={"prompt": bad})
    assert resp.status == 400
    body = await resp.json()
    assert set(body) == {"error", "node_errors"}
    assert body["error"]["type"] == "prompt_outputs_failed_validation"
    assert set(body["error"]) >= {"type", "message", "details", "extra_info"}
    node = body["node_errors"]["2"]
    assert node["class_type"] == "StubSlow" and node["dependent_outputs"] == ["3"]
    assert set(node["errors"][0]) == {"type", "message", "details", "extra_info"}
    unknown = {"1": {"class_type": "NoSuchNode", "inputs": {}}}
    assert (await client.post("/prompt", json={"prompt": unknown})).status == 400
    assert (await client.post("/prompt", data=b"{not json")).status == 400
    assert (await client.post("/prompt", json=[1, 2])).status == 400
    assert (await client.post("/prompt", json={"prompt": workflow(1), "number": "x"})).status == 400


async def test_get_prompt_queue_and_front(client: TestClient) -> None:
    blocker = await _block_queue(client)
    ids = []
    for value in (1, 2):
        ids.append(
            (await (await client.post("/prompt", json={"prompt": workflow(value)})).json())["prompt_id"]
        )
    front = await (await client.post("/prompt", json={"prompt": workflow(9), "front": True})).json()
    assert front["number"] < 0
    assert await (await client.get("/prompt")).json() == {"exec_info": {"queue_remaining": 4}}
    queue = await (await client.get("/queue")).json()
    assert set(queue) == {"queue_running", "queue_pending"}
    assert [item[1] for item in queue["queue_running"]] == [blocker]
    assert [item[1] for item in queue["queue_pending"]] == [front["prompt_id"], *ids]
    assert all(len(item) == 5 for item in queue["queue_pending"])
    assert (await client.post("/queue", json={"delete": [ids[0]]})).status == 200
    queue = await (await client.get("/queue")).json()
    assert [item[1] for item in queue["queue_pending"]] == [front["prompt_id"], ids[1]]
    assert (await client.post("/queue", json={"clear": True})).status == 200
    assert (await (await client.get("/queue")).json())["queue_pending"] == []
    assert (await client.post("/interrupt", json={"prompt_id": "someone-else"})).status == 200
    assert (await (await client.get("/queue")).json())["queue_running"]  # wrong id: still running
    assert (await client.post("/interrupt")).status == 200
    entry = await wait_history(client, blocker)
    assert entry["status"]["status_str"] == "error" and entry["status"]["completed"] is False
    assert entry["status"]["messages"][-1][0] == "execution_interrupted"
    assert ids[0] not in await (await client.get("/history")).json()  # deleted pending: no history


async def test_explicit_number_orders(client: TestClient) -> None:
    await _block_queue(client)
    late = await (await client.post("/prompt", json={"prompt": workflow(1), "number": 100})).json()
    early = await (await client.post("/prompt", json={"prompt": workflow(2), "number": 50})).json()
    assert (late["number"], early["number"]) == (100, 50)
    pending = (await (await client.get("/queue")).json())["queue_pending"]
    assert [p[1] for p in pending] == [early["prompt_id"], late["prompt_id"]]
    await client.post("/queue", json={"clear": True})
    await client.post("/interrupt")


async def test_partial_execution_targets(client: TestClient) -> None:
    prompt = workflow(1)
    prompt["4"] = {"class_type": "StubSave", "inputs": {"value": ["1", 0], "filename_prefix": "other"}}
    body = await (
        await client.post("/prompt", json={"prompt": prompt, "partial_execution_targets": ["4"]})
    ).json()
    entry = await wait_history(client, body["prompt_id"])
    assert list(entry["outputs"]) == ["4"] and entry["prompt"][4] == ["4"]


async def test_history_routes(client: TestClient) -> None:
    ids = []
    for value in range(3):
        body = await (await client.post("/prompt", json={"prompt": workflow(value)})).json()
        ids.append(body["prompt_id"])
    for prompt_id in ids:
        await wait_history(client, prompt_id)
    assert list(await (await client.get("/history?max_items=2")).json()) == ids[1:]
    assert list(await (await client.get("/api/history")).json()) == ids
    assert await (await client.get("/history/unknown")).json() == {}
    assert (await client.post("/history", json={"delete": [ids[0]]})).status == 200
    assert list(await (await client.get("/history")).json()) == ids[1:]
    assert (await client.post("/history", json={"clear": True})).status == 200
    assert await (await client.get("/history")).json() == {}
    assert (await client.get("/history?max_items=abc")).status == 400


async def test_failed_run_history(client: TestClient) -> None:
    ws = await client.ws_connect("/ws?clientId=f")
    await receive_json(ws)
    body = await (
        await client.post("/prompt", json={"prompt": workflow(1, fail=True), "client_id": "f"})
    ).json()
    msgs = await wait_done(ws, body["prompt_id"])
    error = next(m for m in msgs if m["type"] == "execution_error")["data"]
    assert error["node_id"] == "2" and error["node_type"] == "StubFail"
    assert "stub failure on 1" in error["exception_message"] and error["exception_type"] == "RuntimeError"
    assert set(error) >= {"prompt_id", "executed", "traceback", "current_inputs", "current_outputs"}
    entry = await wait_history(client, body["prompt_id"])
    assert entry["status"]["status_str"] == "error"
    assert entry["status"]["messages"][-1][0] == "execution_error"
    await ws.close()


async def test_object_info(client: TestClient) -> None:
    info = await (await client.get("/object_info")).json()
    assert {"StubNumber", "StubSlow", "StubSave", "StubFail"} <= set(info)
    one = await (await client.get("/api/object_info/StubSlow")).json()
    assert list(one) == ["StubSlow"]
    assert set(one["StubSlow"]) >= {
        "input",
        "output",
        "output_name",
        "name",
        "display_name",
        "category",
        "output_node",
        "description",
    }
    assert await (await client.get("/object_info/Nope")).json() == {}


async def test_free_and_system_stats(client: TestClient) -> None:
    assert (await client.post("/free", json={"unload_models": True, "free_memory": True})).status == 200
    assert (await client.post("/free")).status == 200
    stats = await (await client.get("/system_stats")).json()
    system = stats["system"]
    assert set(system) >= {
        "os",
        "ram_total",
        "ram_free",
        "python_version",
        "loom_version",
        "embedded_python",
        "pytorch_version",
        "argv",
        "comfyui_version",
    }
    assert system["ram_total"] > 0
    device = stats["devices"][0]
    assert set(device) == {
        "name",
        "type",
        "index",
        "vram_total",
        "vram_free",
        "torch_vram_total",
        "torch_vram_free",
    }
    assert "memory_manager" in stats["loom"]


async def test_models_embeddings_extensions_features(client: TestClient) -> None:
    kinds = await (await client.get("/models")).json()
    assert "checkpoints" in kinds
    assert await (await client.get("/models/checkpoints")).json() == []
    assert (await client.get("/models/nonsense")).status == 404
    assert await (await client.get("/embeddings")).json() == []
    assert await (await client.get("/extensions")).json() == []
    features = await (await client.get("/api/features")).json()
    assert features["max_upload_size"] == 256 * 1024


class FakeManager:
    """A memory manager (``engine.context.ModelManagerLike``) that only records and reports."""

    def __init__(self) -> None:
        self.freed = 0

    def stats(self) -> dict:
        return {
            "loads": [{"key": "unet"}],
            "evictions": [],
            "max_resident": 1,
            "ram_tier_bytes": 0,
            "device": "cpu",
            "resident": [],
            "ram_budget_bytes": 1 << 30,
        }

    def free(self) -> None:
        self.freed += 1

    def use(self, handle: object) -> object:
        raise RuntimeError("not used by stub nodes")

    def hint_upcoming(self, handles: object) -> None:
        return None

    def reset_run_stats(self) -> None:
        return None


async def test_memory_manager_figures_and_progress_log(aiohttp_client, tmp_path, caplog) -> None:  # type: ignore[no-untyped-def]
    import logging

    from engine.server.app import create_app
    from engine.server.common import ServerConfig
    from tests.engine.server.conftest import make_parts

    parts = make_parts(tmp_path)
    manager = FakeManager()
    parts.models = manager
    parts.executor.models = manager  # type: ignore[assignment]
    client = await aiohttp_client(create_app(parts, ServerConfig()))
    stats = await (await client.get("/system_stats")).json()
    assert stats["loom"]["memory_manager"]["max_resident"] == 1
    await client.post("/free", json={"unload_models": True})
    for _ in range(3000):  # bounded (30 s); the worker frees between jobs
        if manager.freed:
            break
        await asyncio.sleep(0.01)
    assert manager.freed == 1
    with caplog.at_level(logging.INFO, logger="loom.server"):
        body = await (await client.post("/prompt", json={"prompt": workflow(77, steps=3)})).json()
        await wait_history(client, body["prompt_id"])
        short = body["prompt_id"][:8]
        for _ in range(1000):  # the history has the job a moment before the log line is written
            lines = [r.getMessage() for r in caplog.records if r.name == "loom.server"]
            if any(f"job {short} succeeded" in line for line in lines):
                break
            await asyncio.sleep(0.01)
    assert any(f"job {short} node 2 (StubSlow) [" in line and "3/3" in line for line in lines), lines
    assert any(f"job {short} succeeded" in line and "max resident 1" in line for line in lines), lines
