"""GET /api/v1/models/{folder}/info: each file of a model folder with its size and what its
safetensors header says (title, trigger words, base model), read without loading tensors; files
without metadata or with a broken header are still listed."""

from __future__ import annotations

import dataclasses
import json
import struct
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient

from engine.folders import ModelFolders
from engine.model_meta import HeaderError, describe_model_file, read_safetensors_metadata
from engine.server.app import create_app
from engine.server.common import ServerConfig
from tests.server.conftest import make_parts


def write_safetensors(path: Path, metadata: dict[str, str] | None) -> None:
    header: dict[str, Any] = {"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}
    if metadata is not None:
        header["__metadata__"] = metadata
    raw = json.dumps(header).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * 8)


def test_metadata_is_read_from_the_header(tmp_path: Path) -> None:
    path = tmp_path / "style.safetensors"
    write_safetensors(
        path,
        {
            "modelspec.title": "Watercolour",
            "modelspec.trigger_phrase": "wtrclr, soft wash",
            "modelspec.architecture": "stable-diffusion-v1/lora",
            "ss_tag_frequency": "x" * 1000,
        },
    )
    info = describe_model_file("style.safetensors", path)
    assert info.title == "Watercolour" and info.trigger_words == ["wtrclr", "soft wash"]
    assert info.base_model == "stable-diffusion-v1/lora" and info.size == path.stat().st_size
    assert len(info.metadata["ss_tag_frequency"]) < 500  # long values are cut for display
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x05")
    try:
        read_safetensors_metadata(bad)
    except HeaderError as exc:
        assert "shorter" in str(exc)
    else:
        raise AssertionError("a 1-byte file must be refused")
    assert describe_model_file("bad.safetensors", bad).error


async def test_model_info_route(aiohttp_client: Any, tmp_path: Path) -> None:
    parts = make_parts(tmp_path)
    parts.folders = dataclasses.replace(parts.folders, model_files=ModelFolders(tmp_path / "models"))
    write_safetensors(
        tmp_path / "models" / "loras" / "a.safetensors",
        {"ss_base_model_version": "sd_v1", "ss_output_name": "a-style"},
    )
    write_safetensors(tmp_path / "models" / "loras" / "plain.safetensors", None)
    (tmp_path / "models" / "loras" / "broken.safetensors").write_bytes(b"\xff" * 8 + b"{")
    client: TestClient = await aiohttp_client(create_app(parts, ServerConfig()))
    body = await (await client.get("/api/v1/models/loras/info")).json()
    files = {f["name"]: f for f in body["files"]}
    assert set(files) == {"a.safetensors", "plain.safetensors", "broken.safetensors"}
    assert files["a.safetensors"]["title"] == "a-style" and files["a.safetensors"]["base_model"] == "sd_v1"
    assert files["plain.safetensors"]["metadata"] == {} and files["plain.safetensors"]["size"] > 0
    assert "larger than" in files["broken.safetensors"]["error"]
    assert (await client.get("/api/v1/models/nonsense/info")).status == 404
