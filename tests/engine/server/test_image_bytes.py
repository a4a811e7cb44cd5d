"""In-memory PNG for API responses (issue 9): a job that asks for bytes gets its images from memory,
equal to what the file would hold; PreviewImage then writes no temp file; the safety guard still
decides what the bytes are."""

from __future__ import annotations

import asyncio
import base64
import io
from pathlib import Path
from typing import Any

import pytest
import torch
from aiohttp.test_utils import TestClient
from PIL import Image

from engine.context import KeptImages
from engine.events import Preview
from engine.executor import RunRequest
from engine.image_guard import SAFETY_CHUNK, Guarded, Policy, Verdict
from engine.server.app import ServerParts, create_app
from engine.server.common import ServerConfig
from nodes.image.load_save import EmptyImage, PreviewImage, SaveImage
from tests.engine.server.conftest import make_parts

RED = 0xCC2211


def image_workflow(color: int = RED) -> dict[str, Any]:
    """EmptyImage (8x8, two images) -> PreviewImage and SaveImage, in API format."""
    return {
        "1": {
            "class_type": "EmptyImage",
            "inputs": {"width": 8, "height": 8, "batch_size": 2, "color": color},
        },
        "2": {"class_type": "PreviewImage", "inputs": {"images": ["1", 0]}},
        "3": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "bytes"}},
    }


def with_image_nodes(root: Path) -> ServerParts:
    parts = make_parts(root)
    for node in (EmptyImage, PreviewImage, SaveImage):
        parts.registry.register(node)
    return parts


def files_in(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.png"))


class HalfGuard:
    """Replaces every image by half its brightness (stands in for the safety checker's action)."""

    @property
    def policy(self) -> Policy:
        return "enforce"

    def check_images(self, images: Any) -> Guarded:
        return Guarded(images * 0.5, tuple(Verdict(True, "blur") for _ in range(images.shape[0])))

    def check_preview(self, preview: Preview) -> Preview | None:
        return preview

    def check_encoded(self, data: bytes) -> bytes:
        return data


# --- the executor and the nodes ---------------------------------------------------------------------
def test_kept_bytes_equal_the_files_and_previews_skip_the_disk(tmp_path: Path) -> None:
    parts = with_image_nodes(tmp_path)
    kept = parts.executor.run(RunRequest(image_workflow(), keep_images=True))
    assert kept.status == "success", kept.error
    assert files_in(parts.folders.temp_dir) == []  # PreviewImage: no disk round trip
    saved = files_in(parts.folders.output_dir)
    assert len(saved) == 2 and len(kept.images) == 4
    for entry in kept.outputs["3"]["images"]:  # SaveImage: memory == the file it wrote
        assert (
            kept.images[KeptImages.key(entry)] == (parts.folders.output_dir / entry["filename"]).read_bytes()
        )

    files = parts.executor.run(RunRequest(image_workflow()))  # the same previews, written this time
    assert files.images == {} and files.cached == ["1", "3"] and files.executed == ["2"]
    written = [(parts.folders.temp_dir / e["filename"]).read_bytes() for e in files.outputs["2"]["images"]]
    in_memory = [kept.images[KeptImages.key(e)] for e in kept.outputs["2"]["images"]]
    assert in_memory == written
    pixels = Image.open(io.BytesIO(in_memory[0])).convert("RGB").getpixel((3, 3))
    assert pixels == (0xCC, 0x22, 0x11)


def test_memory_only_previews_are_not_cached(tmp_path: Path) -> None:
    """A cached UI output naming a temp file that was never written would break later runs."""
    parts = with_image_nodes(tmp_path)
    first = parts.executor.run(RunRequest(image_workflow(), keep_images=True))
    again = parts.executor.run(RunRequest(image_workflow(), keep_images=True))
    assert "2" in again.executed and "3" in again.cached  # the preview re-encodes; the saved file is reused
    assert len(again.images) == 2  # the preview's; the cached SaveImage is served from its file
    assert list(again.images.values()) == [
        first.images[KeptImages.key(e)] for e in first.outputs["2"]["images"]
    ]


def test_kept_bytes_are_the_guarded_images(tmp_path: Path) -> None:
    parts = with_image_nodes(tmp_path)
    parts.executor.image_guard = HalfGuard()
    result = parts.executor.run(RunRequest(image_workflow(), keep_images=True))
    for node in ("2", "3"):
        for entry in result.outputs[node]["images"]:
            png = Image.open(io.BytesIO(result.images[KeptImages.key(entry)]))
            assert SAFETY_CHUNK in png.text  # type: ignore[attr-defined]
            assert png.convert("RGB").getpixel((0, 0)) == (0x66, 0x11, 0x08)  # half of RED, rounded


def test_nodes_without_kept_images_write_as_before(tmp_path: Path) -> None:
    parts = with_image_nodes(tmp_path)
    ctx_images = torch.full((1, 4, 4, 3), 0.5)
    from engine.context import NodeContext

    ctx = NodeContext(node_id="9", prompt_id="p", folders=parts.folders)
    ui = PreviewImage().run(ctx, images=ctx_images).ui
    assert ui is not None and (parts.folders.temp_dir / ui["images"][0]["filename"]).is_file()


# --- the job API ------------------------------------------------------------------------------------
@pytest.fixture
async def image_client(aiohttp_client: Any, tmp_path: Path) -> tuple[TestClient, ServerParts]:
    parts = with_image_nodes(tmp_path)
    return await aiohttp_client(create_app(parts, ServerConfig())), parts


async def finished(client: TestClient, job_id: str, query: str = "") -> dict[str, Any]:
    for _ in range(750):
        job = await (await client.get(f"/api/v1/jobs/{job_id}{query}")).json()
        if job["status"] in ("succeeded", "failed", "cancelled"):
            return job
        await asyncio.sleep(0.02)
    raise AssertionError(f"job {job_id} did not finish")


async def test_job_returning_bytes_serves_them_from_memory(
    image_client: tuple[TestClient, ServerParts],
) -> None:
    client, parts = image_client
    resp = await client.post("/api/v1/jobs", json={"workflow": image_workflow(), "return": "bytes"})
    assert resp.status == 201
    job = await finished(client, (await resp.json())["id"])
    assert job["status"] == "succeeded" and len(job["outputs"]) == 4
    assert all("data" not in o for o in job["outputs"])
    assert files_in(parts.folders.temp_dir) == []
    bodies = []
    for n, output in enumerate(job["outputs"]):
        assert output["image"] == f"/api/v1/jobs/{job['id']}/images/{n}"
        got = await client.get(output["image"], allow_redirects=False)
        assert got.status == 200 and got.content_type == "image/png"
        bodies.append(await got.read())
        if output["type"] == "output":
            assert bodies[-1] == (parts.folders.output_dir / output["filename"]).read_bytes()
    assert {b[:8] for b in bodies} == {b"\x89PNG\r\n\x1a\n"}

    embedded = await finished(client, job["id"], "?images=base64")
    assert [base64.b64decode(o["data"]) for o in embedded["outputs"]] == bodies
    missing = await client.get(f"/api/v1/jobs/{job['id']}/images/4")
    assert missing.status == 404 and "0..3" in (await missing.json())["error"]["message"]


async def test_base64_jobs_embed_and_file_jobs_redirect(image_client: tuple[TestClient, ServerParts]) -> None:
    client, parts = image_client
    resp = await client.post("/api/v1/jobs", json={"workflow": image_workflow(0x00FF00), "return": "base64"})
    job = await finished(client, (await resp.json())["id"])
    assert all(base64.b64decode(o["data"]).startswith(b"\x89PNG") for o in job["outputs"])

    resp = await client.post("/api/v1/jobs", json={"workflow": image_workflow(0x0000FF)})
    plain = await finished(client, (await resp.json())["id"])
    assert all("data" not in o for o in plain["outputs"])
    first = plain["outputs"][0]
    redirect = await client.get(first["image"], allow_redirects=False)
    assert redirect.status == 307 and redirect.headers["Location"] == first["url"]
    followed = await client.get(first["image"])
    assert followed.status == 200
    assert await followed.read() == (parts.folders.temp_dir / first["filename"]).read_bytes()


async def test_unknown_return_mode_is_refused(image_client: tuple[TestClient, ServerParts]) -> None:
    client, _ = image_client
    resp = await client.post("/api/v1/jobs", json={"workflow": image_workflow(), "return": "png"})
    assert resp.status == 400
    assert "bytes" in (await resp.json())["error"]["message"]
