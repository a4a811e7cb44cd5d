"""``serve --isolate-jobs``: jobs run in a worker process the server starts and restarts
(``engine/jobs/worker_process.py``), so ``/interrupt`` ends a node that never checks for it and a
plugin that ends its process (``os._exit``, a segfault) fails only its own job.

The server here is the stub one (``nodes.bench.stubs.server_nodes.make_isolated_parts``) with a
ComfyUI-style pack written into a temporary custom-nodes folder; its worker process builds the same
registry, pack included, through ``nodes.bench.stubs.server_nodes:build_runtime``. The end-to-end
case at the bottom starts ``python main.py serve --isolate-jobs`` itself. Timeouts are only safety
nets: nothing here waits for a clock to decide."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientWebSocketResponse
from aiohttp.test_utils import TestClient, TestServer

from engine.server.app import ServerParts, create_app
from engine.server.common import ServerConfig
from engine.server.security import ERRORS
from nodes.bench.stubs.server_nodes import make_isolated_parts, make_parts, workflow
from tests.engine.server.conftest import receive_json, wait_history

pytestmark = pytest.mark.slow  # each server starts (and restarts) a worker process

ROOT = Path(__file__).resolve().parents[3]
SAFETY_S = 120.0  # a worker process imports the engine and the pack before its first job

CRASH_PACK = '''
"""Nodes that end their process or never return, as a buggy plugin might."""
import os
import signal
import time

from server import PromptServer


class _Node:
    CATEGORY = "crash"
    OUTPUT_NODE = True
    FUNCTION = "run"
    RETURN_TYPES = ("INT",)

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"value": ("INT", {"default": 0})}}


class Forever(_Node):
    def run(self, value):
        while True:  # never looks at the interrupt flag
            time.sleep(0.01)


class Exit3(_Node):
    def run(self, value):
        os._exit(3)


class Segfault(_Node):
    def run(self, value):
        os.kill(os.getpid(), signal.SIGSEGV)
        time.sleep(600)  # the signal may land a moment later: never return meanwhile


class Hello(_Node):
    def run(self, value):
        PromptServer.instance.send_sync("crash.hello", {"value": value})
        return {"ui": {"text": [f"hello {value}"]}, "result": (value,)}


NODE_CLASS_MAPPINGS = {"Crash_Forever": Forever, "Crash_Exit3": Exit3, "Crash_Segfault": Segfault, "Crash_Hello": Hello}
'''


def write_pack(root: Path) -> Path:
    packs = root / "custom_nodes"
    (packs / "crashy").mkdir(parents=True)
    (packs / "crashy" / "__init__.py").write_text(CRASH_PACK)
    return packs


def isolated(root: Path) -> ServerParts:
    return make_isolated_parts(root, custom_nodes=[write_pack(root)], grace_s=1.0)


def one(class_type: str, value: int = 1) -> dict[str, Any]:
    return {"1": {"class_type": class_type, "inputs": {"value": value}}}


async def post(client: TestClient, prompt: dict[str, Any], **extra: Any) -> str:
    resp = await client.post("/prompt", json={"prompt": prompt, **extra})
    assert resp.status == 200, await resp.text()
    return str((await resp.json())["prompt_id"])


async def job(client: TestClient, job_id: str) -> dict[str, Any]:
    resp = await client.get(f"/api/v1/jobs/{job_id}")
    assert resp.status == 200, await resp.text()
    return dict(await resp.json())


async def until_running_node(client: TestClient, job_id: str, node: str) -> None:
    """Until the job's worker has started running ``node`` (its ``executing`` event arrived)."""
    deadline = time.monotonic() + SAFETY_S
    while time.monotonic() < deadline:
        current = await job(client, job_id)
        if current["status"] == "running" and (current["progress"] or {}).get("node") == node:
            return
        assert current["status"] in ("queued", "running"), current
        await asyncio.sleep(0.02)
    raise AssertionError(f"job {job_id} never ran node {node}")


async def worker(client: TestClient) -> dict[str, Any]:
    stats = await (await client.get("/system_stats")).json()
    return dict(stats["loom"]["job_worker"]["process"])


async def assert_next_job_succeeds(client: TestClient, value: int) -> None:
    healthy = await post(client, workflow(value))
    entry = await wait_history(client, healthy, timeout=SAFETY_S)
    assert entry["status"]["status_str"] == "success", entry["status"]
    assert entry["outputs"]["3"]["images"][0]["filename"].startswith(f"stub_{value + 1:05d}_")


# --- (a) a node that never checks for interruption ------------------------------------------------------
async def test_interrupt_and_delete_end_a_node_that_never_checks_and_the_next_job_runs(
    tmp_path: Path,
) -> None:
    app = create_app(isolated(tmp_path), ServerConfig())
    async with TestClient(TestServer(app)) as client:
        stuck = await post(client, one("Crash_Forever"))
        await until_running_node(client, stuck, "1")
        first_pid = (await worker(client))["pid"]
        assert (await client.post("/interrupt")).status == 200
        entry = await wait_history(client, stuck, timeout=SAFETY_S)
        assert entry["status"]["status_str"] == "error"
        assert [m[0] for m in entry["status"]["messages"]][-1] == "execution_interrupted"
        stopped = await job(client, stuck)
        assert stopped["status"] == "cancelled"
        assert "did not stop within" in stopped["errors"][0]["message"]
        await assert_next_job_succeeds(client, 4)
        after = await worker(client)
        assert after["pid"] != first_pid and after["ended"] == 1 and after["died"] == 0

        deleted = await post(client, one("Crash_Forever", 2))  # the same through DELETE /api/v1/jobs/{id}
        await until_running_node(client, deleted, "1")
        cancel = await client.delete(f"/api/v1/jobs/{deleted}")
        assert cancel.status == 202
        report = (await cancel.json())["interrupt"]
        assert report["requested"] and report["stoppable"] and report["forced_in_s"] is not None
        await wait_history(client, deleted, timeout=SAFETY_S)
        assert (await job(client, deleted))["status"] == "cancelled"
        await assert_next_job_succeeds(client, 5)
        assert (await worker(client))["ended"] == 2
    assert app[ERRORS].count == 0


# --- (b), (c) a node that ends its process -------------------------------------------------------------
@pytest.mark.parametrize(
    ("class_type", "exit_words"),
    [
        ("Crash_Exit3", "exited with code 3"),
        ("Crash_Segfault", f"exited with signal {int(signal.SIGSEGV)} (SIGSEGV"),
    ],
)
async def test_a_node_that_ends_its_process_fails_only_its_job(
    tmp_path: Path, class_type: str, exit_words: str
) -> None:
    app = create_app(isolated(tmp_path), ServerConfig())
    async with TestClient(TestServer(app)) as client:
        await assert_next_job_succeeds(client, 1)  # the worker is up and has run a job
        before = await worker(client)
        crashed = await post(client, one(class_type))
        entry = await wait_history(client, crashed, timeout=SAFETY_S)
        assert entry["status"]["status_str"] == "error"
        error = next(m[1] for m in entry["status"]["messages"] if m[0] == "execution_error")
        message = error["exception_message"]
        assert f"the worker process {exit_words}" in message
        assert f"while running node 1 ({class_type} from plugin pack 'crashy')" in message
        assert "the next job runs in a fresh worker process" in message
        assert error["node_id"] == "1" and error["node_type"] == class_type
        assert (await client.get("/queue")).status == 200  # the server answers
        await assert_next_job_succeeds(client, 2)
        after = await worker(client)
        assert after["pid"] != before["pid"] and after["died"] == 1 and after["alive"]
        assert exit_words in after["last_exit"]
    assert app[ERRORS].count == 0


# --- (d) a normal job looks as it does in process ------------------------------------------------------
def comparable(value: Any) -> Any:
    """``value`` without what differs between two runs of the same job (times, timestamps)."""
    if isinstance(value, dict):
        return {k: comparable(v) for k, v in value.items() if k not in ("timestamp", "timings")}
    if isinstance(value, list):
        return [comparable(v) for v in value]
    return value


async def run_and_record(parts: ServerParts, prompt: dict[str, Any], prompt_id: str) -> dict[str, Any]:
    """Run one job with a websocket open: its messages, its history entry, its job resource, its files
    (every preview frame sent: no frame-rate limit, none dropped while an earlier one is in flight)."""
    app = create_app(parts, ServerConfig(preview_fps=0, max_waiting_previews=1000))
    async with TestClient(TestServer(app)) as client:
        ws: ClientWebSocketResponse = await client.ws_connect("/ws?clientId=watcher")
        assert (await receive_json(ws))["type"] == "status"
        await post(client, prompt, prompt_id=prompt_id, client_id="watcher")
        messages, binary = [], 0
        while True:
            msg = await ws.receive(timeout=SAFETY_S)
            if msg.type.name == "BINARY":
                binary += 1
                continue
            data = json.loads(msg.data)
            if data["type"] != "status":
                messages.append(data)
            if data["type"] == "executing" and data["data"].get("node") is None:
                break
        history = (await (await client.get(f"/history/{prompt_id}")).json())[prompt_id]
        resource = await job(client, prompt_id)
        await ws.close()
    files = {p.name: p.read_bytes() for p in sorted(parts.folders.output_dir.glob("*.png"))}
    for key in ("created_at", "started_at", "finished_at", "timings", "memory"):
        resource.pop(key, None)
    return {
        "messages": comparable(messages),
        "previews": binary,
        "history": comparable(history),
        "job": comparable(resource),
        "files": files,
    }


async def test_a_normal_job_gives_the_same_outputs_history_and_events_as_in_process(tmp_path: Path) -> None:
    prompt = {
        **workflow(6, steps=3, previews=True),
        "4": {"class_type": "Crash_Hello", "inputs": {"value": 9}},
    }
    local = make_parts(tmp_path / "local")
    write_pack(tmp_path / "local")
    from nodes.compat.shim import load_plugins_with_shim  # lazy: the in-process server's copy of the pack

    local.plugins = load_plugins_with_shim(
        local.registry, [tmp_path / "local" / "custom_nodes"], local.folders
    )
    in_process = await run_and_record(local, prompt, "same-job")
    in_worker = await run_and_record(isolated(tmp_path / "isolated"), prompt, "same-job")
    assert in_worker == in_process
    types = [m["type"] for m in in_worker["messages"]]
    assert types[0] == "execution_start" and "progress" in types and "executed" in types
    assert "crash.hello" in types  # the pack's send_sync reached the websocket from the worker
    assert in_worker["previews"] == 3 and in_worker["files"]


# --- end to end: python main.py serve --isolate-jobs --------------------------------------------------------
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def http(port: int, method: str, path: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=data,
        method=method,
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read() or b"null")


def history_of(port: int, prompt_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        entry = http(port, "GET", f"/history/{prompt_id}")
        if prompt_id in entry:
            return dict(entry[prompt_id])
        time.sleep(0.2)
    raise AssertionError(f"{prompt_id} never reached the history")


def test_serve_with_isolate_jobs_survives_a_crashing_and_a_stuck_plugin(tmp_path: Path) -> None:
    write_pack(tmp_path)  # tmp_path/custom_nodes: the --base-directory's plugin folder
    port = free_port()
    env = {**os.environ, "LOOM_NO_PRECISION_PROBE": "1"}
    log_path = tmp_path / "server.log"
    log_file = log_path.open("wb")
    server = subprocess.Popen(
        [sys.executable, str(ROOT / "main.py"), "serve", "--isolate-jobs", "--isolate-grace", "1",
         "--port", str(port), "--cpu", "--no-demo", "--base-directory", str(tmp_path)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log_file,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while True:
            assert server.poll() is None, log_path.read_text()
            try:
                http(port, "GET", "/queue")
                break
            except OSError:
                assert time.monotonic() < deadline, "the server never answered"
                time.sleep(0.5)
        crashed = http(port, "POST", "/prompt", {"prompt": one("Crash_Segfault")})["prompt_id"]
        entry = history_of(port, crashed)
        error = next(m[1] for m in entry["status"]["messages"] if m[0] == "execution_error")
        assert "exited with signal 11 (SIGSEGV" in error["exception_message"]
        assert "node 1 (Crash_Segfault from plugin pack 'crashy')" in error["exception_message"]
        stuck = http(port, "POST", "/prompt", {"prompt": one("Crash_Forever")})["prompt_id"]
        while http(port, "GET", f"/api/v1/jobs/{stuck}")["progress"] in (None, {}) or (
            http(port, "GET", f"/api/v1/jobs/{stuck}")["progress"].get("node") != "1"
        ):
            time.sleep(0.2)
        http(port, "POST", "/interrupt", {})
        history_of(port, stuck)
        assert http(port, "GET", f"/api/v1/jobs/{stuck}")["status"] == "cancelled"
        hello = http(port, "POST", "/prompt", {"prompt": one("Crash_Hello", 4)})["prompt_id"]
        entry = history_of(port, hello)
        assert entry["status"]["status_str"] == "success" and entry["outputs"]["1"]["text"] == ["hello 4"]
        worker_stats = http(port, "GET", "/system_stats")["loom"]["job_worker"]["process"]
        assert worker_stats["died"] == 1 and worker_stats["ended"] == 1 and worker_stats["alive"]
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log_file.close()
    log = log_path.read_text()
    assert server.returncode == 0, log
    assert "Traceback" not in log, log
