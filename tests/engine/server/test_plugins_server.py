"""Plugins through the server: listing, pack routes, send_sync over the websocket, web extensions."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient

from engine.server.app import ServerParts, create_app
from engine.server.common import ServerConfig
from engine.server.security import ERRORS
from nodes.compat.shim import load_plugins_with_shim
from nodes.text.primitives import NODES as UTILITY_NODES
from tests.engine.server.conftest import make_parts, receive_json, wait_done

PACKS = Path(__file__).resolve().parents[1] / "plugins" / "packs"


def plugin_parts(root: Path) -> ServerParts:
    parts = make_parts(root)
    parts.registry.register_all(UTILITY_NODES)
    pack_dir = root / "packs"
    pack_dir.mkdir()
    for name in ("comfy_output_node", "comfy_web", "broken_import"):
        (pack_dir / name).symlink_to(PACKS / name, target_is_directory=True)
    report = load_plugins_with_shim(parts.registry, [pack_dir], parts.folders)
    parts.plugins = report
    parts.extensions = report.web_directories()
    return parts


async def test_plugins_listing_routes_messages_and_extensions(aiohttp_client: Any, tmp_path: Path) -> None:
    parts = plugin_parts(tmp_path)
    app = create_app(parts, ServerConfig())
    client: TestClient = await aiohttp_client(app)

    listing = await (await client.get("/api/v1/plugins")).json()
    by_name = {p["name"]: p for p in listing["packs"]}
    assert (
        by_name["comfy_output_node"]["ok"] and "OutputPack_ShowText" in by_name["comfy_output_node"]["nodes"]
    )
    assert not by_name["broken_import"]["ok"] and by_name["broken_import"]["error"]

    assert (await (await client.get("/output_node_pack/ping")).json()) == {"pong": True}
    info = await (await client.get("/object_info/OutputPack_ShowText")).json()
    assert info["OutputPack_ShowText"]["output_node"] is True
    extensions = await (await client.get("/extensions")).json()
    assert any(url.endswith("hello.js") for url in extensions)
    js = await client.get(next(url for url in extensions if url.endswith("hello.js")))
    assert js.status == 200

    client_id = uuid.uuid4().hex
    ws = await client.ws_connect(f"/ws?clientId={client_id}")
    await receive_json(ws)  # status
    prompt = {
        "1": {"class_type": "PrimitiveString", "inputs": {"value": "from a plugin"}},
        "2": {"class_type": "OutputPack_ShowText", "inputs": {"text": ["1", 0]}},
    }
    resp = await client.post("/prompt", json={"prompt": prompt, "client_id": client_id})
    assert resp.status == 200, await resp.text()
    prompt_id = (await resp.json())["prompt_id"]
    seen = await wait_done(ws, prompt_id)
    custom = [m for m in seen if m["type"] == "output_pack.shown"]
    assert custom and custom[0]["data"] == {"node": "2", "text": "from a plugin"}
    executed = [m for m in seen if m["type"] == "executed"]
    assert executed[0]["data"]["output"] == {"text": ["from a plugin"]}
    await ws.close()
    assert app[ERRORS].count == 0


ON_PROMPT_PACK = """
from server import PromptServer


def rewrite(json_data):
    for node in json_data["prompt"].values():
        if node["class_type"] == "PrimitiveString":
            node["inputs"]["value"] = node["inputs"]["value"].upper()
    return json_data


PromptServer.instance.add_on_prompt_handler(rewrite)
NODE_CLASS_MAPPINGS = {}
"""


async def test_a_packs_on_prompt_handler_rewrites_what_post_prompt_queues(
    aiohttp_client: Any, tmp_path: Path
) -> None:
    """``PromptServer.instance.add_on_prompt_handler`` runs on every ``POST /prompt`` body, as in
    ComfyUI (rgthree and use-everywhere rewrite prompts there)."""
    parts = plugin_parts(tmp_path)
    pack = tmp_path / "own_packs" / "on_prompt_pack"
    pack.mkdir(parents=True)
    (pack / "__init__.py").write_text(ON_PROMPT_PACK)
    parts.plugins = load_plugins_with_shim(parts.registry, [pack.parent], parts.folders)
    client: TestClient = await aiohttp_client(create_app(parts, ServerConfig()))
    client_id = uuid.uuid4().hex
    ws = await client.ws_connect(f"/ws?clientId={client_id}")
    await receive_json(ws)  # status
    prompt = {
        "1": {"class_type": "PrimitiveString", "inputs": {"value": "quiet"}},
        "2": {"class_type": "OutputPack_ShowText", "inputs": {"text": ["1", 0]}},
    }
    resp = await client.post("/prompt", json={"prompt": prompt, "client_id": client_id})
    assert resp.status == 200, await resp.text()
    seen = await wait_done(ws, (await resp.json())["prompt_id"])
    executed = [m for m in seen if m["type"] == "executed"]
    assert executed[0]["data"]["output"] == {"text": ["QUIET"]}
    await ws.close()
