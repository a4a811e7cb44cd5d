"""Websocket events of expanded nodes carry ComfyUI's ``display_node`` (the workflow node shown)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient

from engine.context import NodeContext
from engine.expansion import GraphBuilder
from engine.node import Node, NodeOutput
from engine.schema import INT, Input, NodeSchema, Output
from engine.server.app import ServerParts, create_app
from engine.server.common import ServerConfig
from nodes.bench.stubs.server_nodes import make_parts
from tests.engine.server.conftest import receive_json, wait_done


class SaveTwice(Node):
    """Expands into StubNumber -> StubSave (an output node inside the expansion)."""

    SCHEMA = NodeSchema(
        node_id="SaveTwice",
        display_name="Save twice",
        category="test",
        description="expands into a number and a save",
        inputs=(Input("value", INT, "the number", default=1, min=0, max=100),),
        outputs=(Output("INT", INT, "the number"),),
        output_node=True,
    )

    def run(self, ctx: NodeContext, *, value: int) -> NodeOutput:
        graph = GraphBuilder(ctx.expansion_prefix())
        number = graph.node("StubNumber", value=value)
        graph.node("StubSave", value=number.out(0), filename_prefix="exp")
        return NodeOutput((number.out(0),), expand=graph.finalize())


async def test_expanded_nodes_report_their_display_node(aiohttp_client: Any, tmp_path: Path) -> None:
    parts: ServerParts = make_parts(tmp_path)
    parts.registry.register(SaveTwice)
    client: TestClient = await aiohttp_client(create_app(parts, ServerConfig()))
    ws = await client.ws_connect("/ws?clientId=e")
    await receive_json(ws)
    prompt = {"7": {"class_type": "SaveTwice", "inputs": {"value": 3}}}
    body = await (await client.post("/prompt", json={"prompt": prompt, "client_id": "e"})).json()
    assert "prompt_id" in body, body
    msgs = await wait_done(ws, body["prompt_id"])
    executing = {m["data"]["node"]: m["data"] for m in msgs if m["type"] == "executing" and m["data"]["node"]}
    assert executing["7"]["display_node"] == "7"
    assert executing["7.0.0.2"]["display_node"] == "7" and executing["7.0.0.1"]["display_node"] == "7"
    executed = [m["data"] for m in msgs if m["type"] == "executed"]
    assert [(e["node"], e["display_node"]) for e in executed] == [("7.0.0.2", "7")]
    assert not [m for m in msgs if m["type"] == "execution_error"]
    await ws.close()
