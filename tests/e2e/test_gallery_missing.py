"""The gallery shows a placeholder for a history image whose file is gone, without requesting it
(issue 19, item 12): no failing request, no console error."""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

import pytest

from tests.e2e.conftest import Editor

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def post_json(url: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="POST", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as res:
        return dict(json.loads(res.read()))


def test_gallery_placeholder_for_a_deleted_output(editor: Editor) -> None:
    server = editor.server
    names = server.get("/object_info/CheckpointLoaderSimple")["CheckpointLoaderSimple"]["input"]["required"][
        "ckpt_name"
    ][0]
    ckpt = next(n for n in names if "demo" in n.lower()) if server.kind == "real" else names[0]
    prompt = {
        "1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": ckpt}},
        "2": {"class_type": "CLIPTextEncode", "inputs": {"text": "gone", "clip": ["1", 1]}},
        "3": {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 64, "batch_size": 1}},
        "4": {
            "class_type": "KSampler",
            "inputs": {
                "model": ["1", 0],
                "positive": ["2", 0],
                "negative": ["2", 0],
                "latent_image": ["3", 0],
                "seed": 5,
                "steps": 1,
                "cfg": 1.0,
                "sampler_name": "euler",
                "scheduler": "normal",
                "denoise": 1.0,
            },
        },
        "5": {"class_type": "VAEDecode", "inputs": {"samples": ["4", 0], "vae": ["1", 2]}},
        "6": {"class_type": "SaveImage", "inputs": {"images": ["5", 0], "filename_prefix": "deleted_later"}},
    }
    job = post_json(server.url + "/api/v1/jobs", {"workflow": prompt})
    deadline = time.monotonic() + 120
    while (current := server.get(f"/api/v1/jobs/{job['id']}"))["status"] not in (
        "succeeded",
        "failed",
        "cancelled",
    ):
        assert time.monotonic() < deadline, "the job did not finish"
        time.sleep(0.2)
    assert current["status"] == "succeeded", current
    filename = current["outputs"][0]["filename"]
    (server.data / "output" / current["outputs"][0]["subfolder"] / filename).unlink()

    requested: list[str] = []
    editor.page.on("request", lambda request: requested.append(request.url))
    editor.open()
    editor.page.click('[data-show-panel="gallery"]')
    placeholder = editor.page.locator(f'.gallery-missing[data-filename="{filename}"]')
    placeholder.wait_for(state="visible", timeout=20_000)
    assert "no longer on disk" in (placeholder.get_attribute("title") or "")
    assert not [url for url in requested if filename in url], "the gallery requested a file that is gone"
    editor.shot("gallery-missing-placeholder")
