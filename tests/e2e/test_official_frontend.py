"""ComfyUI's official frontend (the installed comfyui-frontend-package) against Loom's real server
in Chromium: it loads without a missing route, the default graph runs from Run, the job shows in
the queue panel and the Assets list, and the templates browser, Model Library and Console panel
are filled; a cancelled job shows as cancelled."""

from __future__ import annotations

import importlib.util
import json
import sys
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from .conftest import ROOT, Server, start_server, stop_server

pytestmark = [pytest.mark.browser, pytest.mark.slow]

WAIT = 120_000  # ms: jobs run on demo models on a shared CPU
# the default graph's loaders (today's default is Z-Image Turbo) on the demo files of that family,
# and a small image: the frontend picks each combo's first file, which is some other family's
DEMO_WIDGETS = {
    "CLIPLoader": {"clip_name": "loom_demo_qwen_3_4b.safetensors"},
    "UNETLoader": {"unet_name": "loom_demo_z_image_turbo.safetensors"},
    "VAELoader": {"vae_name": "loom_demo_flux_ae.safetensors"},
    "EmptySD3LatentImage": {"width": 64, "height": 64},
    "KSampler": {"steps": 2},
}
# ComfyUI answers 404 itself for user files and folders that do not exist yet (user.css,
# comfy.templates.json, ?dir=workflows on a fresh user folder): the contract, not a missing route
USERDATA_404 = "/api/userdata"
# ComfyUI also answers 404 for the preview of a model file that has none next to it (the demo
# models have none); the frontend asks for every model it lists
NO_PREVIEW_404 = "/api/experiment/models/preview/"
EXPECTED_404 = (USERDATA_404, NO_PREVIEW_404)


@pytest.fixture(scope="module")
def official(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[Server]:
    if importlib.util.find_spec("comfyui_frontend_package") is None:
        pytest.skip('comfyui-frontend-package is not installed (pip install -e ".[comfyui-frontend]")')
    data = tmp_path_factory.mktemp("loom-official")
    request.getfixturevalue("all_demo_models_source").copy_to(data / "models")
    # a returning user: a first visit opens the templates browser over an empty graph instead
    settings = data / "user" / "default" / "comfy.settings.json"
    settings.parent.mkdir(parents=True)
    settings.write_text(json.dumps({"Comfy.TutorialCompleted": True}))
    options = ["--models-dir", str(data / "models"), "--user-dir", str(data / "user")]
    for name in ("output", "input", "temp"):
        options += [f"--{name}-dir", str(data / name)]
    proc, url, _ = start_server([sys.executable, "main.py", "serve", *options], data, "official")
    yield Server(url, "real", proc, data)
    stop_server(proc)


def jobs(server: Server, status: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{server.url}/api/jobs?status={status}", timeout=30) as res:
        return json.loads(res.read())["jobs"]


def wait_job(server: Server, status: str, count: int, timeout: float = WAIT / 1000) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = jobs(server, status)
        if len(found) >= count:
            return found
        time.sleep(0.5)
    raise AssertionError(f"no {count} {status} job(s) in {timeout:.0f} s: {jobs(server, 'all')[:3]}")


def test_the_official_frontend_runs_against_loom(browser: Any, official: Server) -> None:
    context = browser.new_context(viewport={"width": 1600, "height": 900})
    page = context.new_page()
    missing: list[str] = []
    page_errors: list[str] = []

    def on_response(response: Any) -> None:
        path = response.url.removeprefix(official.url)
        if response.status in (404, 405) and path.startswith("/api/") and not path.startswith(EXPECTED_404):
            missing.append(f"{response.status} {response.request.method} {path}")

    page.on("response", on_response)
    page.on("pageerror", lambda error: page_errors.append(str(error)))
    try:
        page.goto(official.url + "/")
        page.wait_for_function("() => window.app?.graph?._nodes?.length > 0", timeout=WAIT)
        assert (page.locator("[data-testid=loom-tab-button]")).count() == 1  # Loom's extension loaded

        # the default graph, on demo files, queued from Run
        page.evaluate(
            """(values) => { for (const node of app.graph._nodes)
                for (const w of node.widgets || []) if (values[node.type]?.[w.name] !== undefined)
                    w.value = values[node.type][w.name]; }""",
            DEMO_WIDGETS,
        )
        page.click("[data-testid=queue-button]")
        done = wait_job(official, "completed", 1)
        page.click("[data-testid=queue-overlay-toggle]")
        page.locator("[data-testid=job-assets-list]").get_by_text("ComfyUI", exact=False).first.wait_for(
            timeout=WAIT
        )

        page.click("[data-testid=assets-tab-button]")
        page.locator(".sidebar-content-container img").first.wait_for(timeout=WAIT)

        page.click("[data-testid=model-library-tab-button]")
        page.get_by_text("checkpoints", exact=True).click()
        page.get_by_text("loom_demo_sd15", exact=False).first.wait_for(timeout=WAIT)

        page.click("[aria-label='Toggle Bottom Panel']")
        page.locator(".xterm-rows").get_by_text("loom.", exact=False).first.wait_for(timeout=WAIT)

        page.click("button[aria-label='Templates']")
        page.locator("[data-testid^=template-workflow-]").first.wait_for(timeout=WAIT)
        page.keyboard.press("Escape")

        # a long run, cancelled from the frontend's button
        page.evaluate(
            "() => { for (const n of app.graph._nodes) if (n.type === 'KSampler') n.widgets.find(w => w.name === 'steps').value = 10000; }"
        )
        page.click("[data-testid=queue-button]")
        wait_job(official, "in_progress", 1)
        page.click("[aria-label='Cancel current run']")
        cancelled = wait_job(official, "cancelled", 1)
        assert cancelled[0]["id"] != done[0]["id"]
    finally:
        page.screenshot(path=str(ROOT / "artifacts" / "screenshots" / "official-frontend-end.png"))
        context.close()
    assert not missing, "the official frontend met missing routes:\n" + "\n".join(missing)
    assert not page_errors, "the official frontend threw:\n" + "\n".join(page_errors)
