"""Browser tests of the editor: a Loom server (the real one, `python main.py serve` with demo
models; or, while the model nodes are missing from the real one, tests/e2e/fake_server.py) and
Debian's Chromium driven by Playwright's sync API.

LOOM_E2E_SERVER=real|fake|auto (default auto: real when its /object_info has the txt2img nodes).
Screenshots go to artifacts/screenshots/.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "artifacts" / "screenshots"
TXT2IMG = {
    "CheckpointLoaderSimple",
    "CLIPTextEncode",
    "KSampler",
    "EmptyLatentImage",
    "VAEDecode",
    "SaveImage",
}
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@dataclass
class Server:
    url: str
    kind: str  # "real" or "fake"
    proc: subprocess.Popen
    data: Path

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=30) as res:
            return json.loads(res.read())

    def get_bytes(self, path: str) -> bytes:
        with urllib.request.urlopen(self.url + path, timeout=30) as res:
            return res.read()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_ready(url: str, proc: subprocess.Popen, log: Path, timeout: float = 90) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url + "/object_info", timeout=5) as res:
                return json.loads(res.read())
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"server did not start in {timeout}s:\n{log.read_text()[-3000:]}")


def start_server(cmd: list[str], data: Path, name: str) -> tuple[subprocess.Popen, str, dict[str, Any]]:
    port = _free_port()
    log = data / f"{name}.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [*cmd, "--port", str(port)], cwd=ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env
    )
    url = f"http://127.0.0.1:{port}"
    return proc, url, _wait_ready(url, proc, log)


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()


SERVER_KIND: list[str] = []


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[Server]:
    """The real server when it can run txt2img: ``main.py serve``; else, while register_core does
    not yet register every core node, the same server through tests/e2e/serve_all_nodes.py; the
    fake server only when asked for (LOOM_E2E_SERVER=fake) or when neither real one can run.
    Its models folder holds what ``main.py make-demo-model`` writes (the session's copy of it)."""
    mode = os.environ.get("LOOM_E2E_SERVER", "auto")
    data = tmp_path_factory.mktemp("loom-e2e")
    if mode in ("real", "auto"):
        models = data / "models"
        request.getfixturevalue("all_demo_models_source").copy_to(models)
        options = [
            "--models-dir",
            str(models),
            "--output-dir",
            str(data / "output"),
            "--input-dir",
            str(data / "input"),
            "--temp-dir",
            str(data / "temp"),
            "--user-dir",
            str(data / "user"),
            # plugin packs of every style, broken ones included: the editor must show the good ones
            "--custom-nodes",
            str(ROOT / "tests" / "engine" / "plugins" / "packs"),
            # Loom's editor at "/" even with comfyui-frontend-package installed (test_official_frontend.py
            # starts its own server with the official frontend)
            "--front-end-root",
            str(ROOT / "web"),
        ]
        launchers = [
            ("real: main.py serve", [sys.executable, "main.py", "serve", *options]),
            (
                "real: main.py serve + serve_all_nodes.py registration shim",
                [sys.executable, str(Path(__file__).with_name("serve_all_nodes.py")), *options],
            ),
        ]
        for kind, cmd in launchers:
            proc, url, info = start_server(cmd, data, "real")
            missing = TXT2IMG - set(info)
            if not missing:
                SERVER_KIND.append(kind)
                yield Server(url, "real", proc, data)
                stop_server(proc)
                return
            stop_server(proc)
            print(f"\n[e2e] {kind} lacks {sorted(missing)}", file=sys.stderr)
        if mode == "real":
            pytest.fail("no real server could run txt2img")
    SERVER_KIND.append("fake: tests/e2e/fake_server.py")
    proc, url, _ = start_server(
        [sys.executable, str(Path(__file__).with_name("fake_server.py")), "--data-dir", str(data)],
        data,
        "fake",
    )
    yield Server(url, "fake", proc, data)
    stop_server(proc)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if SERVER_KIND:
        terminalreporter.write_line(f"e2e server: {SERVER_KIND[0]}")


@pytest.fixture(scope="package")
def browser() -> Iterator[Any]:
    """One Chromium for every browser test (each test gets a fresh context: its own cookies, storage
    and page); it closes after tests/e2e, before other tests run their own event loops."""
    from playwright.sync_api import sync_playwright

    executable = shutil.which("chromium")
    if not executable:
        pytest.skip("Debian's chromium is not installed (apt-get install -y chromium)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


class Editor:
    """A page with the editor open, and the helpers tests share."""

    def __init__(self, page: Any, server: Server) -> None:
        self.page = page
        self.server = server

    def open(self) -> Editor:
        self.page.goto(self.server.url + "/")
        self.page.wait_for_selector("body[data-ready=true]", timeout=20_000)
        return self

    def saved(self) -> dict[str, Any]:
        return self.page.evaluate("loom.tabs.current.graph.toSaved()")

    def prompt(self) -> dict[str, Any]:
        return self.page.evaluate("loom.tabs.current.graph.toPrompt()")

    def node(self, node_id: str) -> Any:
        return self.page.locator(f'.node[data-node-id="{node_id}"]')

    def node_of_type(self, node_type: str) -> Any:
        return self.page.locator(f'.node[data-node-type="{node_type}"]')

    def port(self, node: Any, name: str, direction: str) -> Any:
        return node.locator(f'.port[data-port="{name}"][data-dir="{direction}"]')

    def drag(self, source: Any, target: Any | tuple[float, float], steps: int = 8) -> None:
        box = source.bounding_box()
        x0, y0 = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
        if isinstance(target, tuple):
            x1, y1 = target
        else:
            tb = target.bounding_box()
            x1, y1 = tb["x"] + tb["width"] / 2, tb["y"] + tb["height"] / 2
        mouse = self.page.mouse
        mouse.move(x0, y0)
        mouse.down()
        mouse.move(x1, y1, steps=steps)
        mouse.up()

    def add_node(self, node_type: str, x: float, y: float, query: str | None = None) -> Any:
        self.page.mouse.dblclick(x, y)
        box = self.page.locator('[data-role="search-input"]')
        box.wait_for(state="visible")
        box.fill(query or node_type)
        count = self.page.locator(".node").count()
        self.page.locator(f'.search-item[data-type="{node_type}"]').first.click()
        self.page.wait_for_function(f"() => document.querySelectorAll('.node').length === {count + 1}")
        node_id = self.page.evaluate("[...loom.editor.selection][0]")
        return self.node(node_id)

    def queue_and_wait_image(self, timeout: float = 120_000) -> Any:
        before = self.page.locator('.node[data-node-type="SaveImage"] .node-outputs img').count()
        self.page.click('[data-action="queue"]')
        img = self.page.locator('.node[data-node-type="SaveImage"] .node-outputs img.node-image')
        img.first.wait_for(state="visible", timeout=timeout)
        self.page.wait_for_function(
            "() => [...document.querySelectorAll('.node[data-node-type=SaveImage] .node-outputs img.node-image')]"
            ".some(i => i.complete && i.naturalWidth > 0)",
            timeout=timeout,
        )
        del before
        return img.first

    def drop_file(self, name: str, data: bytes, mime: str) -> None:
        self.page.evaluate(
            """([name, b64, mime]) => {
                const bytes = Uint8Array.from(atob(b64), c => c.charCodeAt(0));
                const dt = new DataTransfer();
                dt.items.add(new File([bytes], name, {type: mime}));
                const canvas = document.querySelector('.canvas');
                for (const type of ['dragover', 'drop'])
                    canvas.dispatchEvent(new DragEvent(type, {dataTransfer: dt, bubbles: true, cancelable: true}));
            }""",
            [name, __import__("base64").b64encode(data).decode(), mime],
        )

    def shot(self, name: str) -> None:
        SHOTS.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(SHOTS / f"{name}.png"))


@pytest.fixture
def editor(browser: Any, server: Server, request: pytest.FixtureRequest) -> Iterator[Editor]:
    context = browser.new_context(viewport={"width": 1600, "height": 900}, accept_downloads=True)
    page = context.new_page()
    problems: list[str] = []

    def on_console(message: Any) -> None:
        url = (message.location or {}).get("url", "")
        # POST /prompt answering 400 with node_errors is the validation contract, not a fault
        expected = "status of 400" in message.text and url.endswith("/prompt")
        if message.type == "error" and not expected:
            problems.append(f"console.{message.type}: {message.text} ({url})")

    page.on("console", on_console)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    ed = Editor(page, server)
    yield ed
    try:
        ed.shot(f"{request.node.name}-end")
    finally:
        context.close()
    assert not problems, "console errors:\n" + "\n".join(problems)
