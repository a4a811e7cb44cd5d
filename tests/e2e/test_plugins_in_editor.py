"""Plugin nodes (native and ComfyUI-style packs) appear in the editor's search; broken packs
are reported by the server without harming the editor."""

from __future__ import annotations

import json

import pytest

from tests.e2e.conftest import Editor


def test_plugin_nodes_are_found_by_search(editor: Editor) -> None:
    if editor.server.kind != "real":
        pytest.skip("needs the real server with plugin packs")
    editor.open()
    editor.page.click('[data-action="new-tab"]')  # an empty canvas
    native = editor.add_node("ExamplePack_WordCount", 300, 200, query="word count")
    comfy = editor.add_node("TextTools_Repeat", 300, 420, query="repeat text")
    assert native.get_attribute("data-node-type") == "ExamplePack_WordCount"
    assert comfy.get_attribute("data-node-type") == "TextTools_Repeat"
    plugins = json.loads(editor.server.get_bytes("/api/v1/plugins"))
    by_name = {p["name"]: p for p in plugins["packs"]}
    assert by_name["example_pack"]["ok"] and by_name["comfy_text_tools"]["ok"]
    assert not by_name["broken_import"]["ok"] and by_name["broken_import"]["error"]
    editor.shot("plugin-nodes")
