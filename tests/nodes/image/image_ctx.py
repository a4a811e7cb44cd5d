"""A light NodeContext for image/mask node tests (no model folders, no tiny models)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.context import Folders, KeptImages, NodeContext, RunSettings


def image_ctx(tmp_path: Path, *, keep: bool = False, **settings: Any) -> NodeContext:
    folders = Folders(tmp_path / "input", tmp_path / "output", tmp_path / "temp")
    folders.ensure()
    return NodeContext(
        node_id="7",
        prompt_id="test",
        folders=folders,
        settings=RunSettings(**settings),
        kept_images=KeptImages() if keep else None,
    )
