"""`POST /api/v1/workflows/check`: the compatibility report over HTTP (stub catalogue)."""

from __future__ import annotations

from typing import Any

from tests.engine.plugins.test_compat_check import mixed_workflow


async def test_api_route(client: Any) -> None:
    resp = await client.post("/api/v1/workflows/check", json={"workflow": mixed_workflow()})
    assert resp.status == 200
    report = await resp.json()
    assert report["ok"] is False and report["missing_core"] >= 2
    assert any(
        m["class_type"] == "FaceDetailer" and m["pack"] == "comfyui-impact-pack" for m in report["missing"]
    )
    bad = await (await client.post("/api/v1/workflows/check", json=[1])).json()
    assert bad["ok"] is False and bad["error"]
    assert (await client.post("/api/v1/workflows/check", data=b"[")).status == 400
