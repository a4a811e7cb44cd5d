"""Restart: queue jobs, stop the server mid-run, start a new one on the same SQLite file: history
intact, queued jobs run, the interrupted one is marked failed ("interrupted by restart")."""

from __future__ import annotations

from pathlib import Path

from aiohttp.test_utils import TestClient, TestServer

from engine.jobs.queue import LocalJobQueue
from engine.jobs.records import JobRecord
from engine.jobs.spec import JobSpec
from engine.jobs.store import JobStore
from engine.server.app import create_app
from engine.server.common import ServerConfig
from nodes.bench.stubs.server_nodes import workflow
from tests.engine.server.conftest import block_queue, make_parts, wait_history


async def test_restart_keeps_queue_and_history(tmp_path: Path) -> None:
    db = tmp_path / "user" / "loom.sqlite"
    first = create_app(make_parts(tmp_path / "a", db=db), ServerConfig())
    async with TestClient(TestServer(first)) as client:
        done = (await (await client.post("/prompt", json={"prompt": workflow(1)})).json())["prompt_id"]
        await wait_history(client, done)
        slow = await block_queue(client, 2)  # running when the app stops
        queued = [
            (await (await client.post("/prompt", json={"prompt": workflow(v)})).json())["prompt_id"]
            for v in (3, 4)
        ]
    # the app is stopped: its worker was interrupted mid-run
    second = create_app(make_parts(tmp_path / "b", db=db), ServerConfig())
    async with TestClient(TestServer(second)) as client:
        for prompt_id in queued:
            entry = await wait_history(client, prompt_id)
            assert entry["status"]["status_str"] == "success"
        history = await (await client.get("/history")).json()
        assert done in history and history[done]["status"]["completed"] is True
        interrupted = history[slow]
        assert interrupted["status"]["status_str"] == "error" and interrupted["status"]["completed"] is False
        assert "interrupted by restart" in str(interrupted["status"]["messages"])
        job = await (await client.get(f"/api/v1/jobs/{slow}")).json()
        assert job["status"] == "failed" and job["errors"][0]["message"] == "interrupted by restart"
        numbers = [history[p]["prompt"][0] for p in queued]
        fresh = await (await client.post("/prompt", json={"prompt": workflow(9)})).json()
        assert fresh["number"] > max(numbers)  # the counter survived too


def test_store_history_bound_and_drain(tmp_path: Path) -> None:
    parts = make_parts(tmp_path, history_size=3)
    queue = parts.queue
    ids = [queue.submit(JobSpec(workflow(v), outputs=["3"])).prompt_id for v in range(5)]
    records = queue.drain()  # the CLI's way: no worker thread
    assert [r.status for r in records] == ["succeeded"] * 5
    assert [r.spec.prompt_id for r in queue.history()] == ids[-3:]
    assert queue.get(ids[0]) is None and queue.get(ids[-1]).status == "succeeded"  # type: ignore[union-attr]


def test_store_roundtrip(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "s.sqlite")
    spec = JobSpec({"1": {"class_type": "X", "inputs": {}}}, extra_data={"client_id": "c"}, client_id="c")
    store.add_pending(spec)
    assert store.jobs("pending")[0] == spec
    popped = store.pop_next()
    assert popped == spec and store.jobs("running") == [spec]
    store.close()
    reopened = JobStore(tmp_path / "s.sqlite")
    (record,) = reopened.recover()
    assert record.status == "failed" and reopened.jobs("running") == []
    assert JobRecord.from_json(record.to_json()) == record
    assert reopened.record(spec.prompt_id) == record


def test_front_and_cancel_without_worker(tmp_path: Path) -> None:
    queue: LocalJobQueue = make_parts(tmp_path).queue
    a = queue.submit(JobSpec(workflow(1), outputs=["3"]))
    b = queue.submit(JobSpec(workflow(2), outputs=["3"]), front=True)
    c = queue.submit(JobSpec(workflow(3), outputs=["3"]))
    assert [s.prompt_id for s in queue.pending()] == [b.prompt_id, a.prompt_id, c.prompt_id]
    assert queue.cancel(a.prompt_id) is True and queue.cancel("nope") is False
    assert queue.get(a.prompt_id).status == "cancelled"  # type: ignore[union-attr]
    assert [r.spec.prompt_id for r in queue.drain()] == [b.prompt_id, c.prompt_id]
    assert [r.spec.prompt_id for r in queue.history()] == [b.prompt_id, c.prompt_id]  # cancelled: not listed
