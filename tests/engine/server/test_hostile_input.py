"""Never a 5xx, never invalid JSON, never a lost upload (issue 19, items 6 and 7).

Each case was a 500, a dropped connection, a bare ``NaN`` in a response or an overwritten upload."""

from __future__ import annotations

import asyncio
import io
import json
import random
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient
from PIL import Image

from engine.executor import RunResult
from engine.jobs.records import JobRecord
from engine.jobs.spec import JobSpec
from engine.server.app import ServerParts
from nodes.bench.stubs.server_nodes import png_bytes, workflow

LONG = "n" * 300  # over the 255 bytes a file name may have


def strict(text: str) -> Any:
    """Parse as a browser does: a bare NaN or Infinity is an error."""

    def refuse(name: str) -> Any:
        raise AssertionError(f"the response is not strict JSON: it contains {name}")

    return json.loads(text, parse_constant=refuse)


def upload(data: bytes, name: str, **fields: str) -> aiohttp.FormData:
    body = aiohttp.FormData()
    body.add_field("image", data, filename=name, content_type="image/png")
    for key, value in fields.items():
        body.add_field(key, value)
    return body


def noise_png(seed: int, size: int = 250) -> bytes:
    buffer = io.BytesIO()
    Image.frombytes("RGB", (size, size), random.Random(seed).randbytes(size * size * 3)).save(
        buffer, format="PNG"
    )
    return buffer.getvalue()


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


# --- non-finite numbers -----------------------------------------------------------------------------
@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999"])
async def test_non_finite_numbers_are_refused_in_bodies(client: TestClient, literal: str) -> None:
    prompt = json.dumps({"prompt": workflow(1)}).replace('"delay": 0.0', f'"delay": {literal}')
    assert literal in prompt
    for route in ("/prompt", "/api/v1/jobs", "/settings", "/settings/Comfy.X"):
        resp = await client.post(
            route,
            data=prompt if route != "/api/v1/jobs" else prompt.replace('"prompt"', '"workflow"'),
            headers={"Content-Type": "application/json"},
        )
        assert resp.status == 400, (route, await resp.text())
        assert "finite" in (await resp.json())["error"]["message"]


async def test_non_finite_float_inputs_are_refused_at_validation(client: TestClient) -> None:
    prompt = workflow(1)
    prompt["2"]["inputs"]["delay"] = "nan"  # a string that float() would read as NaN
    resp = await client.post("/prompt", json={"prompt": prompt})
    assert resp.status == 400
    assert "finite" in json.dumps(await resp.json())


async def test_responses_are_strict_json_even_with_nan_in_stored_data(
    client: TestClient, parts: ServerParts
) -> None:
    spec = JobSpec(workflow(1), extra_data={"weird": float("nan")})
    result = RunResult(
        spec.prompt_id, "success", outputs={"3": {"score": [float("inf")]}}, timings={"total_s": float("nan")}
    )
    record = JobRecord(spec, result, started_at=1.0)
    parts.queue.store.finish(record)  # type: ignore[attr-defined]
    settings = parts.user_dir / "default" / "comfy.settings.json"
    settings.write_text('{"Comfy.Bad": NaN, "Comfy.Good": 1}')  # written by something else
    for path in (
        "/history",
        f"/history/{spec.prompt_id}",
        "/api/v1/jobs",
        f"/api/v1/jobs/{spec.prompt_id}",
        "/settings",
        "/settings/Comfy.Bad",
    ):
        resp = await client.get(path)
        assert resp.status == 200, path
        strict(await resp.text())
    assert strict(await (await client.get("/settings")).text()) == {"Comfy.Bad": None, "Comfy.Good": 1}


# --- nesting and huge numbers -------------------------------------------------------------------------
ROUTES = [
    "/prompt",
    "/api/v1/jobs",
    "/api/v1/workflows/convert",
    "/queue",
    "/history",
    "/interrupt",
    "/free",
    "/settings",
    "/settings/x",
    "/userdata/deep.json",
]


@pytest.mark.parametrize("depth", [100, 100_000])
async def test_deep_nesting_is_a_400_on_every_json_route(client: TestClient, depth: int) -> None:
    body = b'{"prompt": ' + nested(depth) + b"}"
    for route in ROUTES[:-1]:
        resp = await client.post(route, data=body, headers={"Content-Type": "application/json"})
        assert resp.status == 400, (route, resp.status)
        assert "deeper" in (await resp.json())["error"]["message"]


async def test_deep_nesting_on_the_websocket_is_ignored_and_it_stays_open(client: TestClient) -> None:
    ws = await client.ws_connect("/ws?clientId=deep")
    await ws.receive_json(timeout=5)  # status
    await ws.send_str(nested(100_000).decode())
    await ws.send_str(json.dumps({"type": "feature_flags", "data": {}}))
    reply = await ws.receive_json(timeout=5)
    assert reply["type"] == "feature_flags"
    await ws.close()


async def test_huge_integers_are_a_400(client: TestClient) -> None:
    resp = await client.post("/prompt", json={"prompt": workflow(1), "number": 10**400})
    assert resp.status == 400
    for query in ("max_items=1" + "0" * 40, "offset=1" + "0" * 40, "max_items=-1" + "0" * 40):
        resp = await client.get(f"/history?{query}")
        assert resp.status == 400, query
        assert "out of range" in (await resp.json())["error"]["message"]
    huge_input = workflow(10**30)
    assert (await client.post("/prompt", json={"prompt": huge_input})).status == 400


# --- names and files --------------------------------------------------------------------------------
async def test_over_long_names_are_a_400(client: TestClient) -> None:
    resp = await client.post("/upload/image", data=upload(png_bytes(1), LONG + ".png"))
    assert resp.status == 400 and (await resp.json())["error"]["type"] == "name_too_long"
    for method, path in (
        ("GET", f"/view?filename={LONG}.png"),
        ("POST", f"/userdata/{LONG}.json"),
        ("GET", f"/userdata/{LONG}.json"),
        ("GET", f"/userdata?dir={LONG}"),
        ("POST", f"/userdata/a.json/move/{LONG}.json"),
    ):
        resp = await client.request(method, path, data=b"{}")
        assert resp.status in (400, 404), (path, resp.status)
        assert "error" in await resp.json()


async def test_upload_named_like_a_folder_gets_another_name(client: TestClient, parts: ServerParts) -> None:
    (parts.folders.input_dir / "taken.png").mkdir()
    resp = await client.post("/upload/image", data=upload(png_bytes(1), "taken.png"))
    assert resp.status == 200
    assert (await resp.json())["name"] == "taken (1).png"
    forced = await client.post("/upload/image", data=upload(png_bytes(1), "taken.png", overwrite="true"))
    assert forced.status == 409


async def test_preview_of_an_oversized_image_is_a_413(
    client: TestClient, parts: ServerParts, monkeypatch: pytest.MonkeyPatch
) -> None:
    (parts.folders.output_dir / "big.png").write_bytes(png_bytes(1, size=64))
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)  # 64x64 is then a "decompression bomb"
    resp = await client.get("/view", params={"filename": "big.png", "preview": "webp;80"})
    assert resp.status == 413 and (await resp.json())["error"]["type"] == "image_too_large"


async def test_nul_in_a_multipart_header_is_a_400(client: TestClient) -> None:
    boundary = "XyZ"
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="image"; filename="a\x00b.png"\r\n'
            f"Content-Type: image/png\r\n\r\n"
        ).encode()
        + png_bytes(1)
        + f"\r\n--{boundary}--\r\n".encode()
    )
    resp = await client.post(
        "/upload/image", data=body, headers={"Content-Type": f"multipart/form-data; boundary={boundary}"}
    )
    assert resp.status == 400, await resp.text()
    assert (await resp.json())["error"]["type"] == "invalid_form"


async def test_userdata_writes_onto_folders_are_a_4xx(client: TestClient, parts: ServerParts) -> None:
    root = parts.user_dir / "default"
    (root / "workflows" / "folder.json").mkdir(parents=True)
    (root / "workflows" / "file.json").write_text("{}")
    cases = [
        ("POST", "/userdata/workflows%2Ffolder.json"),
        ("POST", "/userdata/workflows%2Ffile.json%2Finner.json"),
        ("POST", "/userdata/workflows%2Ffile.json/move/workflows%2Ffolder.json"),
        ("DELETE", "/userdata/workflows%2Ffolder.json"),
    ]
    for method, path in cases:
        resp = await client.request(method, path, data=b"{}")
        assert 400 <= resp.status < 500, (path, resp.status, await resp.text())
        assert "error" in await resp.json()
    assert (root / "workflows" / "file.json").read_text() == "{}"


async def test_upload_names_with_line_breaks_and_quotes_are_cleaned(
    client: TestClient, parts: ServerParts
) -> None:
    boundary = "XyZ"  # RFC 2231 filename*: percent-encoded CR LF and a quote in the name
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="image"; '
            "filename*=UTF-8''evil%0D%0AX-Injected%3A%201%22q.png\r\n"
            "Content-Type: image/png\r\n\r\n"
        ).encode()
        + png_bytes(1)
        + f"\r\n--{boundary}--\r\n".encode()
    )
    resp = await client.post(
        "/upload/image", data=body, headers={"Content-Type": f"multipart/form-data; boundary={boundary}"}
    )
    assert resp.status == 200, await resp.text()
    name = (await resp.json())["name"]
    assert "\n" not in name and "\r" not in name and '"' not in name
    view = await client.get("/view", params={"filename": name, "type": "input"})
    assert view.status == 200 and "X-Injected" not in view.headers


async def test_view_of_a_file_with_odd_characters_sends_an_encoded_disposition(
    client: TestClient, parts: ServerParts
) -> None:
    odd = 'line\nbreak "quoted" ünï.png'
    (parts.folders.output_dir / odd).write_bytes(png_bytes(2))
    view = await client.get("/view", params={"filename": odd})
    assert view.status == 200 and await view.read() == png_bytes(2)
    disposition = view.headers["Content-Disposition"]
    assert (
        "\n" not in disposition
        and "filename*=UTF-8''line%0Abreak%20%22quoted%22%20%C3%BCn%C3%AF.png" in disposition
    )


# --- item 7: concurrent uploads -------------------------------------------------------------------------
async def test_concurrent_uploads_of_one_name_keep_every_file(client: TestClient, parts: ServerParts) -> None:
    count = 24
    contents = [noise_png(seed) for seed in range(count)]  # ~190 KB each: writes overlap
    responses = await asyncio.gather(
        *(client.post("/upload/image", data=upload(c, "same.png")) for c in contents)
    )
    names = []
    for resp, content in zip(responses, contents, strict=True):
        assert resp.status == 200
        name = (await resp.json())["name"]
        names.append(name)
        assert (parts.folders.input_dir / name).read_bytes() == content  # each client got its own file
    assert len(set(names)) == count
    assert sorted(p.name for p in parts.folders.input_dir.iterdir()) == sorted(names)  # no temporary left


def test_a_full_output_disk_leaves_no_truncated_png(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    import torch

    from engine.context import Folders, NodeContext
    from nodes.image.load_save import save_images

    folders = Folders(tmp_path / "in", tmp_path / "out", tmp_path / "tmp")
    folders.ensure()
    real_open = builtins.open

    class HalfWritten(io.RawIOBase):
        def __init__(self, handle: Any) -> None:
            self.handle = handle

        def write(self, data: Any) -> int:
            self.handle.write(bytes(data)[: len(data) // 2])
            self.handle.flush()
            raise OSError(28, "No space left on device")

        def fileno(self) -> int:
            return int(self.handle.fileno())

        def close(self) -> None:
            self.handle.close()
            super().close()

    def full_disk_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        handle = real_open(file, mode, *args, **kwargs)
        if "w" in mode and str(file).startswith(str(folders.output_dir)):
            return HalfWritten(handle)
        return handle

    monkeypatch.setattr(builtins, "open", full_disk_open)
    monkeypatch.setattr(io, "open", full_disk_open)
    ctx = NodeContext(node_id="9", prompt_id="p", folders=folders)
    with pytest.raises(OSError, match="No space"):
        save_images(ctx, torch.rand(1, 8, 8, 3), folders.output_dir, "full", "output", None, 4)
    monkeypatch.undo()
    assert [p.name for p in folders.output_dir.rglob("*") if p.is_file()] == []
