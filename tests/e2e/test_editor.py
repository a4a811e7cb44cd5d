"""The editor in a real browser: run the default workflow, build txt2img from nothing, refused
links, server validation errors on widgets, undo/redo, save/reload/load, and dropped files."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from tests.e2e.conftest import Editor

pytestmark = [pytest.mark.browser, pytest.mark.slow]
COMPAT = Path(__file__).resolve().parents[1] / "compat" / "workflows"


def layout_positions(saved: dict) -> dict:
    return {
        nid: (entry["pos"], entry.get("title"), entry.get("mode"))
        for nid, entry in saved["layout"]["nodes"].items()
    }


def demo_checkpoint(editor: Editor) -> str:
    names = editor.page.evaluate("loom.info.CheckpointLoaderSimple.input.required.ckpt_name[0]")
    return next(n for n in names if "demo" in n.lower())


def test_default_workflow_runs_and_lands_in_gallery(editor: Editor) -> None:
    editor.open()
    types = sorted(editor.page.eval_on_selector_all(".node", "els => els.map(e => e.dataset.nodeType)"))
    assert types == sorted(
        [
            "CheckpointLoaderSimple",
            "CLIPTextEncode",
            "CLIPTextEncode",
            "EmptyLatentImage",
            "KSampler",
            "VAEDecode",
            "SaveImage",
        ]
    )
    ckpt = editor.node_of_type("CheckpointLoaderSimple").locator('[data-widget="ckpt_name"]')
    assert "demo" in ckpt.input_value()
    seed_before = editor.saved()["prompt"]["3"]["inputs"]["seed"]
    editor.page.evaluate("""() => { window.__previews = 0;
        loom.api.events.addEventListener('preview', () => { window.__previews++;
            window.__previewOnSampler = !!document.querySelector('.node[data-node-id="3"] img.node-preview'); }); }""")
    editor.queue_and_wait_image()
    if editor.page.evaluate(
        "window.__previews"
    ):  # live previews (when the server sends them) land on the sampler
        editor.page.wait_for_function(
            "() => !!document.querySelector('.node[data-node-id=\"3\"] img.node-preview')"
        )
    editor.shot("default-workflow-result")
    # control after generate (randomize) changed the seed after queueing
    assert editor.saved()["prompt"]["3"]["inputs"]["seed"] != seed_before
    editor.page.click('[data-show-panel="gallery"]')
    thumb = editor.page.locator(".gallery-thumb").first
    thumb.wait_for(state="visible")
    editor.page.wait_for_function(
        "() => { const i = document.querySelector('.gallery-thumb'); return i && i.complete && i.naturalWidth > 0; }"
    )
    thumb.click()
    editor.page.locator('[data-role="viewer"]').wait_for(
        state="visible"
    )  # the full-size viewer (web/js/viewer.js)
    editor.shot("gallery-lightbox")
    tabs_before = editor.page.locator(".tab").count()
    editor.page.click('[data-action="viewer-load-workflow"]')
    editor.page.wait_for_function(f"() => document.querySelectorAll('.tab').length === {tabs_before + 1}")
    assert editor.page.locator('.node[data-node-type="KSampler"]').count() == 1


def test_build_txt2img_from_empty_canvas(editor: Editor) -> None:
    editor.open()
    editor.page.click('[data-action="new-tab"]')
    assert editor.page.locator(".node").count() == 0
    editor.page.locator('[data-role="empty-hint"]').wait_for(state="visible")
    editor.shot("empty-canvas")
    ckpt = editor.add_node("CheckpointLoaderSimple", 40, 330, "load checkpoint")
    pos = editor.add_node("CLIPTextEncode", 380, 90, "clip text encode")
    neg = editor.add_node("CLIPTextEncode", 380, 360, "cliptextenc")
    latent = editor.add_node("EmptyLatentImage", 380, 640, "empty latent")
    sampler = editor.add_node("KSampler", 820, 90, "ksampler")
    decode = editor.add_node("VAEDecode", 1220, 90, "vae decode")
    save = editor.add_node("SaveImage", 1220, 330, "save image")
    assert editor.page.locator(".node").count() == 7
    ckpt.locator('[data-widget="ckpt_name"]').select_option(demo_checkpoint(editor))
    pos.locator('[data-widget="text"]').fill("a red fox in the snow")
    neg.locator('[data-widget="text"]').fill("blurry")
    latent.locator('[data-widget="width"]').fill("128")
    latent.locator('[data-widget="width"]').press("Tab")
    latent.locator('[data-widget="height"]').fill("128")
    latent.locator('[data-widget="height"]').press("Tab")
    sampler.locator('[data-widget="steps"]').fill("4")
    sampler.locator('[data-widget="steps"]').press("Tab")
    p = editor.port
    links = [
        (p(ckpt, "MODEL", "out"), p(sampler, "model", "in")),
        (p(ckpt, "CLIP", "out"), p(pos, "clip", "in")),
        (p(ckpt, "CLIP", "out"), p(neg, "clip", "in")),
        (p(pos, "CONDITIONING", "out"), p(sampler, "positive", "in")),
        (p(neg, "CONDITIONING", "out"), p(sampler, "negative", "in")),
        (p(latent, "LATENT", "out"), p(sampler, "latent_image", "in")),
        (p(sampler, "LATENT", "out"), p(decode, "samples", "in")),
        (p(ckpt, "VAE", "out"), p(decode, "vae", "in")),
        (p(decode, "IMAGE", "out"), p(save, "images", "in")),
    ]
    for source, target in links:
        editor.drag(source, target)
    editor.shot("built-txt2img")
    prompt = editor.prompt()
    assert sum(isinstance(v, list) for n in prompt.values() for v in n["inputs"].values()) == 9
    assert editor.page.locator('[data-role="empty-hint"]').is_hidden()
    editor.queue_and_wait_image()
    editor.shot("built-txt2img-result")
    editor.page.click('[data-action="help"]')
    editor.page.locator('[data-role="help"]').wait_for(state="visible")
    editor.shot("help")
    editor.page.keyboard.press("Escape")


def test_wrong_type_link_is_refused(editor: Editor) -> None:
    editor.open()
    ckpt, sampler = editor.node("4"), editor.node("3")
    before = editor.saved()["prompt"]["3"]["inputs"]["model"]
    target = editor.port(sampler, "model", "in")
    editor.drag(editor.port(ckpt, "CLIP", "out"), target)
    assert "refused" in (target.get_attribute("class") or "")
    toast = editor.page.locator('[data-role="toast"]', has_text="refused")
    toast.wait_for(state="visible")
    assert "CLIP" in toast.inner_text()
    editor.shot("wrong-type-refused")
    assert editor.saved()["prompt"]["3"]["inputs"]["model"] == before
    # dropping a CLIP link on the LATENT input of VAE Decode is refused too
    editor.drag(editor.port(ckpt, "CLIP", "out"), editor.port(editor.node("8"), "samples", "in"))
    assert editor.saved()["prompt"]["8"]["inputs"]["samples"] == ["3", 0]


def test_invalid_values_show_the_servers_errors_on_their_widgets(editor: Editor) -> None:
    editor.open()
    api = (
        json.loads((COMPAT / "api_txt2img.json").read_text())
        if (COMPAT / "api_txt2img.json").exists()
        else None
    )
    assert api, "tests/compat/workflows/api_txt2img.json is needed"
    sampler = next(k for k, v in api.items() if v["class_type"] == "KSampler")
    loader = next(k for k, v in api.items() if v["class_type"] == "CheckpointLoaderSimple")
    api[sampler]["inputs"]["steps"] = 0
    api[loader]["inputs"]["ckpt_name"] = "no_such_model.safetensors"
    editor.drop_file("broken.json", json.dumps(api).encode(), "application/json")
    editor.page.wait_for_function("() => loom.tabs.current.name === 'broken'")
    editor.page.click('[data-action="queue"]')
    ckpt_row = editor.node(loader).locator('[data-widget-row="ckpt_name"]')
    ckpt_row.locator(".w-error").wait_for(state="visible")
    assert (
        "no_such_model" in ckpt_row.locator(".w-error").inner_text()
        or "list" in ckpt_row.locator(".w-error").inner_text().lower()
    )
    steps_row = editor.node(sampler).locator('[data-widget-row="steps"]')
    steps_row.locator(".w-error").wait_for(state="visible")
    assert "min" in steps_row.locator(".w-error").inner_text().lower()
    assert "has-error" in editor.node(sampler).get_attribute("class")
    editor.shot("validation-errors")


def test_undo_redo_add_move_delete_link(editor: Editor) -> None:
    editor.open()
    page = editor.page
    count = page.locator(".node").count()
    # add
    editor.add_node("VAEDecode", 700, 700, "vae decode")
    assert page.locator(".node").count() == count + 1
    page.keyboard.press("Control+z")
    assert page.locator(".node").count() == count
    page.keyboard.press("Control+y")
    assert page.locator(".node").count() == count + 1
    page.keyboard.press("Control+z")
    # move
    pos0 = editor.saved()["layout"]["nodes"]["5"]["pos"]
    header = editor.node("5").locator(".node-title")
    box = header.bounding_box()
    editor.drag(header, (box["x"] + box["width"] / 2 + 120, box["y"] + box["height"] / 2 + 60))
    pos1 = editor.saved()["layout"]["nodes"]["5"]["pos"]
    assert pos1 != pos0
    page.keyboard.press("Control+z")
    assert editor.saved()["layout"]["nodes"]["5"]["pos"] == pos0
    page.keyboard.press("Control+Shift+z")
    assert editor.saved()["layout"]["nodes"]["5"]["pos"] == pos1
    # delete
    editor.node("8").locator(".node-title").click()
    page.keyboard.press("Delete")
    assert editor.node("8").count() == 0
    assert "8" not in editor.saved()["prompt"]
    page.keyboard.press("Control+z")
    assert editor.node("8").count() == 1
    assert editor.saved()["prompt"]["9"]["inputs"]["images"] == ["8", 0]
    # link: detach by dragging from a connected input onto empty canvas, then undo / redo
    editor.drag(editor.port(editor.node("9"), "images", "in"), (1400, 800))
    page.keyboard.press("Escape")  # the search opened for the dropped link
    assert "images" not in editor.saved()["prompt"]["9"]["inputs"]
    page.keyboard.press("Control+z")
    assert editor.saved()["prompt"]["9"]["inputs"]["images"] == ["8", 0]
    assert page.locator('path.link[data-dst="9"][data-input="images"]').count() == 1
    page.keyboard.press("Control+y")
    assert "images" not in editor.saved()["prompt"]["9"]["inputs"]
    editor.drag(editor.port(editor.node("8"), "IMAGE", "out"), editor.port(editor.node("9"), "images", "in"))
    assert editor.saved()["prompt"]["9"]["inputs"]["images"] == ["8", 0]
    page.keyboard.press("Control+z")
    assert "images" not in editor.saved()["prompt"]["9"]["inputs"]
    page.keyboard.press("Control+y")
    assert editor.saved()["prompt"]["9"]["inputs"]["images"] == ["8", 0]
    editor.shot("undo-redo")


def test_save_reload_load_gives_the_identical_graph(editor: Editor) -> None:
    editor.open()
    page = editor.page
    editor.node("6").locator('[data-widget="text"]').fill("a lighthouse in a storm")
    editor.node("6").locator('[data-widget="text"]').press("Tab")
    header = editor.node("7").locator(".node-title")
    box = header.bounding_box()
    editor.drag(header, (box["x"] + 40, box["y"] + 90))
    page.evaluate("loom.editor.setMode(['7'], 4)")
    page.evaluate("loom.editor.groups.addAround(['6', '7'])")
    before = editor.saved()
    page.click('[data-action="save"]')
    page.fill('[data-role="modal-input"]', "roundtrip-test")
    page.click('[data-action="modal-ok"]')
    page.locator('[data-role="toast"]', has_text="Saved").wait_for()
    page.reload()
    page.wait_for_selector("body[data-ready=true]")
    page.click('[data-show-panel="workflows"]')
    page.locator('[data-workflow="roundtrip-test.json"]').click()
    page.wait_for_function("() => loom.tabs.current.name === 'roundtrip-test' && loom.tabs.list.length >= 2")
    after = editor.saved()
    assert after["prompt"] == before["prompt"]
    assert layout_positions(after) == layout_positions(before)
    assert after["layout"]["groups"] == before["layout"]["groups"]
    assert after["format"] == "loom.workflow" and after["version"] == 2
    editor.shot("save-reload-load")


def test_drop_png_and_comfyui_ui_json(editor: Editor) -> None:
    editor.open()
    page = editor.page
    expected = editor.prompt()
    editor.queue_and_wait_image()
    src = editor.node_of_type("SaveImage").locator("img.node-image").first.get_attribute("src")
    png = editor.server.get_bytes(src if src.startswith("/") else "/" + src)
    editor.drop_file("made-by-loom.png", png, "image/png")
    page.wait_for_function("() => loom.tabs.current.name === 'made-by-loom'")
    loaded = editor.prompt()
    assert {k: v["class_type"] for k, v in loaded.items()} == {
        k: v["class_type"] for k, v in expected.items()
    }
    assert loaded["6"]["inputs"]["text"] == expected["6"]["inputs"]["text"]
    editor.shot("dropped-png")
    ui = (COMPAT / "txt2img.json").read_bytes()
    editor.drop_file("comfy-ui.json", ui, "application/json")
    page.wait_for_function("() => loom.tabs.current.name === 'comfy-ui'")
    types = sorted(v["class_type"] for v in editor.prompt().values())
    assert types == sorted(
        [
            "KSampler",
            "CheckpointLoaderSimple",
            "EmptyLatentImage",
            "CLIPTextEncode",
            "CLIPTextEncode",
            "VAEDecode",
            "SaveImage",
        ]
    )
    assert editor.prompt()["3"]["inputs"]["steps"] == 20 and editor.prompt()["3"]["inputs"]["model"] == [
        "4",
        0,
    ]
    assert editor.page.locator('.node[data-node-id="3"]').count() == 1
    editor.shot("dropped-ui-json")
    # a PNG as ComfyUI writes it: the UI-format workflow in a tEXt chunk (preferred: it has the layout)
    from PIL import Image, PngImagePlugin

    meta = PngImagePlugin.PngInfo()
    meta.add_text("workflow", ui.decode())
    buf = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buf, "PNG", pnginfo=meta)
    editor.drop_file("ComfyUI_00001_.png", buf.getvalue(), "image/png")
    page.wait_for_function("() => loom.tabs.current.name === 'ComfyUI_00001_'")
    assert editor.prompt()["3"]["inputs"]["model"] == ["4", 0]
    assert editor.saved()["layout"]["groups"], "the UI workflow's group came along"


def test_download_export_api_and_open_file(editor: Editor, tmp_path: Path) -> None:
    editor.open()
    page = editor.page
    page.evaluate(
        "loom.editor.setMode(['7'], 2)"
    )  # a muted node: kept in the file, left out of the API prompt
    before = editor.saved()
    with page.expect_download() as download:
        page.click('[data-action="download"]')
    saved_path = tmp_path / "saved.json"
    download.value.save_as(saved_path)
    saved = json.loads(saved_path.read_text())
    assert saved["format"] == "loom.workflow" and saved["version"] == 2
    assert saved["prompt"] == before["prompt"] and saved["layout"]["nodes"]["7"]["mode"] == 2
    with page.expect_download() as download:
        page.click('[data-action="export-api"]')
    api_path = tmp_path / "api.json"
    download.value.save_as(api_path)
    api = json.loads(api_path.read_text())
    assert "7" not in api and "negative" not in api["3"]["inputs"]
    assert api["3"]["class_type"] == "KSampler" and api["3"]["inputs"]["positive"] == ["6", 0]
    with page.expect_file_chooser() as chooser:
        page.click('[data-action="open-file"]')
    chooser.value.set_files(str(saved_path))
    page.wait_for_function("() => loom.tabs.current.name === 'saved'")
    reopened = editor.saved()
    assert reopened["prompt"] == before["prompt"]
    assert layout_positions(reopened) == layout_positions(before)
