"""Reroutes in a real browser: link-midpoint reroutes (several per link, dragged, deleted) and the
legacy Reroute node; a graph with both goes out in ComfyUI's UI format (extra.reroutes,
extra.linkExtensions, a Reroute node) and comes back identical, and the server reads the exported
file to the same API prompt the editor sends."""

from __future__ import annotations

import json
import urllib.request

import pytest

from tests.e2e.conftest import Editor

pytestmark = [pytest.mark.browser, pytest.mark.slow]

POINT_ON_LINK = """([dst, input, t]) => {
  const path = document.querySelector(`path.link[data-dst="${dst}"][data-input="${input}"]`);
  const p = path.getPointAtLength(path.getTotalLength() * t);
  const s = new DOMPoint(p.x, p.y).matrixTransform(path.getScreenCTM());
  return [s.x, s.y];
}"""


def point_on_link(editor: Editor, dst: str, name: str, t: float) -> tuple[float, float]:
    x, y = editor.page.evaluate(POINT_ON_LINK, [dst, name, t])
    return x, y


def dot(editor: Editor, rid: int):
    return editor.page.locator(f'circle.reroute[data-reroute-id="{rid}"]')


def test_reroutes_added_moved_deleted_and_round_tripped(editor: Editor, server) -> None:
    editor.open()
    page = editor.page
    before_prompt = editor.prompt()
    # two reroutes on the checkpoint → sampler MODEL link, by double-clicking the link
    page.mouse.dblclick(*point_on_link(editor, "3", "model", 0.3))
    page.mouse.dblclick(*point_on_link(editor, "3", "model", 0.7))
    saved = editor.saved()
    assert len(saved["layout"]["reroutes"]) == 2
    chain = page.evaluate("loom.tabs.current.graph.routeOf('3', 'model').map(r => r.id)")
    assert len(chain) == 2 and saved["layout"]["nodes"]["3"]["routes"]["model"] == chain[1]
    assert editor.prompt() == before_prompt  # reroutes never change what runs
    # a third one, on another link, then drag the first one
    page.mouse.dblclick(*point_on_link(editor, "6", "clip", 0.5))
    assert len(editor.saved()["layout"]["reroutes"]) == 3
    first = dot(editor, chain[0])
    box = first.bounding_box()
    editor.drag(first, (box["x"] + 60, box["y"] + 120))
    moved = {r["id"]: r["pos"] for r in editor.saved()["layout"]["reroutes"]}
    old = {r["id"]: r["pos"] for r in saved["layout"]["reroutes"]}
    assert moved[chain[0]][1] > old[chain[0]][1] + 60
    # the link is drawn through its reroutes: the path passes the moved dot
    d = page.locator('path.link[data-dst="3"][data-input="model"]').get_attribute("d")
    xs = [float(v.split(",")[0]) for v in d.replace("M", " ").replace("C", " ").split() if "," in v]
    assert any(abs(x - moved[chain[0]][0]) <= 1.0 for x in xs), (
        moved[chain[0]],
        d,
    )  # saved positions are rounded
    editor.shot("reroutes-on-links")
    # delete the second one: click it, press Delete; the chain closes up
    dot(editor, chain[1]).click()
    page.keyboard.press("Delete")
    assert page.evaluate("loom.tabs.current.graph.routeOf('3', 'model').map(r => r.id)") == [chain[0]]
    assert editor.saved()["layout"]["nodes"]["3"]["routes"]["model"] == chain[0]
    # right-click → delete reroute
    dot(editor, chain[0]).click(button="right")
    page.locator('.context-menu .menu-item[data-menu="Delete reroute"]').click()
    assert "model" not in editor.saved()["layout"]["nodes"]["3"].get("routes", {})
    assert dot(editor, chain[0]).count() == 0
    # undo brings it back
    page.keyboard.press("Control+z")
    assert dot(editor, chain[0]).count() == 1
    # the legacy Reroute node, put on the VAE → decoder link from the link's menu
    page.mouse.click(*point_on_link(editor, "8", "vae", 0.5), button="right")
    page.locator('.context-menu .menu-item[data-menu="Insert Reroute node"]').click()
    reroute = editor.node_of_type("Reroute")
    assert reroute.count() == 1
    rid = reroute.get_attribute("data-node-id")
    assert editor.prompt() == before_prompt  # the API prompt follows the Reroute node to the checkpoint
    layout = editor.saved()["layout"]
    assert layout["frontend"][rid]["type"] == "Reroute" and layout["nodes"]["8"]["via"]["vae"] == [rid, 0]
    editor.shot("reroute-node")

    # ComfyUI's UI format out: native reroutes and the Reroute node
    ui = page.evaluate("(async () => (await import('./js/uiformat.js')).toUi(loom.tabs.current.graph))()")
    assert ui["version"] == 0.4
    assert {r["id"] for r in ui["extra"]["reroutes"]} == {
        r["id"] for r in editor.saved()["layout"]["reroutes"]
    }
    ext = ui["extra"]["linkExtensions"]
    assert ext and all(any(link[0] == e["id"] for link in ui["links"]) for e in ext)
    assert any(n["type"] == "Reroute" for n in ui["nodes"])
    ks = next(n for n in ui["nodes"] if n["id"] == 3)
    assert {"name": "seed", "type": "INT", "link": None, "widget": {"name": "seed"}} in ks["inputs"]
    # the server reads the exported file to the prompt the editor sends
    req = urllib.request.Request(
        server.url + "/api/v1/workflows/convert",
        data=json.dumps(ui).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as res:
        converted = json.loads(res.read())
    converted = converted.get("prompt", converted)
    strip = lambda p: {k: {"class_type": v["class_type"], "inputs": v["inputs"]} for k, v in p.items()}  # noqa: E731
    assert strip(converted) == strip(editor.prompt())
    # ... and back in: the same graph, the same prompt
    original = editor.saved()
    page.evaluate("(ui) => loom.workflows.loadObject(ui, 'round trip')", ui)
    page.wait_for_function("loom.tabs.current.name === 'round trip'")
    back = editor.saved()
    assert back["prompt"] == original["prompt"]
    assert back["layout"]["reroutes"] == original["layout"]["reroutes"]
    assert back["layout"]["frontend"] == original["layout"]["frontend"]
    for nid, entry in original["layout"]["nodes"].items():
        for key in ("pos", "routes", "via", "control", "mode"):
            assert back["layout"]["nodes"][nid].get(key) == entry.get(key), (nid, key)
    assert editor.prompt() == before_prompt
    assert page.locator("circle.reroute").count() == len(original["layout"]["reroutes"])
    editor.shot("reroutes-round-trip")
