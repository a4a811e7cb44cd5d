"""Every shipped example workflow exists in API format and Loom's saved format, and they agree."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.formats import from_saved, load_workflow_file

WORKFLOWS = Path(__file__).resolve().parents[2] / "web" / "workflows"
NAMES = sorted(p.name.removesuffix(".api.json") for p in WORKFLOWS.glob("*.api.json"))


def test_the_core_examples_are_shipped() -> None:
    assert {"txt2img", "img2img", "lora", "sdxl", "inpaint", "ipadapter", "safety"} <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_saved_twin_holds_the_same_graph_with_a_layout(name: str) -> None:
    api = json.loads((WORKFLOWS / f"{name}.api.json").read_text())
    saved = from_saved(json.loads((WORKFLOWS / f"{name}.loom.json").read_text()))
    assert saved.prompt == api
    assert set(saved.layout["nodes"]) == set(api)
    loaded = load_workflow_file(WORKFLOWS / f"{name}.loom.json", {})
    assert loaded.source_format == "loom" and loaded.prompt == api
