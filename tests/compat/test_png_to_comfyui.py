"""Loom images carry a ComfyUI-readable ``workflow`` chunk (UI format) that converts back to the same graph."""

from __future__ import annotations

import json
from pathlib import Path

from engine.formats import convert_ui_to_api, from_saved, png_info, saved_to_ui, to_saved
from engine.registry import NodeRegistry

COMPAT = Path(__file__).resolve().parent
WORKFLOWS = COMPAT.parents[1] / "web" / "workflows"
OBJECT_INFO = json.loads((COMPAT / "object_info_core.json").read_text())


def test_saved_txt2img_becomes_ui_format_that_converts_back_exactly() -> None:
    saved = from_saved(json.loads((WORKFLOWS / "txt2img.loom.json").read_text()))
    ui = saved_to_ui({"prompt": saved.prompt, "layout": saved.layout}, OBJECT_INFO)
    assert {"nodes", "links", "last_node_id", "last_link_id", "version"} <= set(ui)
    ksampler = next(n for n in ui["nodes"] if n["type"] == "KSampler")
    assert ksampler["widgets_values"][:2] == [saved.prompt["3"]["inputs"]["seed"], "fixed"]
    back = convert_ui_to_api(ui, OBJECT_INFO)
    assert {k: {"class_type": v["class_type"], "inputs": v["inputs"]} for k, v in back.items()} == {
        k: {"class_type": v["class_type"], "inputs": v["inputs"]} for k, v in saved.prompt.items()
    }


def test_png_info_swaps_in_ui_format_and_keeps_loom_format() -> None:
    registry = NodeRegistry()
    saved = to_saved({"1": {"class_type": "Nope", "inputs": {}}}, {"nodes": {"1": {"pos": [1, 2]}}})
    info = png_info({"workflow": saved}, registry.object_info)
    assert info["loom_workflow"] == saved
    assert info["workflow"]["nodes"][0]["pos"] == [1, 2]
    ui_only = {"nodes": [], "links": []}
    assert png_info({"workflow": ui_only}, registry.object_info) == {"workflow": ui_only}
    assert png_info(None, registry.object_info) == {}
