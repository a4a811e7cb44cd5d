"""ComfyUI's model-library routes and view_metadata, over Loom's model folders:

GET /api/experiment/models            [{"name": kind, "folders": [paths]}]
GET /api/experiment/models/{kind}     [{"name", "pathIndex", "modified", "created", "size"}]; unknown kind 404
GET /api/experiment/models/preview/{kind}/{path_index}/{file}   the picture beside the model file
GET /api/view_metadata/{kind}?filename=x.safetensors            the header's __metadata__
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient

from engine.folders import ModelFolders
from engine.server.app import create_app
from engine.server.common import ServerConfig
from tests.engine.server.conftest import make_parts
from tests.engine.server.test_model_info import write_safetensors


async def model_client(aiohttp_client: Any, tmp_path: Path) -> TestClient:
    parts = make_parts(tmp_path)
    parts.folders = dataclasses.replace(parts.folders, model_files=ModelFolders(tmp_path / "models"))
    loras = tmp_path / "models" / "loras"
    write_safetensors(loras / "style.safetensors", {"ss_output_name": "style"})
    write_safetensors(loras / "plain.safetensors", None)
    (loras / "style.png").write_bytes(b"\x89PNG fake")
    return await aiohttp_client(create_app(parts, ServerConfig()))  # type: ignore[no-any-return]


async def test_model_library_lists_folders_and_files(aiohttp_client: Any, tmp_path: Path) -> None:
    client = await model_client(aiohttp_client, tmp_path)
    folders = await (await client.get("/api/experiment/models")).json()
    by_name = {f["name"]: f["folders"] for f in folders}
    assert str(tmp_path / "models" / "loras") in by_name["loras"]
    files = await (await client.get("/api/experiment/models/loras")).json()
    assert {f["name"] for f in files} == {"style.safetensors", "plain.safetensors"}
    one = files[0]
    assert set(one) == {"name", "pathIndex", "modified", "created", "size"} and one["pathIndex"] == 0
    missing = await client.get("/api/experiment/models/nonsense")
    assert missing.status == 404 and "Folder not found" in (await missing.json())["error"]["message"]


async def test_preview_beside_the_model_file(aiohttp_client: Any, tmp_path: Path) -> None:
    client = await model_client(aiohttp_client, tmp_path)
    resp = await client.get("/api/experiment/models/preview/loras/0/style.safetensors")
    assert resp.status == 200 and await resp.read() == b"\x89PNG fake"
    assert (await client.get("/api/experiment/models/preview/loras/0/plain.safetensors")).status == 404
    assert (await client.get("/api/experiment/models/preview/loras/9/style.safetensors")).status == 404
    assert (await client.get("/api/experiment/models/preview/loras/x/style.safetensors")).status == 400


async def test_view_metadata(aiohttp_client: Any, tmp_path: Path) -> None:
    client = await model_client(aiohttp_client, tmp_path)
    resp = await client.get("/api/view_metadata/loras?filename=style.safetensors")
    assert resp.status == 200 and await resp.json() == {"ss_output_name": "style"}
    assert (await client.get("/api/view_metadata/loras?filename=plain.safetensors")).status == 404
    assert (await client.get("/api/view_metadata/loras?filename=none.safetensors")).status == 404
    assert (await client.get("/api/view_metadata/loras?filename=style.ckpt")).status == 404
    bad = await client.get("/api/view_metadata/loras")
    assert bad.status == 400 and "filename" in (await bad.json())["error"]["message"]
