"""The server outlives hostile plugins, a dying worker and a failing job database (issue 19, items 1-3).

Plugin cases use the packs in ``tests/engine/plugins/hostile/``; storage cases put a stand-in in front of
the store's SQLite connection that fails every write with SQLite's own "database or disk is full"
error while the "disk" is full (and one case fills a real database with ``max_page_count``)."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from engine.jobs.queue import LocalJobQueue
from engine.jobs.spec import JobSpec
from engine.jobs.store import JobStore, StorageError
from engine.jobs.worker_thread import WORKER_DIED_MESSAGE
from engine.server.app import ServerParts, create_app
from engine.server.common import ServerConfig
from engine.server.security import ERRORS
from nodes.bench.stubs.server_nodes import workflow
from nodes.compat.shim import load_plugins_with_shim
from tests.engine.server.conftest import blocker as blocker_workflow
from tests.engine.server.conftest import make_parts, wait_history

HOSTILE = Path(__file__).resolve().parents[1] / "plugins" / "hostile"
FINAL = ("succeeded", "failed", "cancelled")


def hostile_parts(root: Path) -> ServerParts:
    parts = make_parts(root)
    pack_dir = root / "packs"
    pack_dir.mkdir()
    (pack_dir / "exit_nodes").symlink_to(HOSTILE / "exit_nodes", target_is_directory=True)
    parts.plugins = load_plugins_with_shim(parts.registry, [pack_dir], parts.folders)
    return parts


async def hostile_client(aiohttp_client: Any, root: Path) -> tuple[TestClient, web.Application]:
    app = create_app(hostile_parts(root), ServerConfig())
    return await aiohttp_client(app), app


async def post_prompt(client: TestClient, prompt: dict[str, Any]) -> str:
    resp = await client.post("/prompt", json={"prompt": prompt})
    assert resp.status == 200, await resp.text()
    return str((await resp.json())["prompt_id"])


async def job_status(
    client: TestClient, job_id: str, wanted: tuple[str, ...], timeout: float = 20.0
) -> dict[str, Any]:
    """Poll the job resource until its status is one of ``wanted`` (a 404 fails at once)."""
    for _ in range(int(timeout / 0.02)):
        resp = await client.get(f"/api/v1/jobs/{job_id}")
        assert resp.status == 200, f"job {job_id} vanished: {resp.status} {await resp.text()}"
        job = await resp.json()
        if job["status"] in wanted:
            return dict(job)
        await asyncio.sleep(0.02)
    raise AssertionError(f"job {job_id} never reached {wanted}")


async def worker_stats(client: TestClient) -> dict[str, Any]:
    return dict((await (await client.get("/system_stats")).json())["loom"]["job_worker"])


# --- item 1: BaseException from plugin code ------------------------------------------------------------
@pytest.mark.parametrize(
    ("class_type", "what"),
    [("Hostile_ExitInFunction", "sys.exit(3)"), ("Hostile_KeyboardInFunction", "KeyboardInterrupt")],
)
async def test_exit_in_a_plugin_node_fails_only_that_job(
    aiohttp_client: Any, tmp_path: Path, class_type: str, what: str
) -> None:
    client, app = await hostile_client(aiohttp_client, tmp_path)
    poison = await post_prompt(client, {"1": {"class_type": class_type, "inputs": {"value": 1}}})
    entry = await wait_history(client, poison)
    assert entry["status"]["status_str"] == "error"
    error = next(m[1] for m in entry["status"]["messages"] if m[0] == "execution_error")
    assert what in error["exception_message"] and "'exit_nodes'" in error["exception_message"]
    healthy = await post_prompt(client, workflow(7))
    assert (await wait_history(client, healthy))["status"]["status_str"] == "success"
    stats = await worker_stats(client)
    assert stats["alive"] and stats["restarts"] == 0  # contained: the worker never died
    assert app[ERRORS].count == 0


async def test_exit_in_validate_inputs_is_a_400_and_the_server_lives(
    aiohttp_client: Any, tmp_path: Path
) -> None:
    client, app = await hostile_client(aiohttp_client, tmp_path)
    resp = await client.post(
        "/prompt", json={"prompt": {"1": {"class_type": "Hostile_ExitInValidate", "inputs": {"value": 1}}}}
    )
    assert resp.status == 400
    assert "sys.exit(0)" in await resp.text()
    assert (await client.get("/queue")).status == 200
    healthy = await post_prompt(client, workflow(8))
    assert (await wait_history(client, healthy))["status"]["status_str"] == "success"
    assert app[ERRORS].count == 0


async def test_a_plugin_route_calling_exit_answers_500_naming_the_pack(
    aiohttp_client: Any, tmp_path: Path
) -> None:
    client, app = await hostile_client(aiohttp_client, tmp_path)
    resp = await client.get("/exit_nodes/exit")
    assert resp.status == 500
    body = await resp.json()
    assert body["error"]["type"] == "plugin_route_failed" and "exit_nodes" in body["error"]["message"]
    assert (await client.get("/queue")).status == 200


async def test_a_dead_worker_is_restarted_its_job_failed_and_stats_say_so(
    client: TestClient, parts: ServerParts, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue = parts.queue
    assert isinstance(queue, LocalJobQueue)
    run_scheduled = queue._run_scheduled

    def dies_on_poison(spec: JobSpec, *, wait: bool = True) -> Any:
        if spec.prompt["1"]["inputs"]["value"] == 666:
            raise SystemExit("a bug that escaped every guard")
        return run_scheduled(spec, wait=wait)

    monkeypatch.setattr(queue, "_run_scheduled", dies_on_poison)
    poison = await post_prompt(client, workflow(666))
    entry = await wait_history(client, poison)
    error = next(m[1] for m in entry["status"]["messages"] if m[0] == "execution_error")
    assert WORKER_DIED_MESSAGE in error["exception_message"]
    healthy = await post_prompt(client, workflow(5))
    assert (await wait_history(client, healthy))["status"]["status_str"] == "success"
    stats = await worker_stats(client)
    assert stats["alive"] and stats["restarts"] == 1 and "SystemExit" in stats["last_death"]


async def test_a_node_that_ignores_interrupts_is_reported_as_unstoppable(
    aiohttp_client: Any, tmp_path: Path
) -> None:
    client, app = await hostile_client(aiohttp_client, tmp_path)
    stubborn = {"class_type": "Hostile_Stubborn", "inputs": {"value": 1}}
    resp = await client.post("/api/v1/jobs", json={"workflow": {"1": stubborn, "2": stubborn}})
    job_id = (await resp.json())["id"]
    for _ in range(1000):  # until node 1 itself runs (a job is "running" a moment before its first node)
        job = await job_status(client, job_id, ("running",))
        if (job["progress"] or {}).get("node") == "1":
            break
        await asyncio.sleep(0.01)
    cancel = await client.delete(f"/api/v1/jobs/{job_id}")
    assert cancel.status == 202 and (await cancel.json())["interrupt"]["requested"] is True
    for _ in range(500):  # bounded: the report comes once the node ignored the request for 2 s
        job = await job_status(client, job_id, ("running",))
        if job["interrupt"] and not job["interrupt"]["stoppable"]:
            break
        await asyncio.sleep(0.02)
    else:
        raise AssertionError("the API never said the running node cannot be stopped")
    assert "cannot be stopped" in job["interrupt"]["message"]
    (tmp_path / "input" / "release").write_text("")  # the node finishes by itself; node 2 never starts
    final = await job_status(client, job_id, FINAL)
    assert final["status"] == "cancelled" and final["executed"] == ["1"]
    assert app[ERRORS].count == 0


# --- item 2: storage failures -------------------------------------------------------------------------
class FullDisk:
    """Stands in front of a SQLite connection: while ``full``, every write fails as SQLite fails
    on a full disk; reads work."""

    WRITES = ("INSERT", "UPDATE", "DELETE", "REPLACE")

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db
        self.full = True

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
        if self.full and sql.lstrip().upper().startswith(self.WRITES):
            raise sqlite3.OperationalError("database or disk is full")
        return self.db.execute(sql, *args)

    def executemany(self, sql: str, *args: Any) -> sqlite3.Cursor:
        if self.full:
            raise sqlite3.OperationalError("database or disk is full")
        return self.db.executemany(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.db, name)


async def test_a_full_job_database_is_507_keeps_the_running_job_and_recovers(
    client: TestClient, parts: ServerParts
) -> None:
    queue = parts.queue
    assert isinstance(queue, LocalJobQueue)
    blocker = await post_prompt(client, blocker_workflow(1))
    await job_status(client, blocker, ("running",))
    disk = FullDisk(queue.store._db)
    queue.store._db = disk  # type: ignore[assignment]

    refused = await client.post("/prompt", json={"prompt": workflow(2)})
    assert refused.status == 507
    assert (await refused.json())["error"]["type"] == "storage_unavailable"
    refused_job = await client.post("/api/v1/jobs", json={"workflow": workflow(2)})
    assert refused_job.status == 507

    assert (await client.post("/interrupt", json={})).status == 200
    job = await job_status(client, blocker, FINAL)  # finished while the disk is full: still visible
    assert job["status"] == "cancelled"
    stats = await worker_stats(client)
    assert stats["alive"] and stats["storage_error"] and "disk is full" in stats["storage_error"]

    disk.full = False  # space returns
    for _ in range(500):
        stats = await worker_stats(client)
        if stats["unsaved_records"] == 0 and stats["storage_error"] is None:
            break
        await asyncio.sleep(0.02)
    else:
        raise AssertionError(f"the queue never wrote its records once space returned: {stats}")
    record = queue.store.record(blocker)
    assert record is not None and record.status == "cancelled"
    after = await post_prompt(client, workflow(3))
    assert (await job_status(client, after, FINAL))["status"] == "succeeded"


def test_a_real_full_database_raises_storage_error_and_recovers(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "loom.sqlite")
    pages = store._db.execute("PRAGMA page_count").fetchone()[0]
    store._db.execute(f"PRAGMA max_page_count={pages}")
    big = JobSpec(
        {"1": {"class_type": "StubNumber", "inputs": {"value": 1}, "_meta": {"title": "x" * 50_000}}}
    )
    with pytest.raises(StorageError, match="disk is full"):
        store.enqueue(big)
    store._db.execute("PRAGMA max_page_count=1073741823")
    store.enqueue(big)
    assert store.count() == 1


def test_a_damaged_database_file_is_moved_aside_and_a_fresh_one_started(tmp_path: Path) -> None:
    path = tmp_path / "loom.sqlite"
    path.write_bytes(b"this is not a database at all, " * 100)
    store = JobStore(path)
    assert store.moved_aside is not None and store.moved_aside.read_bytes().startswith(b"this is not")
    store.enqueue(JobSpec({"1": {"class_type": "StubNumber", "inputs": {"value": 1}}}))
    assert store.count() == 1


async def test_damaged_history_rows_are_skipped(client: TestClient, parts: ServerParts) -> None:
    done = await post_prompt(client, workflow(4))
    await wait_history(client, done)
    store = parts.queue.store  # type: ignore[attr-defined]
    store._db.execute("INSERT INTO history (prompt_id, ran, record) VALUES ('broken', 1, '{not json')")
    store._db.execute("INSERT INTO history (prompt_id, ran, record) VALUES ('partial', 1, '{\"spec\": 3}')")
    resp = await client.get("/history")
    assert resp.status == 200
    assert set(await resp.json()) == {done}
    assert (await client.get("/api/v1/jobs")).status == 200
    assert (await client.get("/history/broken")).status == 200


# --- item 3: /queue delete and clear ------------------------------------------------------------------
async def test_queue_delete_and_clear_cancel_jobs_like_the_jobs_api(
    client: TestClient, aiohttp_server: Any
) -> None:
    hooks: list[dict[str, Any]] = []
    both = asyncio.Event()

    async def hook(request: web.Request) -> web.Response:
        hooks.append(await request.json())
        if len(hooks) == 2:
            both.set()
        return web.Response(text="ok")

    receiver = web.Application()
    receiver.router.add_post("/hook", hook)
    url = f"http://127.0.0.1:{(await aiohttp_server(receiver, host='127.0.0.1')).port}/hook"
    blocker = await post_prompt(client, blocker_workflow(1))
    await job_status(client, blocker, ("running",))
    deleted = (
        await (await client.post("/api/v1/jobs", json={"workflow": workflow(2), "webhook": url})).json()
    )["id"]
    cleared = (
        await (await client.post("/api/v1/jobs", json={"workflow": workflow(3), "webhook": url})).json()
    )["id"]
    stream = await client.get(f"/api/v1/jobs/{deleted}/events")

    assert (await client.post("/queue", json={"delete": [deleted]})).status == 200
    text = (await asyncio.wait_for(stream.read(), 10)).decode()  # the stream ends with a final event
    assert text.count("event: job") == 2 and '"status": "cancelled"' in text.split("event: job")[-1]
    assert (await client.post("/queue", json={"clear": True})).status == 200
    for job_id in (deleted, cleared):
        assert (await job_status(client, job_id, FINAL))["status"] == "cancelled"
    await asyncio.wait_for(both.wait(), 10)
    assert {h["id"]: h["status"] for h in hooks} == {deleted: "cancelled", cleared: "cancelled"}
    queue = await (await client.get("/queue")).json()
    assert queue["queue_pending"] == []
    history = await (await client.get("/history")).json()
    assert deleted not in history and cleared not in history  # ComfyUI's /history lists jobs that ran
    await client.post("/interrupt", json={})
    await job_status(client, blocker, FINAL)
