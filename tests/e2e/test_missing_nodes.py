"""Missing node types in a real browser: a ComfyUI workflow with a custom node this server lacks
opens the compatibility report listing it; the node shows as a red placeholder with its ports,
links and widget values; saving (Loom's format and ComfyUI's) and loading again keeps all of it."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import Editor

pytestmark = [pytest.mark.browser, pytest.mark.slow]

MISSING = "FaceDetailerX"
VALUES = [640, True, "bbox/face_yolov8m.pt", 0.5, 42, "fixed", "keep me"]


def workflow() -> dict:
    def node(id: int, type_: str, inputs: list, outputs: list, wv: list, **extra) -> dict:
        return {
            "id": id,
            "type": type_,
            "pos": [60 + 380 * (id - 1), 120],
            "size": [300, 120],
            "flags": {},
            "order": id,
            "mode": 0,
            "inputs": inputs,
            "outputs": outputs,
            "properties": {"Node name for S&R": type_},
            "widgets_values": wv,
            **extra,
        }

    return {
        "version": 0.4,
        "last_node_id": 3,
        "last_link_id": 2,
        "groups": [],
        "config": {},
        "extra": {},
        "links": [[1, 1, 2, 2, 0, "VAE"], [2, 2, 0, 3, 0, "IMAGE"]],
        "nodes": [
            node(
                1,
                "CheckpointLoaderSimple",
                [],
                [
                    {"name": "MODEL", "type": "MODEL", "links": []},
                    {"name": "CLIP", "type": "CLIP", "links": []},
                    {"name": "VAE", "type": "VAE", "links": [1]},
                ],
                ["loom_demo_sd15.safetensors"],
            ),
            node(
                2,
                MISSING,
                [
                    {"name": "vae", "type": "VAE", "link": 1},
                    {"name": "guide_size", "type": "INT", "link": None, "widget": {"name": "guide_size"}},
                ],
                [{"name": "image", "type": "IMAGE", "links": [2]}],
                VALUES,
                properties={"Node name for S&R": MISSING, "cnr_id": "comfyui-impact-pack"},
            ),
            node(3, "PreviewImage", [{"name": "images", "type": "IMAGE", "link": 2}], [], []),
        ],
    }


def test_missing_node_dialog_placeholder_and_values_survive(editor: Editor) -> None:
    editor.open()
    page = editor.page
    page.evaluate("(ui) => loom.workflows.loadObject(ui, 'needs a pack')", workflow())
    page.wait_for_function("loom.tabs.current.name === 'needs a pack'")
    report = page.locator('[data-role="compat-report"]')
    report.wait_for(timeout=10_000)
    assert report.locator(f'[data-missing-node="{MISSING}"]').get_attribute("data-kind") == "custom"
    placeholder = editor.node("2")
    assert "missing" in placeholder.get_attribute("class")
    assert MISSING in placeholder.locator('[data-role="missing-type"]').inner_text()
    assert "keep me" in placeholder.locator('[data-kept="widgets_values"]').inner_text()
    # its ports stay, and so do its links
    assert (
        editor.port(placeholder, "vae", "in").count() == 1
        and editor.port(placeholder, "image", "out").count() == 1
    )
    assert page.locator('path.link[data-dst="2"][data-input="vae"]').count() == 1
    assert page.locator('path.link[data-dst="3"][data-input="images"]').count() == 1
    editor.shot("missing-node")

    # Loom's saved format → load again: the same placeholder, the same values and links
    saved = editor.saved()
    assert saved["layout"]["nodes"]["2"]["placeholder"]["widgets_values"] == VALUES
    page.evaluate("(s) => loom.workflows.loadObject(s, 'reloaded')", saved)
    page.wait_for_function("loom.tabs.current.name === 'reloaded'")
    assert editor.saved()["prompt"] == saved["prompt"]
    assert (
        editor.saved()["layout"]["nodes"]["2"]["placeholder"] == saved["layout"]["nodes"]["2"]["placeholder"]
    )
    assert "missing" in editor.node("2").get_attribute("class")
    # ComfyUI's UI format: the node goes out as it came in
    ui = page.evaluate("(async () => (await import('./js/uiformat.js')).toUi(loom.tabs.current.graph))()")
    out = next(n for n in ui["nodes"] if n["type"] == MISSING)
    assert out["widgets_values"] == VALUES
    assert [i["name"] for i in out["inputs"]] == ["vae", "guide_size"] and out["inputs"][1]["widget"] == {
        "name": "guide_size"
    }
    assert out["properties"]["cnr_id"] == "comfyui-impact-pack"
    vae_link = next(link for link in ui["links"] if link[3] == 2)
    assert vae_link[1] == 1 and vae_link[2] == 2 and out["inputs"][0]["link"] == vae_link[0]
    assert any(link[1] == 2 and link[3] == 3 for link in ui["links"])
