"""A web extension written for ComfyUI's frontend (tests/engine/plugins/packs/comfy_web/js/color_note.js:
`app.registerExtension`, `beforeRegisterNodeDef`, `onNodeCreated`, `addDOMWidget`, `addWidget`,
`setSize`, `properties`, `onExecuted`, `onConnectionsChange`, `nodeCreated`, `api.addEventListener`)
works unchanged in Loom's editor; the extension that touches LiteGraph internals only warns, once."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import Editor

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_comfyui_extension_with_custom_widget_and_executed(editor: Editor) -> None:
    if editor.server.kind != "real":
        pytest.skip("needs the real server with plugin packs")
    warnings: list[str] = []
    editor.page.on("console", lambda m: warnings.append(m.text) if m.type == "warning" else None)
    editor.open()
    page = editor.page
    page.click('[data-action="new-tab"]')
    node = editor.add_node("WebPack_ColorNote", 400, 300, query="color note")
    nid = node.get_attribute("data-node-id")
    # onNodeCreated added a DOM widget and a text widget, and sized the node
    picker = node.locator('[data-ext-widget-row="picker"] input[type=color]')
    assert picker.count() == 1 and node.locator('[data-ext-widget-row="shown"]').count() == 1
    assert abs(node.bounding_box()["width"] - 300 * page.evaluate("loom.editor.canvas.zoom")) < 2
    # nodeCreated set a property, which is saved with the node
    assert editor.saved()["layout"]["nodes"][nid]["properties"]["madeBy"] == "webpack.ColorNote"
    # the picker writes the real widget through widget.value
    picker.evaluate("(p) => { p.value = '#00ff00'; p.dispatchEvent(new Event('input')); }")
    assert editor.prompt()[nid]["inputs"]["color"] == "#00ff00"
    assert node.locator('[data-widget="color"]').input_value() == "#00ff00"
    # onConnectionsChange: link an Echo output into the text input
    echo = editor.add_node("WebPack_Echo", 80, 300, query="WebPack_Echo")
    echo.locator('[data-widget="text"]').fill("hello")
    editor.drag(editor.port(echo, "STRING", "out"), editor.port(editor.node(nid), "text", "in"))
    assert (
        page.evaluate(f"loom.tabs.current.graph.nodes.get('{nid}').properties.lastConnection") == "1:0:true"
    )
    # executed → onExecuted fills the text widget; api.addEventListener saw it too
    page.click('[data-action="queue"]')
    page.wait_for_function("window.__webpackExecuted >= 1", timeout=60_000)
    shown = editor.node(nid).locator('[data-ext-widget-row="shown"] input')
    page.wait_for_function(
        f"document.querySelector('.node[data-node-id=\"{nid}\"] [data-ext-widget-row=shown] input').value !== ''"
    )
    assert shown.input_value() == "hello in #00ff00"
    assert editor.saved()["layout"]["nodes"][nid]["properties"]["runs"] == 1
    assert editor.saved()["layout"]["nodes"][nid]["ext_widgets"]["shown"] == "hello in #00ff00"
    editor.shot("comfy-extension")
    # the LiteGraph-using extension: exactly one warning, naming it; the editor still works
    named = [w for w in warnings if "webpack.UsesLiteGraph" in w]
    assert len(named) == 1, warnings
    assert not [w for w in warnings if "webpack.ColorNote" in w], warnings
    editor.add_node("WebPack_Echo", 80, 500, query="WebPack_Echo")
