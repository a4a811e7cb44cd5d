"""Editing features in a real browser: bypass / mute in the API prompt, collapse, rename,
widget <-> input, groups moving their nodes, box select, copy/paste between tabs, the context
menu, the queue panel, and a web extension loaded from /extensions."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import Editor

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def menu(editor: Editor, target, label: str, sub: str | None = None) -> None:
    target.click(button="right")
    item = editor.page.locator(f'.context-menu .menu-item[data-menu="{label}"]').first
    if sub:
        item.hover()
        item.locator(f'.menu-item[data-menu="{sub}"]').click()
    else:
        item.click()


def test_bypass_mute_collapse_rename_convert(editor: Editor) -> None:
    editor.open()
    page = editor.page
    # bypass a LoRA placed between the checkpoint and the sampler: the sampler gets the checkpoint
    # MODEL through it, and the LoRA is not in the prompt
    lora = editor.add_node("LoraLoader", 60, 620, "lora")
    lora_id = lora.get_attribute("data-node-id")
    editor.drag(editor.port(editor.node("4"), "MODEL", "out"), editor.port(lora, "model", "in"))
    editor.drag(editor.port(editor.node("4"), "CLIP", "out"), editor.port(lora, "clip", "in"))
    editor.drag(editor.port(lora, "MODEL", "out"), editor.port(editor.node("3"), "model", "in"))
    assert editor.prompt()["3"]["inputs"]["model"] == [lora_id, 0]
    menu(editor, lora.locator(".node-title"), "Bypass")
    assert "bypassed" in lora.get_attribute("class")
    assert lora_id not in editor.prompt()
    assert editor.prompt()["3"]["inputs"]["model"] == ["4", 0]
    # mute: left out, and so is the link to it
    menu(editor, lora.locator(".node-title"), "Stop bypassing")
    menu(editor, lora.locator(".node-title"), "Mute")
    assert lora_id not in editor.prompt() and "model" not in editor.prompt()["3"]["inputs"]
    assert editor.saved()["layout"]["nodes"][lora_id]["mode"] == 2
    page.keyboard.press("Control+z")
    assert editor.prompt()["3"]["inputs"]["model"] == [lora_id, 0]
    # collapse and rename
    editor.node("5").locator('[data-action="collapse"]').click()
    assert "collapsed" in editor.node("5").get_attribute("class")
    assert editor.saved()["layout"]["nodes"]["5"]["collapsed"] is True
    editor.node("9").locator(".node-title").dblclick()
    page.locator(".rename-box").fill("Final picture")
    page.keyboard.press("Enter")
    assert editor.node("9").locator(".node-title").inner_text() == "Final picture"
    assert editor.saved()["layout"]["nodes"]["9"]["title"] == "Final picture"
    # resize: the grip widens the node, and the width is saved
    width = editor.node("9").bounding_box()["width"]
    editor.drag(
        editor.node("9").locator(".node-resize"), (editor.node("9").bounding_box()["x"] + width + 80, 300)
    )
    assert editor.node("9").bounding_box()["width"] > width + 40
    assert editor.saved()["layout"]["nodes"]["9"]["size"][0] > width + 40
    # widget -> input: steps becomes a port fed by a primitive, then back to a widget
    menu(editor, editor.node("3").locator(".node-title"), "Widgets ↔ inputs", "Convert steps to input")
    assert editor.node("3").locator('.io-row .port[data-port="steps"][data-dir="in"]').count() == 1
    assert editor.node("3").locator('[data-widget="steps"]').count() == 0
    prim = editor.add_node("PrimitiveInt", 600, 700, "primitiveint")
    editor.drag(editor.port(prim, "INT", "out"), editor.port(editor.node("3"), "steps", "in"))
    assert editor.prompt()["3"]["inputs"]["steps"] == [prim.get_attribute("data-node-id"), 0]
    menu(editor, editor.node("3").locator(".node-title"), "Widgets ↔ inputs", "Convert steps to widget")
    assert editor.node("3").locator('[data-widget-row="steps"].linked').count() == 1
    editor.shot("editing-features")


def test_groups_box_select_copy_paste_between_tabs(editor: Editor) -> None:
    editor.open()
    page = editor.page
    page.evaluate("loom.editor.groups.addAround(['6', '7'])")
    title = page.locator(".group .group-title").first
    pos6 = editor.saved()["layout"]["nodes"]["6"]["pos"]
    box = title.bounding_box()
    editor.drag(title, (box["x"] + box["width"] / 2 + 60, box["y"] + box["height"] / 2 + 40))
    moved = editor.saved()["layout"]["nodes"]["6"]["pos"]
    assert moved[0] > pos6[0] and moved[1] > pos6[1]
    assert editor.saved()["layout"]["groups"][0]["bounding"][0] > 0
    # box select (ctrl-drag on the background) the two prompt nodes, copy, paste into a new tab
    r6, r7 = editor.node("6").bounding_box(), editor.node("7").bounding_box()
    page.keyboard.down("Control")
    page.mouse.move(r6["x"] - 8, r6["y"] - 8)
    page.mouse.down()
    page.mouse.move(r7["x"] + r7["width"] + 8, r7["y"] + r7["height"] + 8, steps=6)
    page.mouse.up()
    page.keyboard.up("Control")
    assert sorted(page.evaluate("[...loom.editor.selection]")) == ["6", "7"]
    page.keyboard.press("Control+c")
    page.click('[data-action="new-tab"]')
    page.mouse.move(500, 300)
    page.keyboard.press("Control+v")
    nodes = editor.saved()["prompt"]
    assert sorted(n["class_type"] for n in nodes.values()) == ["CLIPTextEncode", "CLIPTextEncode"]
    assert "a watercolor" in "".join(str(n["inputs"].get("text")) for n in nodes.values())
    editor.shot("pasted-into-new-tab")
    # canvas context menu → Add node… opens the search
    page.mouse.click(900, 500, button="right")
    page.locator('.context-menu .menu-item[data-menu="Add node…"]').click()
    page.locator('[data-role="search-input"]').fill("vae decode")
    page.keyboard.press("Enter")
    assert page.locator('.node[data-node-type="VAEDecode"]').count() == 1


def test_queue_panel_batch_and_cancel(editor: Editor) -> None:
    editor.open()
    page = editor.page
    page.wait_for_selector(
        '[data-panel="gallery"] .panel-body[data-loaded="true"]', state="attached"
    )  # read /history
    thumbs = page.locator(".gallery-thumb").count()
    page.fill('[data-role="batch"]', "3")
    # Long jobs, and the last of the three is cancelled: it stays pending while the two before it run
    # (about 2 × 120 demo steps), so the cancel always reaches a job the server has not started
    # (cancelling the first pending one raced the worker when the tiny first job ended at once).
    editor.node("3").locator('[data-widget="steps"]').fill("120")
    seeds = [editor.saved()["prompt"]["3"]["inputs"]["seed"]]
    page.click('[data-show-panel="queue"]')
    page.keyboard.press("Control+Enter")
    # cancel the last pending job as soon as the panel lists all three (in the page: it redraws often)
    cancelled = page.wait_for_function(
        """() => {
        const pending = document.querySelectorAll('.queue-item.pending [data-action="cancel"]');
        if (pending.length < 2 || document.querySelectorAll('.queue-item').length < 3) return false;
        const button = pending[pending.length - 1];
        if (!button) return false;
        button.click();
        return button.dataset.promptId;
    }""",
        timeout=30_000,
    ).json_value()
    page.wait_for_function("() => loom.runner.promptTabs.size === 3")
    seeds.append(editor.saved()["prompt"]["3"]["inputs"]["seed"])
    assert seeds[0] != seeds[1]  # randomize after each queued run
    page.wait_for_function(
        f"() => document.querySelectorAll('.gallery-thumb').length >= {thumbs + 2}", timeout=120_000
    )
    page.wait_for_function("() => document.querySelectorAll('.queue-item').length === 0", timeout=120_000)
    assert editor.server.get(f"/history/{cancelled}") == {}
    editor.shot("queue-batch")


EXTENSION = """
export function register(loom) {
  loom.addMenuItem({ label: "Count nodes", where: "main", action: () => loom.toast(`graph has ${loom.graph.nodes.size} nodes`) });
  loom.on("graphChanged", () => { window.__extChanged = (window.__extChanged || 0) + 1; });
}
"""


def test_web_extension_adds_a_menu_item_and_hears_events(editor: Editor) -> None:
    page = editor.page
    page.route("**/extensions", lambda route: route.fulfill(json=["/extensions/test_pack/ext.js"]))
    page.route(
        "**/extensions/test_pack/ext.js",
        lambda route: route.fulfill(body=EXTENSION, content_type="text/javascript"),
    )
    editor.open()
    page.locator(".menu-extra button", has_text="Count nodes").click()
    page.locator('[data-role="toast"]', has_text="graph has 7 nodes").wait_for()
    editor.node("5").locator('[data-action="collapse"]').click()
    assert page.evaluate("window.__extChanged") >= 1


def test_link_dropped_on_empty_canvas_opens_a_filtered_search(editor: Editor) -> None:
    editor.open()
    page = editor.page
    editor.drag(editor.port(editor.node("3"), "LATENT", "out"), (1000, 700))
    search = page.locator('[data-role="search"]')
    search.wait_for(state="visible")
    assert "LATENT" in search.locator(".search-hint").inner_text()
    offered = page.eval_on_selector_all(".search-item", "els => els.map(e => e.dataset.type)")
    assert (
        "VAEDecode" in offered and "CLIPTextEncode" not in offered and "CheckpointLoaderSimple" not in offered
    )
    page.locator('[data-role="search-input"]').fill("vae dec")
    page.keyboard.press("Enter")
    new_id = page.evaluate("[...loom.editor.selection][0]")
    assert editor.node(new_id).get_attribute("data-node-type") == "VAEDecode"
    assert editor.prompt()[new_id]["inputs"]["samples"] == ["3", 0]
    # and from an input dragged backwards onto empty canvas: nodes that give that type
    editor.drag(editor.port(editor.node(new_id), "vae", "in"), (1200, 780))
    offered = page.eval_on_selector_all(".search-item", "els => els.map(e => e.dataset.type)")
    assert "CheckpointLoaderSimple" in offered and "KSampler" not in offered
    page.keyboard.press("Escape")


def test_execution_error_and_progress_are_shown_on_the_node(editor: Editor) -> None:
    editor.open()
    page = editor.page
    fire = "([type, detail]) => loom.api.events.dispatchEvent(new CustomEvent(type, {detail}))"
    page.evaluate(fire, ["executing", {"node": "3", "prompt_id": None}])
    page.evaluate(fire, ["progress", {"node": "3", "value": 5, "max": 10, "prompt_id": None}])
    assert "executing" in editor.node("3").get_attribute("class")
    width = editor.node("3").locator(".node-progress .bar").evaluate("e => e.style.width")
    assert width == "50%"
    editor.shot("executing-progress")
    page.evaluate(
        fire,
        [
            "execution_error",
            {
                "node_id": "3",
                "node_type": "KSampler",
                "exception_type": "RuntimeError",
                "exception_message": "the sampler fell over",
                "prompt_id": None,
            },
        ],
    )
    assert "exec-error" in editor.node("3").get_attribute("class")
    assert "the sampler fell over" in editor.node("3").locator(".node-error").inner_text()
    assert "executing" not in editor.node("3").get_attribute("class")
    page.locator('[data-role="toast"]', has_text="the sampler fell over").wait_for()
    editor.shot("execution-error")


def test_image_upload_widget_shows_a_thumbnail(editor: Editor, tmp_path) -> None:
    editor.open()
    if not editor.page.evaluate("'LoadImage' in loom.info"):
        pytest.skip("this server has no LoadImage node")
    from PIL import Image

    picture = tmp_path / "upload_me.png"
    Image.new("RGB", (48, 32), (30, 160, 90)).save(picture)
    node = editor.add_node("LoadImage", 300, 650, "load image")
    with editor.page.expect_file_chooser() as chooser:
        node.locator('[data-action="upload"]').click()
    chooser.value.set_files(str(picture))
    editor.page.wait_for_function(
        "() => { const i = document.querySelector('.node[data-node-type=LoadImage] .w-thumb'); return i && !i.hidden && i.complete && i.naturalWidth === 48; }"
    )
    node_id = node.get_attribute("data-node-id")
    assert editor.prompt()[node_id]["inputs"]["image"].endswith("upload_me.png")
    editor.shot("image-upload")
