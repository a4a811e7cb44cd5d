"""/view, /upload/image, /upload/mask, /userdata, /settings, /users with ComfyUI's shapes.

upload response: {"name": str, "subfolder": str, "type": "input"|"output"|"temp"}; a clash without
overwrite is renamed "name (1).png". /userdata?dir=D[&recurse][&split][&full_info] lists files
(split: [[path, *parts]]; full_info: [{"path", "size", "modified"}]).
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import aiohttp
from aiohttp.test_utils import TestClient
from PIL import Image

from engine.server.app import ServerParts
from nodes.bench.stubs.server_nodes import png_bytes


def form(data: bytes, name: str = "pic.png", **fields: str) -> aiohttp.FormData:
    body = aiohttp.FormData()
    body.add_field("image", data, filename=name, content_type="image/png")
    for key, value in fields.items():
        body.add_field(key, value)
    return body


async def test_upload_view_and_dedup(client: TestClient, parts: ServerParts) -> None:
    resp = await client.post("/upload/image", data=form(png_bytes(1)))
    assert resp.status == 200
    assert await resp.json() == {"name": "pic.png", "subfolder": "", "type": "input"}
    same = await (await client.post("/upload/image", data=form(png_bytes(1)))).json()
    assert same["name"] == "pic.png"  # identical content is reused
    other = await (await client.post("/upload/image", data=form(png_bytes(2)))).json()
    assert other["name"] == "pic (1).png"
    replaced = await (await client.post("/upload/image", data=form(png_bytes(3), overwrite="true"))).json()
    assert replaced["name"] == "pic.png"
    assert (parts.folders.input_dir / "pic.png").read_bytes() == png_bytes(3)
    sub = await (
        await client.post("/api/upload/image", data=form(png_bytes(4), subfolder="a/b", type="temp"))
    ).json()
    assert sub == {"name": "pic.png", "subfolder": "a/b", "type": "temp"}

    view = await client.get("/view", params={"filename": "pic.png", "type": "input"})
    assert view.status == 200 and await view.read() == png_bytes(3)
    view = await client.get("/api/view", params={"filename": "pic.png", "subfolder": "a/b", "type": "temp"})
    assert await view.read() == png_bytes(4)
    webp = await client.get("/view", params={"filename": "pic.png", "type": "input", "preview": "webp;50"})
    assert webp.content_type == "image/webp" and Image.open(io.BytesIO(await webp.read())).format == "WEBP"
    jpeg = await client.get("/view", params={"filename": "pic.png", "type": "input", "preview": "jpeg;90"})
    assert Image.open(io.BytesIO(await jpeg.read())).format == "JPEG"
    alpha = await client.get("/view", params={"filename": "pic.png", "type": "input", "channel": "a"})
    assert Image.open(io.BytesIO(await alpha.read())).mode == "RGBA"
    assert (await client.get("/view", params={"filename": "nope.png", "type": "input"})).status == 404
    assert (await client.get("/view")).status == 400
    assert (await client.get("/view", params={"filename": "pic.png", "type": "models"})).status == 400
    bad_preview = await client.get(
        "/view", params={"filename": "pic.png", "type": "input", "preview": "gif;9"}
    )
    assert bad_preview.status == 400


async def test_upload_mask(client: TestClient, parts: ServerParts) -> None:
    await client.post("/upload/image", data=form(png_bytes(5, size=16), name="base.png"))
    mask = Image.new("RGBA", (16, 16), (0, 0, 0, 0))
    mask.putpixel((0, 0), (0, 0, 0, 255))
    buffer = io.BytesIO()
    mask.save(buffer, format="PNG")
    ref = json.dumps({"filename": "base.png", "subfolder": "", "type": "input"})
    resp = await client.post(
        "/upload/mask",
        data=form(buffer.getvalue(), name="clipspace-mask.png", original_ref=ref, subfolder="clipspace"),
    )
    assert resp.status == 200
    body = await resp.json()
    assert body == {"name": "clipspace-mask.png", "subfolder": "clipspace", "type": "input"}
    merged = Image.open(parts.folders.input_dir / "clipspace" / "clipspace-mask.png")
    assert merged.mode == "RGBA" and merged.getpixel((0, 0))[3] == 255 and merged.getpixel((1, 1))[3] == 0
    missing = json.dumps({"filename": "nothing.png"})
    assert (
        await client.post("/upload/mask", data=form(buffer.getvalue(), original_ref=missing))
    ).status == 404
    assert (await client.post("/upload/mask", data=form(buffer.getvalue(), original_ref="{"))).status == 400
    small = io.BytesIO()
    Image.new("RGBA", (4, 4)).save(small, format="PNG")
    ref_ok = json.dumps({"filename": "base.png"})
    assert (await client.post("/upload/mask", data=form(small.getvalue(), original_ref=ref_ok))).status == 400


async def test_userdata_roundtrip(client: TestClient, parts: ServerParts) -> None:
    wf = {"format": "loom.workflow", "nodes": []}
    resp = await client.post("/userdata/workflows%2Ffirst.json", data=json.dumps(wf))
    assert resp.status == 200 and await resp.json() == "workflows/first.json"
    resp = await client.post("/api/userdata/workflows%2Fsub%2Fsecond.json?full_info=true", data=b"{}")
    info = await resp.json()
    assert info["path"] == "workflows/sub/second.json" and info["size"] == 2 and "modified" in info
    assert (await client.post("/userdata/workflows%2Ffirst.json?overwrite=false", data=b"{}")).status == 409
    got = await client.get("/userdata/workflows%2Ffirst.json")
    assert json.loads(await got.read()) == wf
    assert await (await client.get("/userdata?dir=workflows")).json() == ["first.json"]
    assert await (await client.get("/userdata?dir=workflows&recurse=true")).json() == [
        "first.json",
        "sub/second.json",
    ]
    split = await (await client.get("/userdata?dir=workflows&recurse=true&split=true")).json()
    assert split == [["first.json", "first.json"], ["sub/second.json", "sub", "second.json"]]
    full = await (await client.get("/userdata?dir=workflows&full_info=true")).json()
    assert full[0]["path"] == "first.json" and full[0]["size"] > 0
    assert (await client.get("/userdata")).status == 400
    assert (await client.get("/userdata?dir=nothing")).status == 404
    moved = await client.post("/userdata/workflows%2Ffirst.json/move/workflows%2Frenamed.json")
    assert moved.status == 200 and await moved.json() == "workflows/renamed.json"
    assert (await client.get("/userdata/workflows%2Ffirst.json")).status == 404
    assert (await client.delete("/userdata/workflows%2Frenamed.json")).status == 204
    assert (await client.delete("/userdata/workflows%2Frenamed.json")).status == 404
    assert (parts.user_dir / "default" / "workflows" / "sub" / "second.json").is_file()


async def test_settings_and_users(client: TestClient, parts: ServerParts) -> None:
    assert await (await client.get("/settings")).json() == {}
    assert (await client.post("/settings", json={"Comfy.Theme": "dark", "a": 1})).status == 200
    assert (await client.post("/api/settings/Comfy.Zoom", json=1.5)).status == 200
    assert await (await client.get("/settings")).json() == {"Comfy.Theme": "dark", "a": 1, "Comfy.Zoom": 1.5}
    assert await (await client.get("/settings/Comfy.Theme")).json() == "dark"
    assert await (await client.get("/settings/missing")).json() is None
    assert (await client.post("/settings", json=[1])).status == 400
    saved = json.loads((Path(parts.user_dir) / "default" / "comfy.settings.json").read_text())
    assert saved["Comfy.Zoom"] == 1.5
    assert await (await client.get("/users")).json() == {"storage": "server", "migrated": True}
    assert (await client.post("/users", json={"username": "x"})).status == 400


async def test_static_editor(client: TestClient) -> None:
    index = await client.get("/")
    assert index.status == 200 and "Loom" in await index.text()
    assert (await client.get("/index.html")).status == 200
    missing = await client.get("/missing.js")
    assert missing.status == 404 and "error" in await missing.json()


def mp4_bytes(tmp: Path) -> bytes:
    """A tiny real MP4 (2 frames, 16x16, H.264), written with PyAV."""
    import av  # lazy: PyAV only for the video upload tests

    path = tmp / "clip.mp4"
    with av.open(str(path), mode="w") as out:
        stream = out.add_stream("h264", rate=8)
        stream.width, stream.height, stream.pix_fmt = 16, 16, "yuv420p"
        for _ in range(2):
            out.mux(stream.encode(av.VideoFrame(16, 16, "yuv420p")))
        out.mux(stream.encode(None))
    return path.read_bytes()


async def test_a_video_upload_is_stored_as_comfyui_stores_it(
    client: TestClient, parts: ServerParts, tmp_path: Path
) -> None:
    data = mp4_bytes(tmp_path)
    resp = await client.post("/upload/image", data=form(data, "clip.mp4"))
    assert resp.status == 200 and await resp.json() == {"name": "clip.mp4", "subfolder": "", "type": "input"}
    assert (parts.folders.input_dir / "clip.mp4").read_bytes() == data
    view = await client.get("/view", params={"filename": "clip.mp4", "type": "input"})
    assert view.status == 200 and view.content_type == "video/mp4" and await view.read() == data


async def test_a_truncated_or_fake_video_upload_is_refused(
    client: TestClient, parts: ServerParts, tmp_path: Path
) -> None:
    data = mp4_bytes(tmp_path)
    for name, body in (("cut.mp4", data[: len(data) // 2]), ("fake.webm", b"not a video")):
        resp = await client.post("/upload/image", data=form(body, name))
        assert resp.status == 400
        error = await resp.json()
        assert "not_a_video" in json.dumps(error) and name in json.dumps(error)
        assert not (parts.folders.input_dir / name).exists()
