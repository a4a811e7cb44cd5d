"""The editor's load path shows the compatibility report when a workflow uses node types the
server lacks (web/js/compat.js over POST /api/v1/workflows/check)."""

from __future__ import annotations

import json

import pytest

from tests.e2e.conftest import Editor

pytestmark = [pytest.mark.browser]


def ui_with_missing_nodes() -> dict:
    def node(id: int, type_: str, **props: str) -> dict:
        return {
            "id": id,
            "type": type_,
            "pos": [100 * id, 100],
            "size": [200, 80],
            "flags": {},
            "order": id,
            "mode": 0,
            "inputs": [],
            "outputs": [],
            "properties": props,
            "widgets_values": [],
        }

    return {
        "version": 0.4,
        "links": [],
        "nodes": [
            node(1, "StableZero123_Conditioning", cnr_id="comfy-core"),
            node(2, "FaceDetailer", cnr_id="comfyui-impact-pack", aux_id="ltdrdata/ComfyUI-Impact-Pack"),
            node(3, "Note"),
        ],
    }


def test_missing_node_types_are_reported_on_load(editor: Editor) -> None:
    editor.open()
    editor.drop_file("needs-packs.json", json.dumps(ui_with_missing_nodes()).encode(), "application/json")
    panel = editor.page.locator('[data-role="compat-report"]')
    panel.wait_for(timeout=10_000)
    core = panel.locator('[data-missing-node="StableZero123_Conditioning"]')
    assert core.get_attribute("data-kind") == "core"
    custom = panel.locator('[data-missing-node="FaceDetailer"]')
    assert (
        custom.get_attribute("data-kind") == "custom"
        and custom.get_attribute("data-pack") == "comfyui-impact-pack"
    )
    assert panel.locator("[data-missing-node]").count() == 2  # the Note is frontend-only
    editor.shot("compat-report")
    panel.locator('[data-action="close-report"]').click()
    assert editor.page.locator('[data-role="compat-report"]').count() == 0


def test_only_unknown_types_trigger_the_report(editor: Editor) -> None:
    editor.open()
    api = {
        "1": {"class_type": "PrimitiveString", "inputs": {"value": "x"}},
        "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}},
    }
    unknown = editor.page.evaluate(
        "async (wfs) => { const c = await import('./js/compat.js');"
        " return wfs.map((w) => c.unknownTypes(w, window.loom.info)); }",
        [api, ui_with_missing_nodes()],
    )
    assert unknown == [[], ["StableZero123_Conditioning", "FaceDetailer"]]
