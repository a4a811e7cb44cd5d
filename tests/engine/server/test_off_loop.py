"""Nothing a handler does blocks the event loop: model folder walks (a linked library of thousands of
folders takes seconds), model descriptions, the workflow check of a large file, base64 job images
and job-database reads all run on worker threads, and other clients are answered meanwhile.

Each test holds the blocking call on an Event (the call records whether it ran on the event loop;
there it does not wait, so a route that blocks the loop fails at once instead of hanging), has other
requests answered while it is held, then releases it. No clock is read; a failsafe only stops a hang.
Identical model listings that arrive while one is walked share that walk."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import os
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from engine import folder_scan
from engine.context import KeptImages
from engine.executor import RunResult
from engine.folders import ModelFolders
from engine.jobs.records import JobRecord
from engine.jobs.spec import JobSpec
from engine.server import routes_jobs
from engine.server.app import ServerParts, create_app
from engine.server.common import ServerConfig
from engine.server.security import ERRORS
from nodes.load.checkpoint_loaders import NODES as LOADER_NODES
from nodes.load.checkpoint_loaders import register_model_options
from tests.engine.server.conftest import make_parts

FAILSAFE_S = 30.0
OTHERS = ("/system_stats", "/features", "/api/v1/workflows/ui-rules")  # none of them waits for the held call


class HeldCall:
    """Wraps ``real``: called on the event loop it only records that (and runs at once); called on
    another thread it waits for ``release`` first, and counts the calls per first argument."""

    def __init__(self, real: Callable[..., Any]) -> None:
        self.real = real
        self.entered = threading.Event()
        self.release = threading.Event()
        self.on_loop = False
        self.expired = False
        self.calls: dict[str, int] = {}
        self._lock = threading.Lock()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            key = str(args[0]) if args else ""
            self.calls[key] = self.calls.get(key, 0) + 1
        try:
            asyncio.get_running_loop()
            self.on_loop = True
        except RuntimeError:  # a worker thread: hold it
            self.entered.set()
            if not self.release.wait(FAILSAFE_S):
                self.expired = True
        return self.real(*args, **kwargs)


async def held_while_others_answer(client: TestClient, held: HeldCall, path: str) -> Any:
    """GET ``path``; while its blocking call is held, the other routes answer; then it is released.
    Returns the held request's response."""
    request = asyncio.create_task(client.get(path))
    deadline = asyncio.get_running_loop().time() + FAILSAFE_S
    while not held.entered.is_set():
        assert not held.on_loop, f"{path}: the blocking call ran on the event loop"
        if request.done():
            raise AssertionError(f"{path} answered without the held call: {await request.result().text()}")
        assert asyncio.get_running_loop().time() < deadline, f"{path} never reached the held call"
        await asyncio.sleep(0.005)
    try:
        for other in OTHERS:  # answered while the held call is still inside
            resp = await asyncio.wait_for(client.get(other), FAILSAFE_S)
            assert resp.status == 200, (other, await resp.text())
        assert not request.done()
    finally:
        held.release.set()
    resp = await asyncio.wait_for(request, FAILSAFE_S)
    assert not held.on_loop and not held.expired
    return resp


def library(root: Path) -> Path:
    """models/ with two checkpoints (one through a linked folder) and an embedding, folders aged so
    their listings can be reused."""
    models = root / "models"
    store = root / "store" / "sd"
    store.mkdir(parents=True)
    (store / "b.safetensors").write_bytes(b"x")
    (models / "checkpoints").mkdir(parents=True)
    (models / "checkpoints" / "a.safetensors").write_bytes(b"x")
    (models / "checkpoints" / "linked").symlink_to(store, target_is_directory=True)
    (models / "embeddings").mkdir()
    (models / "embeddings" / "style.pt").write_bytes(b"x")
    for folder in (models / "checkpoints", models / "embeddings", store):
        os.utime(folder, ns=(10**18, 10**18))
    return models


@pytest.fixture
def model_parts(tmp_path: Path) -> ServerParts:
    parts = make_parts(tmp_path)
    model_files = ModelFolders(library(tmp_path))
    parts.folders = dataclasses.replace(parts.folders, model_files=model_files)
    parts.registry.register_all(LOADER_NODES, origin="core")
    register_model_options(parts.registry, model_files)
    return parts


@pytest.fixture
async def model_client(aiohttp_client: Any, model_parts: ServerParts) -> AsyncIterator[TestClient]:
    app = create_app(model_parts, ServerConfig())
    client: TestClient = await aiohttp_client(app)
    yield client
    assert app[ERRORS].count == 0, "the server turned an exception into a 500"


@pytest.fixture
def held_scan(monkeypatch: pytest.MonkeyPatch) -> HeldCall:
    held = HeldCall(folder_scan.scan)
    monkeypatch.setattr(folder_scan, "scan", held)
    return held


CHECKPOINTS = ["a.safetensors", "linked/b.safetensors"]


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/models/checkpoints", CHECKPOINTS),
        ("/api/models/checkpoints", CHECKPOINTS),
        ("/embeddings", ["style"]),
        ("/api/v1/models/checkpoints/a.safetensors", "a.safetensors"),
        ("/api/v1/models/checkpoints/info", CHECKPOINTS),
        ("/object_info", CHECKPOINTS),
    ],
)
async def test_model_folders_are_walked_off_the_loop(
    held_scan: HeldCall, model_client: TestClient, path: str, expected: Any
) -> None:
    resp = await held_while_others_answer(model_client, held_scan, path)
    assert resp.status == 200, await resp.text()
    body = await resp.json()
    if path.endswith("/info"):
        body = sorted(f["name"] for f in body["files"])
    elif path == "/object_info":
        body = body["CheckpointLoaderSimple"]["input"]["required"]["ckpt_name"][0]
    elif isinstance(expected, str):
        body = body["name"]
    assert body == expected


async def test_identical_listings_during_a_walk_share_it(
    held_scan: HeldCall, model_client: TestClient
) -> None:
    first = asyncio.create_task(model_client.get("/models/checkpoints"))
    while not held_scan.entered.is_set():
        assert not held_scan.on_loop, "the listing walked the model folder on the event loop"
        assert not first.done()
        await asyncio.sleep(0.005)
    others = [asyncio.create_task(model_client.get("/models/checkpoints")) for _ in range(3)]
    ping = await asyncio.wait_for(model_client.get("/system_stats"), FAILSAFE_S)
    assert ping.status == 200
    held_scan.release.set()
    bodies = [await (await asyncio.wait_for(t, FAILSAFE_S)).json() for t in (first, *others)]
    assert bodies == [CHECKPOINTS] * 4
    walks = {k: v for k, v in held_scan.calls.items() if k.endswith(os.sep + "checkpoints")}
    assert list(walks.values()) == [1], held_scan.calls  # one walk for the four requests


async def test_the_workflow_check_runs_off_the_loop(
    monkeypatch: pytest.MonkeyPatch, parts: ServerParts, client: TestClient
) -> None:
    held = HeldCall(routes_jobs.check_workflow)
    monkeypatch.setattr(routes_jobs, "check_workflow", held)
    nodes = {str(i): {"class_type": "StubNumber", "inputs": {"value": i}} for i in range(1, 2000)}
    request = asyncio.create_task(client.post("/api/v1/workflows/check", json=nodes))
    while not held.entered.is_set():
        assert not held.on_loop, "the workflow check ran on the event loop"
        assert not request.done(), await request.result().text()
        await asyncio.sleep(0.005)
    for other in OTHERS:
        assert (await asyncio.wait_for(client.get(other), FAILSAFE_S)).status == 200
    held.release.set()
    resp = await asyncio.wait_for(request, FAILSAFE_S)
    assert resp.status == 200, await resp.text()
    assert not held.on_loop


def finished_job_with_kept_image(parts: ServerParts, prompt_id: str = "kept") -> bytes:
    """A finished job whose output image is kept in memory (as ``"return": "base64"`` leaves it)."""
    entry = {"filename": "kept_00001_.png", "subfolder": "", "type": "output"}
    spec = JobSpec({"1": {"class_type": "StubNumber", "inputs": {"value": 1}}}, prompt_id, returns="base64")
    result = RunResult(prompt_id, "success", outputs={"1": {"images": [entry]}})
    queue = parts.queue
    queue.store.finish(JobRecord.from_result(spec, result, [], 1.0))  # type: ignore[attr-defined]
    data = b"\x89PNG not really" * 1000
    queue.kept.put(prompt_id, {KeptImages.key(entry): data})  # type: ignore[attr-defined]
    return data


async def test_base64_images_are_encoded_off_the_loop(
    monkeypatch: pytest.MonkeyPatch, parts: ServerParts, client: TestClient
) -> None:
    data = finished_job_with_kept_image(parts)
    held = HeldCall(routes_jobs.base64.b64encode)
    monkeypatch.setattr(routes_jobs, "base64", SimpleNamespace(b64encode=held))
    resp = await held_while_others_answer(client, held, "/api/v1/jobs/kept?images=base64")
    assert resp.status == 200, await resp.text()
    assert base64.b64decode((await resp.json())["outputs"][0]["data"]) == data


@pytest.mark.parametrize(
    ("path", "method"),
    [
        ("/history/kept", "get"),
        ("/api/v1/jobs/kept", "get"),
        ("/api/v1/jobs/kept/images/0", "get"),
        ("/api/v1/jobs", "history"),
        ("/history", "history"),
        ("/queue", "pending"),
        ("/prompt", "remaining"),
    ],
)
async def test_job_database_reads_run_off_the_loop(
    parts: ServerParts, client: TestClient, path: str, method: str
) -> None:
    finished_job_with_kept_image(parts)
    held = HeldCall(getattr(parts.queue, method))
    setattr(parts.queue, method, held)  # the routes look the method up on each request
    resp = await held_while_others_answer(client, held, path)
    assert resp.status == 200, await resp.text()


async def test_a_websocket_connection_reads_the_queue_off_the_loop(
    parts: ServerParts, client: TestClient
) -> None:
    held = HeldCall(parts.queue.remaining)
    parts.queue.remaining = held  # type: ignore[method-assign]
    connecting = asyncio.create_task(client.ws_connect("/ws?clientId=held"))
    while not held.entered.is_set():
        assert not held.on_loop, "the websocket's first status read the queue on the event loop"
        await asyncio.sleep(0.005)
    for other in OTHERS:
        assert (await asyncio.wait_for(client.get(other), FAILSAFE_S)).status == 200
    held.release.set()
    ws = await asyncio.wait_for(connecting, FAILSAFE_S)
    first = await ws.receive_json(timeout=FAILSAFE_S)
    assert first["type"] == "status" and first["data"]["sid"] == "held"
    await ws.close()
    assert not held.on_loop
