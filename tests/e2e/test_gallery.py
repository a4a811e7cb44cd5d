"""Gallery and images in a real browser: the run shows per-node progress and overall progress in
the window title; the image appears on the node and in the gallery; the full-size viewer shows the
image's size and the settings that made it (from its PNG chunks); "load this workflow" opens it in
a new tab; two images compare with a slider; delete removes the history entry."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import Editor, Server

pytestmark = [pytest.mark.browser, pytest.mark.slow]

WATCH = """() => {
  window.__titles = [];
  new MutationObserver(() => window.__titles.push(document.title))
    .observe(document.querySelector('title'), {childList: true, characterData: true, subtree: true});
  window.__progressNodes = new Set();
  new MutationObserver((records) => { for (const r of records) if (r.target.classList?.contains('has-progress')) window.__progressNodes.add(r.target.dataset.nodeId); })
    .observe(document.querySelector('.nodes-layer'), {attributes: true, attributeFilter: ['class'], subtree: true});
}"""


def test_viewer_metadata_load_compare_delete_and_progress(editor: Editor, server: Server) -> None:
    editor.open()
    page = editor.page
    page.evaluate(WATCH)
    editor.node("3").locator('[data-widget="seed"]').fill("101")
    editor.node("3").locator('[data-widget="seed"]').press("Enter")
    editor.queue_and_wait_image()
    page.wait_for_function("document.title === 'Loom'")
    titles = page.evaluate("window.__titles")
    percents = [int(t[1 : t.index("%")]) for t in titles if t.startswith("[")]
    assert percents and max(percents) >= 50 and percents == sorted(percents)
    assert "3" in page.evaluate("[...window.__progressNodes]")  # the sampler showed its step progress
    # a second image with another seed
    editor.node("3").locator('[data-widget="seed"]').fill("202")
    editor.node("3").locator('[data-widget="seed"]').press("Enter")
    page.wait_for_function("loom.tabs.current.graph.nodes.get('3').values.seed === 202")
    page.evaluate("loom.tabs.current.graph.nodes.get('3').control.seed = 'fixed'")
    count = "document.querySelectorAll('[data-panel=gallery] .gallery-thumb').length"
    before = page.evaluate(count)  # the shared server's earlier images may be in the gallery too
    page.click('[data-action="queue"]')
    page.click('[data-show-panel="gallery"]')
    thumbs = page.locator('[data-panel="gallery"] .gallery-thumb')
    page.wait_for_function(f"{count} >= {max(2, before + 1)}", timeout=120_000)
    page.wait_for_function("document.title === 'Loom'")
    # the viewer: full size, with what made it
    thumbs.first.click()
    viewer = page.locator('[data-role="viewer"]')
    viewer.locator('[data-meta="size"]').wait_for()
    assert viewer.locator('[data-meta="size"]').inner_text() == "256 × 256"
    viewer.locator('[data-meta-node="3"]').wait_for()
    assert "seed: 202" in viewer.locator('[data-meta-node="3"]').inner_text()
    assert "ckpt_name: loom_demo_sd15.safetensors" in viewer.locator('[data-meta-node="4"]').inner_text()
    editor.shot("image-viewer")
    # load this workflow: a new tab with the seed that made it
    tabs = page.locator('[data-role="tabs"] .tab').count()
    viewer.locator('[data-action="viewer-load-workflow"]').click()
    page.wait_for_function(f"document.querySelectorAll('[data-role=tabs] .tab').length === {tabs + 1}")
    assert editor.prompt()["3"]["inputs"]["seed"] == 202
    # compare: ctrl-click two images, then slide
    thumbs.nth(0).click(modifiers=["Control"])
    thumbs.nth(1).click(modifiers=["Control"])
    slider = page.locator('[data-role="compare-slider"]')
    slider.fill("30")
    assert page.locator(".compare-over").evaluate("e => e.style.clipPath") == "inset(0px 70% 0px 0px)"
    editor.shot("image-compare")
    page.locator('[data-role="compare"] [data-action="viewer-close"]').click()
    # an image on the node (back in the first tab) opens the viewer too
    page.locator('[data-role="tabs"] .tab .tab-name').first.click()
    editor.node("9").locator(".node-outputs img.node-image").first.click()
    viewer.locator('[data-meta="file"]').wait_for()
    viewer.locator('[data-action="viewer-close"]').click()
    # a gallery image into the mask editor: saved into the input folder, onto a new LoadImage node
    thumbs.first.click()
    viewer.locator('[data-action="viewer-mask"]').click()
    page.locator('[data-role="mask-stage"]').wait_for()
    box = page.locator('[data-role="mask-stage"]').bounding_box()
    page.mouse.move(box["x"] + 40, box["y"] + 40)
    page.mouse.down()
    page.mouse.move(box["x"] + 120, box["y"] + 60, steps=5)
    page.mouse.up()
    page.locator('[data-mask-action="save"]').click()
    loader = page.locator('.node[data-node-type="LoadImage"]').last
    loader.wait_for()
    assert loader.locator('[data-widget="image"]').input_value().startswith("clipspace/clipspace-mask-")
    # delete: the history entry goes, and so does the thumbnail
    history = server.get("/history")
    count = thumbs.count()
    thumbs.first.click()
    viewer.locator('[data-action="viewer-delete"]').click()
    page.wait_for_function(
        f"document.querySelectorAll('[data-panel=gallery] .gallery-thumb').length === {count - 1}"
    )
    assert len(server.get("/history")) == len(history) - 1
