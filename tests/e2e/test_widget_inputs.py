"""Widgets as inputs in a real browser: every widget has an input slot; one PrimitiveNode drives the
seeds of two samplers (its widget takes the seed's shape, and only matching widgets accept it);
taking a link off gives the widget its own value back, also after a save and reload; ComfyUI's UI
format carries the PrimitiveNode, and the server reads it to the same prompt."""

from __future__ import annotations

import json
import urllib.request

import pytest

from tests.e2e.conftest import Editor

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_primitive_drives_two_seeds_and_unlinking_restores_values(editor: Editor, server) -> None:
    editor.open()
    page = editor.page
    # every widget of the sampler has its own input slot
    ks = editor.node("3")
    for name in ("seed", "steps", "cfg", "sampler_name", "scheduler", "denoise"):
        assert ks.locator(f'[data-widget-row="{name}"] .port[data-dir="in"][data-port="{name}"]').count() == 1
    ks.locator('[data-widget="seed"]').fill("777")
    ks.locator('[data-widget="seed"]').press("Enter")
    second = page.evaluate("loom.editor.addNode('KSampler', [700, 520]).id")
    page.evaluate("loom.editor.fitView()")
    ks2 = editor.node(second)
    ks2.locator('[data-widget="seed"]').fill("5")
    ks2.locator('[data-widget="seed"]').press("Enter")
    prim = editor.add_node("PrimitiveNode", 1000, 760, "primitive")
    pid = prim.get_attribute("data-node-id")
    assert prim.locator(".node-hint").count() == 1  # no shape before it feeds anything
    out = editor.port(prim, "connect to widget input", "out")
    editor.drag(out, editor.port(ks, "seed", "in"))
    # the primitive took the seed's shape and value; the sampler's seed row shows it is linked
    value = prim.locator('[data-widget="value"]')
    assert value.input_value() == "777"
    assert ks.locator('[data-widget-row="seed"].linked').count() == 1
    prim.locator('[data-widget-control="value"]').select_option("fixed")
    editor.drag(out, editor.port(ks2, "seed", "in"))
    value.fill("1234")
    value.press("Enter")
    prompt = editor.prompt()
    assert prompt["3"]["inputs"]["seed"] == 1234 and prompt[second]["inputs"]["seed"] == 1234
    assert pid not in prompt
    # only widgets of the same kind take it: a combo is refused, with a message
    editor.drag(out, editor.port(ks, "sampler_name", "in"))
    assert "sampler_name" not in page.evaluate("Object.keys(loom.tabs.current.graph.nodes.get('3').links)")
    assert page.locator('[data-role="toast"]', has_text="primitive").count() >= 1
    editor.shot("primitive-two-seeds")

    # ComfyUI's UI format: the PrimitiveNode with its value and control, links into widget slots
    ui = page.evaluate("(async () => (await import('./js/uiformat.js')).toUi(loom.tabs.current.graph))()")
    pnode = next(n for n in ui["nodes"] if n["type"] == "PrimitiveNode")
    assert pnode["widgets_values"] == [1234, "fixed"] and len(pnode["outputs"][0]["links"]) == 2
    seed_in = next(i for i in next(n for n in ui["nodes"] if n["id"] == 3)["inputs"] if i["name"] == "seed")
    assert seed_in["widget"] == {"name": "seed"} and seed_in["link"] in pnode["outputs"][0]["links"]
    req = urllib.request.Request(
        server.url + "/api/v1/workflows/convert",
        data=json.dumps(ui).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as res:
        converted = json.loads(res.read())
    converted = converted.get("prompt", converted)
    assert converted["3"]["inputs"]["seed"] == 1234 and converted[second]["inputs"]["seed"] == 1234

    # reload from the UI file in a new tab: the same prompt, and each sampler still has its own seed
    page.evaluate("(ui) => loom.workflows.loadObject(ui, 'reloaded')", ui)
    page.wait_for_function("loom.tabs.current.name === 'reloaded'")
    assert editor.prompt() == prompt
    # take the link off the first sampler's seed (drag it away, drop on the canvas, close the search)
    ks = editor.node("3")
    box = editor.port(ks, "seed", "in").bounding_box()
    editor.drag(editor.port(ks, "seed", "in"), (box["x"] - 150, box["y"] - 170))
    page.keyboard.press("Escape")
    assert ks.locator('[data-widget="seed"]').input_value() == "777"
    assert editor.prompt()["3"]["inputs"]["seed"] == 777
    assert editor.prompt()[second]["inputs"]["seed"] == 1234
    # and through Loom's own saved format (undo history and files): the other one keeps 5
    page.evaluate("(s) => loom.workflows.loadObject(s, 'saved copy')", editor.saved())
    page.wait_for_function("loom.tabs.current.name === 'saved copy'")
    page.evaluate(f"loom.editor.graph.disconnect('{second}', 'seed'); loom.editor.renderAll()")
    assert editor.node(second).locator('[data-widget="seed"]').input_value() == "5"
    assert editor.prompt()[second]["inputs"]["seed"] == 5
    editor.shot("primitive-unlinked")
