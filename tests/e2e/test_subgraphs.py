"""Subgraphs in a real browser: convert a selection, the prompt is the flat one under the server's
"instance:inner" ids and makes the same image; open it (breadcrumb), edit inside, back out; a second
instance of the same definition; ComfyUI's UI format (definitions.subgraphs) round-trips and the
server flattens it to the editor's prompt; unpack."""

from __future__ import annotations

import io
import json
import urllib.request

import numpy as np
import pytest
from PIL import Image

from tests.e2e.conftest import Editor, Server

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def strip(prompt: dict) -> dict:
    return {k: {"class_type": v["class_type"], "inputs": v["inputs"]} for k, v in prompt.items()}


def image_after(editor: Editor, server: Server, before: str | None) -> tuple[np.ndarray, str]:
    editor.page.click('[data-action="queue"]')
    editor.page.wait_for_function(
        "(old) => [...document.querySelectorAll('.node[data-node-type=SaveImage] img.node-image')].some(i => i.getAttribute('src') !== old && i.complete && i.naturalWidth)",
        arg=before or "",
        timeout=120_000,
    )
    src = editor.page.locator(".node[data-node-type=SaveImage] img.node-image").first.get_attribute("src")
    return np.asarray(
        Image.open(io.BytesIO(server.get_bytes(src if src.startswith("/") else "/" + src)))
    ), src


def server_convert(server: Server, ui: dict) -> dict:
    req = urllib.request.Request(
        server.url + "/api/v1/workflows/convert",
        data=json.dumps(ui).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as res:
        body = json.loads(res.read())
    return body.get("prompt", body)


def test_convert_open_edit_instances_round_trip_unpack(editor: Editor, server: Server) -> None:
    editor.open()
    page = editor.page
    page.evaluate("loom.tabs.current.graph.nodes.get('3').control.seed = 'fixed'")
    flat = strip(editor.prompt())
    flat_image, src = image_after(editor, server, None)

    # convert the two prompts into a subgraph
    page.evaluate("loom.editor.select(['6', '7'])")
    editor.node("6").locator(".node-title").click(button="right")
    page.locator('.context-menu .menu-item[data-menu="Convert to subgraph"]').click()
    instance = page.locator(".node.subgraph-instance")
    assert instance.count() == 1 and editor.node("6").count() == 0
    inst = instance.get_attribute("data-node-id")
    rename = {"6": f"{inst}:6", "7": f"{inst}:7"}
    expected = {}
    for k, v in flat.items():
        inputs = {
            n: ([rename.get(x[0], x[0]), x[1]] if isinstance(x, list) else x) for n, x in v["inputs"].items()
        }
        expected[rename.get(k, k)] = {"class_type": v["class_type"], "inputs": inputs}
    assert strip(editor.prompt()) == expected
    ui = page.evaluate("(async () => (await import('./js/uiformat.js')).toUi(loom.tabs.current.graph))()")
    assert (
        len(ui["definitions"]["subgraphs"]) == 1
        and ui["definitions"]["subgraphs"][0]["inputs"][0]["type"] == "CLIP"
    )
    assert strip(server_convert(server, ui)) == expected  # the server's flattening agrees
    assert strip(server_convert(server, editor.saved())) == expected  # Loom's saved file runs as queued
    prefix = editor.node("9").locator('[data-widget="filename_prefix"]')
    prefix.fill(
        "subgraph"
    )  # a new file (the rest may come from the server's cache: same inputs, same result)
    prefix.press("Tab")
    sub_image, src = image_after(editor, server, src)
    assert np.array_equal(sub_image, flat_image)
    editor.shot("subgraph-instance")

    # open it, edit inside, come back out through the breadcrumb
    instance.locator('[data-action="open-subgraph"]').click()
    crumbs = page.locator('[data-role="breadcrumb"] .crumb')
    assert crumbs.count() == 2
    assert (
        editor.node("6").count() == 1 and editor.node("-10").count() == 1 and editor.node("-20").count() == 1
    )
    text = editor.node("6").locator('[data-widget="text"]')
    text.fill("a red fox in the snow")
    text.press("Tab")
    editor.shot("subgraph-inside")
    crumbs.first.click()
    assert page.locator('[data-role="breadcrumb"]').is_hidden()
    assert editor.prompt()[f"{inst}:6"]["inputs"]["text"] == "a red fox in the snow"
    # a second instance of the same definition
    page.evaluate(f"loom.editor.select(['{inst}'])")
    page.keyboard.press("Control+c")
    page.mouse.move(700, 760)
    page.keyboard.press("Control+v")
    assert page.locator(".node.subgraph-instance").count() == 2
    second = page.evaluate("[...loom.editor.selection][0]")
    assert editor.prompt()[f"{second}:6"]["inputs"]["text"] == "a red fox in the snow"
    editor.drag(editor.port(editor.node("4"), "CLIP", "out"), editor.port(editor.node(second), "clip", "in"))
    assert editor.prompt()[f"{second}:7"]["inputs"]["clip"] == ["4", 1]

    # an instance pasted into another tab brings its definition along
    page.click('[data-action="new-tab"]')
    page.mouse.move(500, 400)
    page.keyboard.press("Control+v")
    pasted = page.locator(".node.subgraph-instance")
    assert pasted.count() == 1
    pid = pasted.get_attribute("data-node-id")
    assert editor.prompt()[f"{pid}:6"]["inputs"]["text"] == "a red fox in the snow"
    page.locator('[data-role="tabs"] .tab .tab-name').first.click()

    # ComfyUI's UI format: out and back in, the same prompt; the server flattens it the same way
    prompt = strip(editor.prompt())
    ui = page.evaluate("(async () => (await import('./js/uiformat.js')).toUi(loom.tabs.current.graph))()")
    assert sum(1 for n in ui["nodes"] if n["type"] == ui["definitions"]["subgraphs"][0]["id"]) == 2
    assert strip(server_convert(server, ui)) == prompt
    page.evaluate("(ui) => loom.workflows.loadObject(ui, 'subgraph round trip')", ui)
    page.wait_for_function("loom.tabs.current.name === 'subgraph round trip'")
    assert strip(editor.prompt()) == prompt
    assert page.locator(".node.subgraph-instance").count() == 2

    # unpack the first: its nodes come back, wired as before; the other instance stays
    editor.node(inst).locator(".node-title").click(button="right")
    page.locator('.context-menu .menu-item[data-menu="Unpack subgraph"]').click()
    assert page.locator(".node.subgraph-instance").count() == 1
    assert page.locator('.node[data-node-type="CLIPTextEncode"]').count() == 2
    after = strip(editor.prompt())
    texts = sorted(
        v["inputs"]["text"] for k, v in after.items() if v["class_type"] == "CLIPTextEncode" and ":" not in k
    )
    assert texts == sorted(["a red fox in the snow", flat["7"]["inputs"]["text"]])
    ks = after["3"]["inputs"]
    assert (
        ":" not in ks["positive"][0] and after[ks["positive"][0]]["inputs"]["text"] == "a red fox in the snow"
    )

    # inside, link the input node's "+" slot to a widget: the instance gets that widget, with its value
    editor.node(second).locator('[data-action="open-subgraph"]').click()
    editor.drag(editor.port(editor.node("-10"), "+", "out"), editor.port(editor.node("6"), "text", "in"))
    assert editor.port(editor.node("-10"), "text", "out").count() == 1
    page.locator('[data-role="breadcrumb"] .crumb').first.click()
    widget = editor.node(second).locator('[data-widget="text"]')
    assert widget.input_value() == "a red fox in the snow"
    widget.fill("a blue bird")
    widget.press("Tab")
    prompt = strip(editor.prompt())
    assert prompt[f"{second}:6"]["inputs"]["text"] == "a blue bird"
    ui = page.evaluate("(async () => (await import('./js/uiformat.js')).toUi(loom.tabs.current.graph))()")
    assert strip(server_convert(server, ui)) == prompt
    editor.shot("subgraph-promoted-widget")
