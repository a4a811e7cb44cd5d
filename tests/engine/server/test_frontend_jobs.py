"""ComfyUI's jobs API, as today's official frontend polls it (its queue, history and Assets panels):

GET  /api/jobs?status=a,b&workflow_id=&sort_by=created_at|execution_duration&sort_order=asc|desc&limit=&offset=
  200 {"jobs": [{id, status, priority, create_time, execution_start_time?, execution_end_time?,
       execution_error?, outputs_count, preview_output?{filename, subfolder, type, nodeId, mediaType},
       workflow_id?}], "pagination": {offset, limit, total, has_more}}
  statuses: pending, in_progress, completed, failed, cancelled; a bad parameter is a 400 saying so
GET  /api/jobs/{id}   one job with outputs, execution_status and workflow; 404 when unknown
POST /api/jobs/{id}/cancel; POST /api/jobs/cancel {"job_ids": [...]}
"""

from __future__ import annotations

from typing import Any

from aiohttp.test_utils import TestClient

from nodes.bench.stubs.server_nodes import workflow
from tests.engine.server.conftest import block_queue, wait_history


async def run_job(client: TestClient, value: int = 1, **extra: Any) -> str:
    resp = await client.post("/prompt", json={"prompt": workflow(value, **extra)})
    assert resp.status == 200, await resp.text()
    prompt_id = str((await resp.json())["prompt_id"])
    await wait_history(client, prompt_id)
    return prompt_id


async def jobs(client: TestClient, query: str = "") -> dict[str, Any]:
    resp = await client.get("/api/jobs" + query)
    assert resp.status == 200, await resp.text()
    return dict(await resp.json())


async def test_a_finished_job_is_listed_with_comfyuis_fields(client: TestClient) -> None:
    workflow_json = {"id": "wf-1", "nodes": [], "links": []}
    resp = await client.post(
        "/prompt",
        json={"prompt": workflow(2), "extra_data": {"extra_pnginfo": {"workflow": workflow_json}}},
    )
    prompt_id = (await resp.json())["prompt_id"]
    await wait_history(client, prompt_id)
    body = await jobs(client, "?status=completed,failed,cancelled&limit=64&offset=0")
    assert body["pagination"] == {"offset": 0, "limit": 64, "total": 1, "has_more": False}
    (job,) = body["jobs"]
    assert job["id"] == prompt_id and job["status"] == "completed"
    assert job["workflow_id"] == "wf-1" and job["outputs_count"] == 1
    assert isinstance(job["create_time"], int) and job["create_time"] > 10**12  # milliseconds
    assert job["execution_start_time"] <= job["execution_end_time"]
    preview = job["preview_output"]
    assert preview["nodeId"] == "3" and preview["mediaType"] == "images" and preview["type"] == "output"
    assert "outputs" not in job  # the list is a summary; the job route has the detail


async def test_a_failed_job_has_its_error(client: TestClient) -> None:
    prompt_id = await run_job(client, fail=True)
    (job,) = (await jobs(client, "?status=failed"))["jobs"]
    assert job["id"] == prompt_id and job["status"] == "failed"
    assert job["execution_error"]["prompt_id"] == prompt_id
    assert (await jobs(client, "?status=completed"))["jobs"] == []


async def test_running_pending_and_cancelled_jobs(client: TestClient) -> None:
    running = await block_queue(client)
    resp = await client.post("/prompt", json={"prompt": workflow(7)})
    pending = (await resp.json())["prompt_id"]
    body = await jobs(client, "?status=in_progress,pending&limit=200&offset=0")
    assert {(j["id"], j["status"]) for j in body["jobs"]} == {(running, "in_progress"), (pending, "pending")}
    assert all(j["outputs_count"] == 0 and "priority" in j for j in body["jobs"])

    resp = await client.post(f"/api/jobs/{pending}/cancel")
    assert resp.status == 200 and (await resp.json())["cancelled"] is True
    (cancelled,) = (await jobs(client, "?status=cancelled"))["jobs"]
    assert cancelled["id"] == pending and cancelled["status"] == "cancelled"

    resp = await client.post("/api/jobs/cancel", json={"job_ids": [running, "no-such-job"]})
    assert await resp.json() == {"cancelled": [running], "not_cancelled": ["no-such-job"]}
    await wait_history(client, running)
    one = await (await client.get(f"/api/jobs/{running}")).json()
    assert one["status"] == "cancelled"


async def test_one_job_has_outputs_status_and_workflow(client: TestClient) -> None:
    prompt_id = await run_job(client, 3)
    resp = await client.get(f"/api/jobs/{prompt_id}")
    assert resp.status == 200
    job = await resp.json()
    assert job["id"] == prompt_id and job["status"] == "completed"
    assert job["outputs"]["3"]["images"][0]["type"] == "output"
    assert job["execution_status"]["status_str"] == "success"
    assert job["workflow"]["prompt"] == workflow(3)
    also = await client.get(f"/jobs/{prompt_id}")  # ComfyUI answers without /api too
    assert also.status == 200


async def test_unknown_job_is_404_and_finished_job_is_not_cancelled(client: TestClient) -> None:
    resp = await client.get("/api/jobs/nope")
    assert resp.status == 404 and "Job not found" in (await resp.json())["error"]["message"]
    assert (await client.post("/api/jobs/nope/cancel")).status == 404
    prompt_id = await run_job(client)
    body = await (await client.post(f"/api/jobs/{prompt_id}/cancel")).json()
    assert body["cancelled"] is False and body["status"] == "completed"


async def test_paging_and_sorting(client: TestClient) -> None:
    ids = [await run_job(client, value) for value in range(3)]
    newest_first = [j["id"] for j in (await jobs(client))["jobs"]]
    assert newest_first == ids[::-1]
    oldest_first = [j["id"] for j in (await jobs(client, "?sort_order=asc"))["jobs"]]
    assert oldest_first == ids
    page = await jobs(client, "?sort_order=asc&limit=1&offset=1")
    assert [j["id"] for j in page["jobs"]] == [ids[1]]
    assert page["pagination"] == {"offset": 1, "limit": 1, "total": 3, "has_more": True}
    last = await jobs(client, "?sort_order=asc&limit=5&offset=2")
    assert last["pagination"]["has_more"] is False and len(last["jobs"]) == 1
    by_duration = await jobs(client, "?sort_by=execution_duration")
    assert len(by_duration["jobs"]) == 3
    assert (await jobs(client, "?workflow_id=none-such"))["jobs"] == []


async def test_bad_parameters_are_clear_400s(client: TestClient) -> None:
    for query, words in [
        ("?status=done", "Invalid status"),
        ("?sort_by=name", "sort_by"),
        ("?sort_order=up", "sort_order"),
        ("?limit=0", "limit"),
        ("?limit=ten", "limit"),
        ("?offset=-1", "offset"),
    ]:
        resp = await client.get("/api/jobs" + query)
        assert resp.status == 400, query
        assert words in (await resp.json())["error"]["message"], query
    resp = await client.post("/api/jobs/cancel", json={"job_ids": "abc"})
    assert resp.status == 400 and "job_ids" in (await resp.json())["error"]["message"]


async def test_the_jobs_routes_are_in_the_openapi_document(client: TestClient) -> None:
    doc = await (await client.get("/api/v1/openapi.json")).json()
    assert {"/jobs", "/jobs/{job_id}", "/jobs/{job_id}/cancel", "/jobs/cancel"} <= set(doc["paths"])
    assert "/internal/logs/subscribe" in doc["paths"] and "/experiment/models" in doc["paths"]
