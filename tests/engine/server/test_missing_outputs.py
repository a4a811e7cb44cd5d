"""History and job views say when an output file is gone (issue 19, item 12): history outlives
restarts, the files may not (deleted, or the server restarted with another --output-dir)."""

from __future__ import annotations

from aiohttp.test_utils import TestClient

from engine.server.app import ServerParts
from nodes.bench.stubs.server_nodes import workflow
from tests.engine.server.conftest import wait_history


async def test_deleted_outputs_are_marked_missing(client: TestClient, parts: ServerParts) -> None:
    kept_id = (await (await client.post("/prompt", json={"prompt": workflow(1, prefix="kept")})).json())[
        "prompt_id"
    ]
    gone_id = (await (await client.post("/prompt", json={"prompt": workflow(2, prefix="gone")})).json())[
        "prompt_id"
    ]
    kept, gone = await wait_history(client, kept_id), await wait_history(client, gone_id)
    assert "missing" not in kept["outputs"]["3"]["images"][0]
    gone_file = gone["outputs"]["3"]["images"][0]
    (parts.folders.output_dir / gone_file["filename"]).unlink()

    history = await (await client.get("/history")).json()
    assert history[gone_id]["outputs"]["3"]["images"][0] == {**gone_file, "missing": True}
    assert "missing" not in history[kept_id]["outputs"]["3"]["images"][0]  # ComfyUI's shape otherwise
    one = await (await client.get(f"/history/{gone_id}")).json()
    assert one[gone_id]["outputs"]["3"]["images"][0]["missing"] is True

    job = await (await client.get(f"/api/v1/jobs/{gone_id}")).json()
    assert job["outputs"][0]["missing"] is True
    listed = {j["id"]: j for j in (await (await client.get("/api/v1/jobs")).json())["jobs"]}
    assert listed[gone_id]["outputs"][0]["missing"] is True and "missing" not in listed[kept_id]["outputs"][0]


async def test_another_output_dir_marks_every_old_file_missing(
    client: TestClient, parts: ServerParts
) -> None:
    prompt_id = (await (await client.post("/prompt", json={"prompt": workflow(3)})).json())["prompt_id"]
    await wait_history(client, prompt_id)
    for path in parts.folders.output_dir.iterdir():  # as if started with another --output-dir
        path.rename(parts.folders.temp_dir / path.name)
    entry = (await (await client.get("/history")).json())[prompt_id]
    assert all(image.get("missing") for image in entry["outputs"]["3"]["images"])
