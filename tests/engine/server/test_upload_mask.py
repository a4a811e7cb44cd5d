"""``POST /upload/mask`` with a hostile or unlucky ``original_ref``: a clear 400 naming what is wrong,
never a 500 (each case below was one; the ``client`` fixture fails the test on any 500)."""

from __future__ import annotations

import io
import json
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient
from PIL import Image

from engine.server.app import ServerParts
from nodes.bench.stubs.server_nodes import png_bytes


def mask_form(original_ref: str) -> aiohttp.FormData:
    buffer = io.BytesIO()
    Image.new("RGBA", (16, 16), (0, 0, 0, 255)).save(buffer, format="PNG")
    body = aiohttp.FormData()
    body.add_field("image", buffer.getvalue(), filename="mask.png", content_type="image/png")
    body.add_field("original_ref", original_ref)
    return body


async def post_mask(client: TestClient, original_ref: str) -> tuple[int, dict[str, Any]]:
    resp = await client.post("/upload/mask", data=mask_form(original_ref))
    return resp.status, await resp.json()


@pytest.mark.parametrize(
    "ref, phrase",
    [
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ('{"filename": "base.png", "subfolder": ' + "[" * 5000 + "]" * 5000 + "}", "nested too deeply"),
        (json.dumps({"filename": "base.png", "type": ["input"]}), "type must be a string"),
        (json.dumps({"filename": "base.png", "type": 5}), "type must be a string"),
        (json.dumps({"filename": "base.png", "type": "models"}), "type must be one of input, output, temp"),
        (json.dumps({"filename": "base.png", "subfolder": ["a"]}), "subfolder must be a string"),
        (json.dumps({"filename": ["base.png"]}), "must name the original image's filename"),
        (json.dumps({"filename": ""}), "must name the original image's filename"),
    ],
    ids=[
        "deep list",
        "deep subfolder",
        "type list",
        "type number",
        "type unknown",
        "subfolder list",
        "filename list",
        "no name",
    ],
)
async def test_a_malformed_original_ref_is_a_400_that_says_what_it_should_be(
    client: TestClient, parts: ServerParts, ref: str, phrase: str
) -> None:
    (parts.folders.input_dir / "base.png").write_bytes(png_bytes(1, size=16))
    status, body = await post_mask(client, ref)
    assert status == 400, body
    assert phrase in body["error"]["message"]


@pytest.mark.parametrize(
    "name, content",
    [
        ("noise.latent", b"\x10\x00\x00\x00\x00\x00\x00\x00" + b'{"latent_tensor": {}}' + b"\0" * 64),
        ("truncated.png", png_bytes(2, size=16)[:60]),
        ("empty.png", b""),
    ],
    ids=["latent", "truncated png", "empty"],
)
async def test_an_original_that_is_not_a_readable_image_is_a_400(
    client: TestClient, parts: ServerParts, name: str, content: bytes
) -> None:
    (parts.folders.input_dir / name).write_bytes(content)
    status, body = await post_mask(client, json.dumps({"filename": name, "type": "input"}))
    assert status == 400, body
    assert body["error"]["type"] == "original_not_an_image"
    assert name in body["error"]["message"] and "not an image" in body["error"]["message"]
