"""The value nodes (nodes/text/values.py): the seed widget, and a colour split into RGB integer, hex
and alpha, with the colour widget's text passing validation and a bad colour teaching its form."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.context import Folders, NodeContext
from engine.registry import NodeRegistry
from engine.validate import validate_node
from nodes.text import values as v


@pytest.fixture
def ctx(tmp_path: Path) -> NodeContext:
    return NodeContext(node_id="1", prompt_id="p", folders=Folders(tmp_path, tmp_path, tmp_path))


def test_seed_passes_its_value_and_defaults_to_fixed(ctx: NodeContext) -> None:
    assert v.SeedNode().run(ctx, seed=123) == (123,)
    seed = v.SeedNode.SCHEMA.export()["input"]["required"]["seed"][1]
    assert seed["control_after_generate"] == "fixed" and seed["max"] == 2**63 - 1


def test_color_to_rgb_int(ctx: NodeContext) -> None:
    node = v.ColorToRGBInt()
    assert node.run(ctx, color="#ff8000") == (0xFF8000, "#ff8000", 1.0)
    assert node.run(ctx, color="#00000080") == (0, "#000000", 128 / 255)
    for bad in ("ff8000", "#ff80", "#gg0000", "#ff800000ff"):
        with pytest.raises(v.ColorError, match="color: expected '#RRGGBB' or '#RRGGBBAA'"):
            node.run(ctx, color=bad)


def test_a_typed_colour_passes_validation() -> None:
    registry = NodeRegistry()
    registry.register_all(v.NODES)
    prompt = {"1": {"class_type": "ColorToRGBInt", "inputs": {"color": "#102030"}}}
    issues, constants = validate_node("1", prompt, registry)
    assert issues == [] and constants == {"color": "#102030"}
