"""Security: bind policy, token, Host/Origin checks, path traversal, symlinks, upload limits."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient

from engine.server.app import ServerParts, create_app
from engine.server.common import ApiError, ServerConfig
from engine.server.security import InsecureBindError, check_bind, safe_path
from nodes.bench.stubs.server_nodes import png_bytes, workflow


def form(data: bytes, name: str = "x.png", **fields: str) -> aiohttp.FormData:
    body = aiohttp.FormData()
    body.add_field("image", data, filename=name, content_type="image/png")
    for key, value in fields.items():
        body.add_field(key, value)
    return body


def test_bind_policy() -> None:
    check_bind(ServerConfig(host="127.0.0.1"))
    check_bind(ServerConfig(host="::1"))
    check_bind(ServerConfig(host="0.0.0.0", token="s3cret"))
    check_bind(ServerConfig(host="0.0.0.0", insecure=True))
    with pytest.raises(InsecureBindError, match="--token"):
        check_bind(ServerConfig(host="0.0.0.0"))
    with pytest.raises(InsecureBindError):
        check_bind(ServerConfig(host="192.168.1.20"))


def test_serve_main_refuses_open_bind(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from engine.server.app import serve_main

    def never(args: Any) -> Any:
        raise AssertionError("must refuse before building anything")

    args = argparse.Namespace(host="0.0.0.0", port=0, token=None, insecure=False, user_dir=tmp_path)
    assert serve_main(args, never, tmp_path) == 2
    assert "refusing to listen on 0.0.0.0" in capsys.readouterr().err


def test_safe_path(tmp_path: Path) -> None:
    base = tmp_path / "base"
    base.mkdir()
    assert safe_path(base, "a", "b.png") == base / "a" / "b.png"
    for bad in ("../x", "a/../../x", "/etc/passwd", "..\\x", "C:\\x", "a\x00b"):
        with pytest.raises(ApiError):
            safe_path(base, bad)
    (base / "out").symlink_to(tmp_path)
    with pytest.raises(ApiError) as info:
        safe_path(base, "out", "secret")
    assert info.value.status == 403


async def test_view_refuses_traversal(client: TestClient, parts: ServerParts, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("top secret")
    (parts.folders.output_dir / "x.png").write_bytes(png_bytes(1))
    attempts = [
        {"filename": "../secret.txt"},
        {"filename": "secret.txt", "subfolder": ".."},
        {"filename": str(secret)},
        {"filename": "secret.txt", "subfolder": str(tmp_path)},
        {"filename": "x.png", "subfolder": "../output"},
        {"filename": "..%2Fsecret.txt"},
    ]
    for params in attempts:
        resp = await client.get("/view", params={"type": "output", **params})
        assert 400 <= resp.status < 500, params
        assert "top secret" not in await resp.text()
    os.symlink(secret, parts.folders.output_dir / "link.txt")
    resp = await client.get("/view", params={"filename": "link.txt"})
    assert resp.status == 403
    os.symlink(tmp_path, parts.folders.output_dir / "dirlink")
    resp = await client.get("/view", params={"filename": "secret.txt", "subfolder": "dirlink"})
    assert resp.status == 403


async def test_upload_refuses_traversal_and_bad_files(
    client: TestClient, parts: ServerParts, tmp_path: Path
) -> None:
    for fields in ({"subfolder": "../../escape"}, {"subfolder": "/tmp"}, {"type": "models"}):
        resp = await client.post("/upload/image", data=form(png_bytes(1), **fields))
        assert resp.status == 400, fields
    resp = await client.post("/upload/image", data=form(png_bytes(1), name="../../evil.png"))
    name = (await resp.json())["name"]
    assert resp.status == 200 and "/" not in name and (parts.folders.input_dir / name).is_file()
    assert not (tmp_path / "evil.png").exists()
    os.symlink(tmp_path, parts.folders.input_dir / "out")
    assert (await client.post("/upload/image", data=form(png_bytes(1), subfolder="out"))).status == 403
    not_image = await client.post("/upload/image", data=form(b"#!/bin/sh\necho hi\n", name="x.png"))
    assert not_image.status == 400 and (await not_image.json())["error"]["type"] == "not_an_image"
    truncated = await client.post("/upload/image", data=form(png_bytes(1)[:30]))
    assert truncated.status == 400
    big = await client.post("/upload/image", data=form(b"\x89PNG" + b"\x00" * (300 * 1024)))
    assert big.status == 413 and "error" in await big.json()
    no_file = aiohttp.FormData()
    no_file.add_field("other", "x")
    assert (await client.post("/upload/image", data=no_file)).status == 400
    assert (await client.post("/upload/image", data=b"raw")).status == 400


async def test_userdata_refuses_traversal(client: TestClient, parts: ServerParts, tmp_path: Path) -> None:
    (tmp_path / "outside.json").write_text("{}")
    for name in (
        "..%2F..%2Foutside.json",
        "%2Fetc%2Fpasswd",
        "a%2F..%2F..%2Foutside.json",
        "%2E%2E%2Foutside.json",
    ):
        assert 400 <= (await client.get(f"/userdata/{name}")).status < 500, name
        assert 400 <= (await client.post(f"/userdata/{name}", data=b"x")).status < 500, name
    assert (await client.get("/userdata?dir=..")).status == 400
    assert (await client.post("/userdata/a.json/move/..%2F..%2Fb.json")).status in (400, 404)
    os.symlink(tmp_path, parts.user_dir / "default" / "link")
    assert (await client.get("/userdata/link%2Foutside.json")).status == 403
    assert (await client.post("/userdata/link%2Fnew.json", data=b"{}")).status == 403
    assert not (tmp_path / "new.json").exists()


async def test_cross_origin_refused(client: TestClient) -> None:
    evil = {"Origin": "http://evil.example"}
    resp = await client.post("/prompt", json={"prompt": workflow(1)}, headers=evil)
    assert resp.status == 403 and (await resp.json())["error"]["type"] == "cross_origin"
    assert await (await client.get("/queue")).json() == {"queue_running": [], "queue_pending": []}
    assert (await client.post("/api/v1/jobs", json={"workflow": workflow(1)}, headers=evil)).status == 403
    assert (await client.get("/view", params={"filename": "x"}, headers=evil)).status == 403
    assert (await client.get("/userdata?dir=workflows", headers=evil)).status == 403
    assert (await client.post("/upload/image", data=form(png_bytes(1)), headers=evil)).status == 403
    assert (await client.post("/prompt", json={}, headers={"Origin": "null"})).status == 403
    with pytest.raises(aiohttp.WSServerHandshakeError):
        await client.ws_connect("/ws", headers=evil)
    rebinding = {"Host": "evil.example:8188"}
    assert (await client.get("/queue", headers=rebinding)).status == 403
    own = {"Origin": f"http://127.0.0.1:{client.port}"}
    assert (await client.post("/prompt", json={"prompt": workflow(1)}, headers=own)).status == 200
    # a loopback page on another port is another origin (another local app, a dev server): refused
    port = int(client.port or 0)
    for other in ("http://localhost:9999", f"http://127.0.0.1:{port + 1}", f"https://127.0.0.1:{port}"):
        resp = await client.get("/queue", headers={"Origin": other})
        assert resp.status == 403, other
        assert "--allow-origin" in (await resp.json())["error"]["message"]
    fetch = {"Sec-Fetch-Site": "cross-site"}
    assert (await client.post("/interrupt", headers=fetch)).status == 403


async def test_token_required(aiohttp_client: Any, parts: ServerParts) -> None:
    config = ServerConfig(host="0.0.0.0", token="s3cret")
    client = await aiohttp_client(create_app(parts, config))
    assert (await client.get("/queue")).status == 401
    assert (await client.get("/queue", headers={"Authorization": "Bearer wrong"})).status == 401
    assert (await client.get("/queue", headers={"Authorization": "Bearer s3cret"})).status == 200
    assert (await client.get("/queue?token=s3cret")).status == 200
    # the ?token= visit set a cookie, so the editor's later requests pass
    assert (await client.get("/queue")).status == 200
    client.session.cookie_jar.clear()
    with pytest.raises(aiohttp.WSServerHandshakeError):
        await client.ws_connect("/ws")
    ws = await client.ws_connect("/ws?token=s3cret")
    assert (await ws.receive_json())["type"] == "status"
    await ws.close()


async def test_unknown_routes_and_methods_are_json(client: TestClient) -> None:
    for method, path in (
        ("GET", "/api/nothing"),
        ("DELETE", "/prompt"),
        ("PUT", "/queue"),
        ("GET", "/nothing"),
    ):
        resp = await client.request(method, path)
        assert 400 <= resp.status < 500, (method, path)
        assert "error" in await resp.json()


async def test_allowed_origins_option(aiohttp_client: Any, parts: ServerParts) -> None:
    config = ServerConfig(allowed_origins=("http://localhost:3000",))
    client = await aiohttp_client(create_app(parts, config))
    assert (await client.get("/queue", headers={"Origin": "http://localhost:3000"})).status == 200
    assert (await client.get("/queue", headers={"Origin": "http://localhost:3001"})).status == 403
    assert (await client.get("/queue", headers={"Origin": f"http://127.0.0.1:{client.port}"})).status == 200


async def test_host_refusal_names_an_option_that_exists(client: TestClient) -> None:
    import main

    resp = await client.get("/queue", headers={"Host": "evil.example:8188"})
    message = (await resp.json())["error"]["message"]
    assert "--allow-host evil.example" in message
    args = main.make_parser().parse_args(
        ["serve", "--allow-host", "evil.example", "--allow-origin", "http://x:1"]
    )
    assert args.allowed_host == ["evil.example"] and args.allowed_origin == ["http://x:1"]
