"""Malformed-but-JSON workflows: each is refused with a :class:`WorkflowFormatError` that names the
entry and the field (what was expected, what was found), never another exception; numbers that
only look like slots never index from the end of a list. Each case was a crash or a silent
misreading (issue 33, item 5; the crash sites the format fuzz test found)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from engine.formats import WorkflowFormatError, load_workflow, png_info
from engine.plugins.compat_check import check_workflow

COMPAT = Path(__file__).parents[2] / "compat"
OBJECT_INFO: dict[str, Any] = json.loads((COMPAT / "object_info_core.json").read_text())


def fixture(name: str) -> dict[str, Any]:
    return dict(json.loads((COMPAT / "workflows" / name).read_text()))


def link(ui: dict[str, Any], link_id: int) -> list[Any]:
    return next(entry for entry in ui["links"] if entry[0] == link_id)


def refused(workflow: Any) -> str:
    """The one-line message the workflow is refused with (the compatibility report says the same)."""
    with pytest.raises(WorkflowFormatError) as info:
        load_workflow(workflow, OBJECT_INFO)
    message = str(info.value)
    assert "\n" not in message
    assert check_workflow(workflow, OBJECT_INFO).error == message
    return message


# --- slots count from 0 ---------------------------------------------------------------------------
def test_a_negative_slot_out_of_a_subgraph_instance_is_refused_not_taken_from_the_end() -> None:
    ui = fixture("subgraph.json")
    link(ui, 4)[2] = -1  # KSampler 3's positive from output -1 of the subgraph instance 11
    message = refused(ui)
    assert "link 4" in message and "node 11 slot -1" in message and "slots count from 0" in message


def test_a_negative_slot_from_a_bypassed_node_is_refused_not_taken_from_the_end() -> None:
    ui = fixture("muted_bypassed.json")
    link(ui, 1)[2] = -1  # KSampler 3's model from output -1 of the bypassed LoraLoader 10
    message = refused(ui)
    assert "link 1" in message and "node 10 slot -1" in message


def test_a_negative_slot_inside_a_subgraph_definition_names_the_instance() -> None:
    ui = fixture("subgraph.json")
    ui["definitions"]["subgraphs"][0]["links"][3]["origin_slot"] = -1
    message = refused(ui)
    assert message.startswith("node 11 (subgraph ") and "link 4" in message and "slot -1" in message


def test_a_negative_slot_in_a_group_node_definition_names_the_group_node() -> None:
    ui = fixture("group_node.json")
    ui["extra"]["groupNodes"]["Sample and decode"]["links"][0][1] = -1
    message = refused(ui)
    assert "group node 10 (workflow>Sample and decode)" in message and "negative" in message


def test_a_saved_workflow_reading_a_negative_output_of_a_bypassed_node_is_refused() -> None:
    saved = fixture("saved_v2.json")
    saved["layout"]["nodes"]["6"] = {"mode": 4}  # CLIPTextEncode 6 bypassed
    saved["prompt"]["3"]["inputs"]["positive"] = ["6", -1]
    message = refused(saved)
    assert "node '3' input 'positive'" in message and "output -1 of bypassed node '6'" in message


@pytest.mark.parametrize(
    "slot",
    [float("inf"), 1.5, "x", None, [0], "²", "9" * 5000],
    ids=["inf", "1.5", "x", "null", "list", "²", "5000 digits"],
)
def test_a_slot_that_is_not_a_whole_number_is_refused(slot: Any) -> None:
    ui = fixture("txt2img.json")
    ui["links"][0][2] = slot
    assert "expected links as [id, from_node, from_slot, to_node, to_slot, type]" in refused(ui)


# --- containers of the wrong kind --------------------------------------------------------------------
@pytest.mark.parametrize("entry", ["a string", 7, None, ["nodes"]])
def test_a_group_node_definition_that_is_not_an_object_is_refused(entry: Any) -> None:
    ui = fixture("group_node.json")
    ui["extra"]["groupNodes"]["Sample and decode"] = entry
    message = refused(ui)
    assert "extra.groupNodes['Sample and decode'] must be an object" in message


def test_group_nodes_that_are_not_an_object_are_refused() -> None:
    ui = fixture("group_node.json")
    ui["extra"]["groupNodes"] = [1, 2]
    assert "'extra.groupNodes' must be an object" in refused(ui)


@pytest.mark.parametrize(
    "field, value, phrase",
    [
        ("nodes", "KSampler", "'nodes' must be a list"),
        ("external", 3, "'external' must be a list"),
        ("external", [["x", 0, "IMAGE"]], "'external' entries must be [node index, output slot, type]"),
    ],
)
def test_a_malformed_group_node_definition_names_the_field(field: str, value: Any, phrase: str) -> None:
    ui = fixture("group_node.json")
    ui["extra"]["groupNodes"]["Sample and decode"][field] = value
    assert phrase in refused(ui)


def test_a_group_node_inner_index_that_is_not_a_number_is_refused() -> None:
    ui = fixture("group_node.json")
    ui["extra"]["groupNodes"]["Sample and decode"]["nodes"][1]["index"] = "first"
    message = refused(ui)
    assert "group node 10" in message and "nodes[1] (VAEDecode): 'index' must be a whole number" in message


@pytest.mark.parametrize("subgraphs", [5, "x", {"id": "a"}])
def test_subgraph_definitions_that_are_not_a_list_are_refused(subgraphs: Any) -> None:
    ui = fixture("subgraph.json")
    ui["definitions"]["subgraphs"] = subgraphs
    assert "'definitions.subgraphs' must be a list of subgraph definitions" in refused(ui)


@pytest.mark.parametrize(
    "change, phrase",
    [
        (lambda d: d.pop("id"), "definitions.subgraphs[0]: 'id' must be a string"),
        (lambda d: d.update(id=["x"]), "definitions.subgraphs[0]: 'id' must be a string"),
        (lambda d: d.update(nodes=None), "definitions.subgraphs[0] (8f5c0b1e"),
        (lambda d: d.update(links=7), "expected 'links' to be a list, found a number"),
    ],
)
def test_a_malformed_subgraph_definition_names_the_field(change: Callable[[Any], Any], phrase: str) -> None:
    ui = fixture("subgraph.json")
    change(ui["definitions"]["subgraphs"][0])
    assert phrase in refused(ui)


def test_a_subgraph_definition_that_is_not_an_object_is_refused() -> None:
    ui = fixture("subgraph.json")
    ui["definitions"]["subgraphs"].append("extra")
    assert "definitions.subgraphs[1] must be an object" in refused(ui)


@pytest.mark.parametrize("node_id", [[4], {"id": 4}, True])
def test_a_node_id_that_is_neither_a_number_nor_a_string_is_refused(node_id: Any) -> None:
    ui = fixture("txt2img.json")
    ui["nodes"][0]["id"] = node_id
    assert "'id' must be a number or a string" in refused(ui)


# --- ids that look like numbers ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "node_id", ["²", "9" * 5000, "١٢"], ids=["superscript", "5000 digits", "arabic-indic"]
)
def test_an_id_python_cannot_turn_into_an_int_still_converts(node_id: str) -> None:
    ui = fixture("txt2img.json")
    old = ui["nodes"][0]["id"]
    ui["nodes"][0]["id"] = node_id
    for entry in ui["links"]:
        entry[1] = node_id if entry[1] == old else entry[1]
        entry[3] = node_id if entry[3] == old else entry[3]
    prompt = load_workflow(ui, OBJECT_INFO).prompt
    assert node_id in prompt


@pytest.mark.parametrize("link_id", ["²", "9" * 5000], ids=["superscript", "5000 digits"])
def test_an_input_whose_link_id_is_no_number_is_an_unlinked_input(link_id: str) -> None:
    ui = fixture("txt2img.json")
    node = next(n for n in ui["nodes"] if n["type"] == "VAEDecode")
    node["inputs"][0]["link"] = link_id
    prompt = load_workflow(ui, OBJECT_INFO).prompt
    assert "samples" not in prompt[str(node["id"])]["inputs"]


# --- the saved format -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "change, phrase",
    [
        (lambda s: s.update(layout=[1, 2]), 'saved format v1: "layout" must be an object'),
        (
            lambda s: s["layout"]["4"].update(pos=5),
            'layout of node \'4\': "pos" must be an object {"x", "y"}',
        ),
        (lambda s: s["layout"]["4"].update(size=[1, 2]), '"size" must be an object {"width", "height"}'),
        (lambda s: s["layout"]["4"].update(pos={"x": "left", "y": 0}), '"pos" must be [2 numbers]'),
    ],
)
def test_a_malformed_v1_layout_names_the_node_and_field(change: Callable[[Any], Any], phrase: str) -> None:
    saved = fixture("saved_v1.json")
    change(saved)
    assert phrase in refused(saved)


@pytest.mark.parametrize(
    "change, phrase",
    [
        (lambda s: s.update(layout=5), 'saved format: "layout" must be an object'),
        (lambda s: s.update(layout=[["nodes", {}]]), 'saved format: "layout" must be an object'),
        (
            lambda s: s["layout"]["nodes"]["4"].update(pos="top"),
            "layout of node '4': \"pos\" must be [2 numbers]",
        ),
        (lambda s: s["layout"]["nodes"]["3"].update(mode="bypass"), "layout of node '3': \"mode\" must be 0"),
        (
            lambda s: s["layout"].update(subgraphs=5),
            'layout "subgraphs" must be a list of subgraph definitions',
        ),
    ],
)
def test_a_malformed_v2_layout_names_the_node_and_field(change: Callable[[Any], Any], phrase: str) -> None:
    saved = fixture("saved_v2.json")
    change(saved)
    assert phrase in refused(saved)


def test_the_png_metadata_of_a_saved_workflow_with_a_negative_link_slot_is_still_written() -> None:
    saved = fixture("saved_v2.json")
    saved["prompt"]["8"]["inputs"]["vae"] = ["4", -(10**400)]  # validation names it; the metadata is kept
    ui = png_info({"workflow": saved}, lambda: OBJECT_INFO)["workflow"]
    assert any(entry[2] == -(10**400) and entry[5] == "*" for entry in ui["links"])


def test_a_huge_integer_widget_value_is_reported_not_a_crash() -> None:
    ui = fixture("txt2img.json")
    sampler = next(n for n in ui["nodes"] if n["type"] == "KSampler")
    sampler["widgets_values"][0] = 10**400  # the seed
    report = check_workflow(ui, OBJECT_INFO)
    assert report.error is None
