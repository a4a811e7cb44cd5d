"""/view under --safety enforce: generated files that were not checked on write go through the guard."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from PIL import Image
from PIL.PngImagePlugin import PngInfo

from engine.events import Preview
from engine.image_guard import SAFETY_CHUNK, Guarded
from engine.server.app import create_app
from engine.server.common import ServerConfig
from tests.engine.server.conftest import make_parts

BLACK = io.BytesIO()
Image.new("RGB", (4, 4), (0, 0, 0)).save(BLACK, format="PNG")


class BlackOutGuard:
    """Flags everything: stands in for the safety checker (its own tests are in tests/nodes)."""

    policy = "enforce"

    def __init__(self) -> None:
        self.checked = 0

    def check_images(self, images: Any) -> Guarded:
        raise NotImplementedError

    def check_preview(self, preview: Preview) -> Preview | None:
        return None

    def check_encoded(self, data: bytes) -> bytes:
        self.checked += 1
        return BLACK.getvalue()


def write_png(path: Path, checked: bool) -> bytes:
    info = PngInfo()
    if checked:
        info.add_text(SAFETY_CHUNK, '{"flagged": false}')
    buf = io.BytesIO()
    Image.new("RGB", (4, 4), (250, 10, 10)).save(buf, format="PNG", pnginfo=info)
    path.write_bytes(buf.getvalue())
    return buf.getvalue()


async def test_unchecked_outputs_are_checked_checked_ones_and_inputs_served_as_is(
    aiohttp_client: Any, tmp_path: Path
) -> None:
    parts = make_parts(tmp_path)
    guard = BlackOutGuard()
    parts.executor.image_guard = guard
    client = await aiohttp_client(create_app(parts, ServerConfig()))
    unchecked = write_png(parts.folders.output_dir / "old.png", checked=False)
    checked = write_png(parts.folders.output_dir / "new.png", checked=True)
    upload = write_png(parts.folders.input_dir / "mine.png", checked=False)

    resp = await client.get("/view", params={"filename": "old.png", "type": "output"})
    assert resp.status == 200 and await resp.read() == BLACK.getvalue() != unchecked
    resp = await client.get("/view", params={"filename": "new.png", "type": "output"})
    assert await resp.read() == checked
    resp = await client.get("/view", params={"filename": "mine.png", "type": "input"})
    assert await resp.read() == upload
    assert guard.checked == 1
