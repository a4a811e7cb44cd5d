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
from tests.engine.server.conftest import make_parts


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


def write_header(path: Path, raw: bytes, data: bytes = b"") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


def hostile_gguf(path: Path) -> None:
    """A GGUF file whose one metadata value is an array of arrays nested 20,000 deep."""
    body = struct.pack("<Q", 4) + b"deep" + struct.pack("<I", 9) + struct.pack("<IQ", 9, 1) * 20_000
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + body + struct.pack("<IQ", 0, 0))


async def test_one_hostile_header_fails_only_its_own_entry(aiohttp_client: Any, tmp_path: Path) -> None:
    from engine.server.security import ERRORS
    from nodes.load.presets import ModelDescriber, PresetTable

    parts = make_parts(tmp_path)
    parts.folders = dataclasses.replace(parts.folders, model_files=ModelFolders(tmp_path / "models"))
    parts.describe_model = ModelDescriber(PresetTable.load(None))
    folder = tmp_path / "models" / "checkpoints"
    write_safetensors(folder / "good.safetensors", {"modelspec.title": "Good"})
    write_header(folder / "deep.safetensors", b'{"a":' * 100_000 + b"1" + b"}" * 100_000)
    write_header(
        folder / "listmeta.safetensors",
        json.dumps(
            {"__metadata__": [1, 2], "w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}
        ).encode(),
        b"\0" * 8,
    )
    write_header(
        folder / "offsets.safetensors",
        json.dumps({"w": {"dtype": "F32", "shape": [4, 4], "data_offsets": [0, 8]}}).encode(),
        b"\0" * 8,
    )
    hostile_gguf(folder / "nested.gguf")
    app = create_app(parts, ServerConfig())
    client: TestClient = await aiohttp_client(app)
    resp = await client.get("/api/v1/models/checkpoints/info")
    assert resp.status == 200, await resp.text()
    files = {f["name"]: f for f in (await resp.json())["files"]}
    assert set(files) == {
        "good.safetensors",
        "deep.safetensors",
        "listmeta.safetensors",
        "offsets.safetensors",
        "nested.gguf",
    }
    assert files["good.safetensors"]["title"] == "Good" and files["good.safetensors"]["error"] is None
    assert (
        "deep.safetensors" in files["deep.safetensors"]["error"]
        and "nested" in files["deep.safetensors"]["error"]
    )
    for name in files:
        resp = await client.get(f"/api/v1/models/checkpoints/{name}")
        assert resp.status < 500, (name, await resp.text())
        body = await resp.json()
        if name != "good.safetensors":  # a JSON error naming the file, not a traceback
            error = body.get("family_error") or body.get("error") or body["error"]["message"]
            assert name in str(error) and "Traceback" not in str(error), (name, body)
    offsets = (await (await client.get("/api/v1/models/checkpoints/offsets.safetensors")).json())[
        "family_error"
    ]
    assert "'w'" in offsets and "64 bytes" in offsets and "data_offsets" in offsets, offsets
    assert app[ERRORS].count == 0, "the server turned an exception into a 500"
