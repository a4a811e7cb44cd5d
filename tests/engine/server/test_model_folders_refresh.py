"""/object_info lists model files reached through symlinks, and walks the model folders afresh each time
it is asked for the whole catalogue (the editor's Refresh), so a file the folder times do not reveal
(a file system that keeps a folder's time, a network mount) still appears after a refresh."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient

from engine.folders import ModelFolders
from engine.server.app import create_app
from engine.server.common import ServerConfig
from nodes.load.checkpoint_loaders import NODES as LOADER_NODES
from nodes.load.checkpoint_loaders import register_model_options
from tests.engine.server.conftest import make_parts


def keep_folder_time(folder: Path, old: os.stat_result) -> None:
    """Put ``folder``'s times back, as a file system that does not update them would leave them."""
    os.utime(folder, ns=(old.st_atime_ns, old.st_mtime_ns))


async def checkpoint_names(client: TestClient) -> list[str]:
    body = await (await client.get("/object_info")).json()
    names: list[str] = body["CheckpointLoaderSimple"]["input"]["required"]["ckpt_name"][0]
    return names


async def test_object_info_lists_links_and_walks_the_folders_again(
    aiohttp_client: Any, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    (store / "sd").mkdir(parents=True)
    (store / "sd" / "a.safetensors").write_bytes(b"x")
    (tmp_path / "elsewhere.safetensors").write_bytes(b"x")
    checkpoints = tmp_path / "models" / "checkpoints"
    checkpoints.mkdir(parents=True)
    (checkpoints / "linked.safetensors").symlink_to(tmp_path / "elsewhere.safetensors")
    (checkpoints / "library").symlink_to(store / "sd", target_is_directory=True)
    for folder in (checkpoints, store / "sd"):  # old enough to be trusted by the listing cache
        os.utime(folder, ns=(10**18, 10**18))

    model_files = ModelFolders(tmp_path / "models")
    parts = make_parts(tmp_path)
    parts.folders = dataclasses.replace(parts.folders, model_files=model_files)
    parts.registry.register_all(LOADER_NODES, origin="core")
    register_model_options(parts.registry, model_files)
    client: TestClient = await aiohttp_client(create_app(parts, ServerConfig()))

    assert await checkpoint_names(client) == ["library/a.safetensors", "linked.safetensors"]
    before = os.stat(store / "sd")
    (store / "sd" / "b.safetensors").write_bytes(b"x")
    keep_folder_time(store / "sd", before)
    assert model_files.list("checkpoints") == [
        "library/a.safetensors",
        "linked.safetensors",
    ]  # cached: unseen
    assert await checkpoint_names(client) == [
        "library/a.safetensors",
        "library/b.safetensors",
        "linked.safetensors",
    ]
    assert (
        model_files.resolve("checkpoints", "library/b.safetensors")
        == checkpoints / "library" / "b.safetensors"
    )
