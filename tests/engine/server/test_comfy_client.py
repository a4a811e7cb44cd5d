"""A client written against ComfyUI's documented API (the websocket example in ComfyUI's
script_examples): queue with POST /prompt, wait on /ws for ``executing`` with node null, read
/history/{id}, download every image with /view. It talks to a real TCP server, as it would to ComfyUI."""

from __future__ import annotations

import asyncio
import io
import json
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import aiohttp
from aiohttp.test_utils import TestServer
from PIL import Image

from engine.server.app import create_app
from engine.server.common import ServerConfig
from nodes.bench.stubs.server_nodes import workflow
from tests.engine.server.conftest import make_parts


class ComfyStyleClient:
    """Only what ComfyUI's documentation shows; nothing Loom-specific."""

    def __init__(self, server_address: str) -> None:
        self.server_address = server_address
        self.client_id = str(uuid.uuid4())

    def queue_prompt(self, prompt: dict) -> dict:
        data = json.dumps({"prompt": prompt, "client_id": self.client_id}).encode("utf-8")
        req = urllib.request.Request(f"http://{self.server_address}/prompt", data=data)
        return json.loads(urllib.request.urlopen(req).read())

    def get_image(self, filename: str, subfolder: str, folder_type: str) -> bytes:
        url_values = urllib.parse.urlencode(
            {"filename": filename, "subfolder": subfolder, "type": folder_type}
        )
        with urllib.request.urlopen(f"http://{self.server_address}/view?{url_values}") as response:
            return response.read()

    def get_history(self, prompt_id: str) -> dict:
        with urllib.request.urlopen(f"http://{self.server_address}/history/{prompt_id}") as response:
            return json.loads(response.read())

    async def get_images(self, ws: aiohttp.ClientWebSocketResponse, prompt: dict) -> dict[str, list[bytes]]:
        prompt_id = self.queue_prompt(prompt)["prompt_id"]
        while True:
            out = await ws.receive(timeout=30)
            if out.type == aiohttp.WSMsgType.TEXT:
                message = json.loads(out.data)
                if message["type"] == "executing":
                    data = message["data"]
                    if data["node"] is None and data["prompt_id"] == prompt_id:
                        break  # execution is done
            # binary previews are skipped
        history = self.get_history(prompt_id)[prompt_id]
        images: dict[str, list[bytes]] = {}
        for node_id, node_output in history["outputs"].items():
            if "images" in node_output:
                images[node_id] = [
                    self.get_image(i["filename"], i["subfolder"], i["type"]) for i in node_output["images"]
                ]
        return images


async def test_comfy_documented_client_works_unchanged(tmp_path: Path) -> None:
    app = create_app(make_parts(tmp_path), ServerConfig())
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    address = f"127.0.0.1:{server.port}"

    async def client_main() -> dict[str, list[bytes]]:
        client = ComfyStyleClient(address)
        async with aiohttp.ClientSession() as session:
            async with session.ws_connect(f"ws://{address}/ws?clientId={client.client_id}") as ws:
                return await client.get_images(ws, workflow(11, steps=3, previews=True))

    try:
        # The client blocks (urllib), as ComfyUI's example does: give it its own thread and loop.
        images = await asyncio.to_thread(asyncio.run, client_main())
    finally:
        await server.close()
    assert list(images) == ["3"]
    (png,) = images["3"]
    with Image.open(io.BytesIO(png)) as img:
        assert img.size == (8, 8)
