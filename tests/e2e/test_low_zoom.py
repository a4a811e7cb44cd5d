"""Low-quality drawing when zoomed far out, in a real browser: below zoom 0.5 the canvas root gets the
class "lod" (text and widget contents are not drawn; nodes keep their size and ports), above it the
class goes; a pan moves the view by scrolling only (the world's transform stays as it is); nodes far
outside the view are culled and come back; and none of it changes the graph, its saved file or the
prompt the editor queues."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.e2e.conftest import Editor

pytestmark = [pytest.mark.browser, pytest.mark.slow]

VISIBILITY = "([sel, node]) => getComputedStyle(document.querySelector(`.node[data-node-id='${node}'] ${sel}`)).visibility"


def lod(editor: Editor) -> bool:
    return editor.page.evaluate("document.querySelector('.canvas').classList.contains('lod')")


def set_zoom(editor: Editor, zoom: float) -> None:
    editor.page.evaluate(f"loom.editor.canvas.setView(40, 40, {zoom})")
    editor.page.evaluate("() => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)))")


def positions(saved: dict[str, Any]) -> dict[str, Any]:
    """Where each node is (its measured size grows when the queued run's image arrives)."""
    return {nid: entry["pos"] for nid, entry in saved["layout"]["nodes"].items()}


def queued_prompt(editor: Editor) -> dict[str, Any]:
    """Press Queue and return the prompt the editor posted."""
    with editor.page.expect_request(lambda r: r.url.endswith("/prompt") and r.method == "POST") as req:
        editor.page.click('[data-action="queue"]')
    return json.loads(req.value.post_data)["prompt"]


def test_low_quality_below_the_threshold_and_the_graph_unchanged(editor: Editor) -> None:
    editor.open()
    page = editor.page
    # a fixed seed, so that queueing twice sends the same prompt
    page.evaluate("loom.tabs.current.graph.nodes.get('3').control.seed = 'fixed'")
    saved, prompt = editor.saved(), editor.prompt()
    set_zoom(editor, 1.0)
    assert not lod(editor)
    width_at_1 = editor.node("3").bounding_box()["width"]
    assert page.evaluate(VISIBILITY, ['[data-widget-row="seed"] .w-control-box', "3"]) == "visible"
    queued_at_1 = queued_prompt(editor)
    assert queued_at_1 == prompt

    set_zoom(editor, 0.49)  # just below the threshold
    assert lod(editor)
    assert page.evaluate(VISIBILITY, ['[data-widget-row="seed"] .w-control-box', "3"]) == "hidden"
    assert page.evaluate(VISIBILITY, [".node-title", "3"]) == "hidden"
    assert page.evaluate(VISIBILITY, ['.port[data-port="model"][data-dir="in"]', "3"]) == "visible"
    # the node keeps its size (only what is drawn changed), so links still meet its ports
    assert abs(editor.node("3").bounding_box()["width"] - width_at_1 * 0.49) < 2
    set_zoom(editor, 0.51)
    assert not lod(editor)

    # wheel out to the minimum zoom: low quality all the way down
    set_zoom(editor, 0.35)
    page.mouse.move(700, 400)
    for _ in range(40):
        page.mouse.wheel(0, 120)
    page.wait_for_function("() => loom.editor.canvas.zoom === 0.1")
    assert lod(editor)

    # a pan is a scroll of the viewport: the world's transform does not change
    set_zoom(editor, 0.3)
    transform = page.evaluate("document.querySelector('.world').style.transform")
    scroll = page.evaluate("document.querySelector('.viewport').scrollLeft")
    before = editor.node("3").bounding_box()
    x0 = page.evaluate("loom.editor.canvas.x")
    page.mouse.move(800, 700)
    page.keyboard.down("Space")
    page.mouse.down()
    page.mouse.move(700, 650, steps=5)
    page.mouse.up()
    page.keyboard.up("Space")
    assert page.evaluate("loom.editor.canvas.x") == x0 - 100
    assert page.evaluate("document.querySelector('.world').style.transform") == transform
    assert page.evaluate("document.querySelector('.viewport').scrollLeft") == scroll + 100
    after = editor.node("3").bounding_box()
    assert abs(after["x"] - (before["x"] - 100)) < 1 and abs(after["y"] - (before["y"] - 50)) < 1

    # nodes far outside the view are culled, and shown again when the view comes back
    page.evaluate("loom.editor.canvas.setView(-60000, -60000, 0.3)")
    page.wait_for_function(
        "() => document.querySelector('.node[data-node-id=\"3\"]').classList.contains('offscreen')"
    )
    set_zoom(editor, 0.25)
    page.wait_for_function(
        "() => !document.querySelector('.node[data-node-id=\"3\"]').classList.contains('offscreen')"
    )
    editor.shot("low-zoom")

    # the same graph and the same prompt, also after a save/load round trip at low zoom
    assert editor.prompt() == prompt
    assert editor.saved()["prompt"] == saved["prompt"]
    assert positions(editor.saved()) == positions(saved)
    page.evaluate("loom.tabs.open(loom.tabs.current.graph.toSaved(), 'low zoom copy')")
    page.wait_for_function("() => loom.tabs.current.name === 'low zoom copy'")
    assert editor.prompt() == prompt
    assert positions(editor.saved()) == positions(saved)
    assert queued_prompt(editor) == queued_at_1

    set_zoom(editor, 1.0)  # and back above the threshold: everything drawn again
    assert not lod(editor)
    assert page.evaluate(VISIBILITY, ['[data-widget-row="seed"] .w-control-box', "3"]) == "visible"
    assert page.evaluate(VISIBILITY, [".node-title", "3"]) == "visible"
