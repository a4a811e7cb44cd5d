"""UI-format files in the shapes ComfyUI's frontend writes, compared with the API format the
frontend's ``graphToPrompt`` sends for them (expected files written by following its rules:
positional ``widgets_values`` with control-after-generate companions, defaults for widgets an
older save lacks, surplus values ignored, upload buttons never sent, links winning over widget
values, Reroute/PrimitiveNode/Note/MarkdownNote dissolved, bypass and mute)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from engine.formats import ConversionProblem, WorkflowFormatError, convert_ui_to_api, load_workflow
from engine.registry import NodeRegistry

HERE = Path(__file__).parent
WORKFLOWS = HERE / "workflows"


@pytest.fixture(scope="module")
def object_info() -> dict[str, Any]:
    return json.loads((HERE / "object_info_core.json").read_text())


def load(name: str) -> Any:
    return json.loads((WORKFLOWS / name).read_text())


def one_node(type_: str, widgets: Any, **extra: Any) -> dict[str, Any]:
    node = {
        "id": 1,
        "type": type_,
        "pos": [0, 0],
        "size": [200, 100],
        "flags": {},
        "order": 0,
        "mode": 0,
        "inputs": [],
        "outputs": [],
        "properties": {},
        "widgets_values": widgets,
        **extra,
    }
    return {"nodes": [node], "links": [], "version": 0.4}


def test_frontend_shapes_match_the_frontends_api_output(object_info: dict[str, Any]) -> None:
    assert convert_ui_to_api(load("frontend_shapes.json"), object_info) == load("frontend_shapes.api.json")


def test_frontend_shapes_report_what_was_filled_or_dropped(object_info: dict[str, Any]) -> None:
    problems: list[ConversionProblem] = []
    convert_ui_to_api(load("frontend_shapes.json"), object_info, problems)
    assert [str(p) for p in problems] == [
        "node 5 (EmptyLatentImage): the file stores no value for widget 'batch_size'; its default 1 is used",
        "node 14 (KSampler): 2 surplus widget value(s) ignored: ['surplus', 3]",
    ]
    assert {p.level for p in problems} == {"note"}


@pytest.mark.parametrize("control", ["randomize", "fixed", "increment", "decrement", True, False, None])
def test_every_stored_form_of_the_control_value_is_skipped(control: Any, object_info: dict[str, Any]) -> None:
    ui = one_node("KSampler", [11, control, 30, 4.5, "heun", "simple", 0.5])
    assert convert_ui_to_api(ui, object_info)["1"]["inputs"] == {
        "seed": 11,
        "steps": 30,
        "cfg": 4.5,
        "sampler_name": "heun",
        "scheduler": "simple",
        "denoise": 0.5,
    }


def test_shifted_values_are_reported_as_warnings(object_info: dict[str, Any]) -> None:
    # a file from a version whose KSampler had one more widget after the seed: every value shifts
    problems: list[ConversionProblem] = []
    convert_ui_to_api(
        one_node("KSampler", [11, "randomize", 0.7, 30, 4.5, "heun", "simple", 0.5]), object_info, problems
    )
    warnings = [p.message.split(" but ")[0] for p in problems if p.level == "warning"]
    assert warnings == [
        "widget 'steps' expects an integer",
        "widget 'sampler_name' expects one of ['euler', 'euler_ancestral', 'heun', 'dpmpp_2m']",
        "widget 'denoise' expects a number",
    ]


COMBO_INFO = {
    "Picker": {
        "input": {
            "required": {
                "style": [["a", "b", "c"], {"control_after_generate": True}],
                "ratio": ["FLOAT", {"default": 0.5, "control_after_generate": True}],
                "label": ["STRING", {}],
            }
        },
        "input_order": {"required": ["style", "ratio", "label"]},
        "output": [],
        "display_name": "Picker",
    }
}


def test_combo_control_has_a_filter_value_and_float_controls_one(object_info: dict[str, Any]) -> None:
    ui = one_node("Picker", ["b", "increment", "/a|b/", 0.25, "fixed", "hello"])
    assert convert_ui_to_api(ui, COMBO_INFO)["1"]["inputs"] == {"style": "b", "ratio": 0.25, "label": "hello"}
    without_controls = one_node("Picker", ["c", 0.75, "x"])
    assert convert_ui_to_api(without_controls, COMBO_INFO)["1"]["inputs"] == {
        "style": "c",
        "ratio": 0.75,
        "label": "x",
    }


def test_upload_button_value_is_stored_but_not_sent() -> None:
    info = {
        "LoadImageMask": {
            "input": {
                "required": {"image": [["m.png"], {"image_upload": True}], "channel": [["alpha", "red"], {}]}
            },
            "input_order": {"required": ["image", "channel"]},
            "output": ["MASK"],
            "display_name": "Load Image (as Mask)",
        }
    }
    api = convert_ui_to_api(one_node("LoadImageMask", ["m.png", "red", "image"]), info)
    assert api["1"]["inputs"] == {"image": "m.png", "channel": "red"}


def test_defaults_fill_widgets_an_older_save_lacks() -> None:
    info = {
        "Grown": {
            "input": {
                "required": {
                    "a": ["INT", {"default": 3}],
                    "b": ["FLOAT", {"min": 0.5}],
                    "c": [["x", "y"], {}],
                    "d": ["BOOLEAN", {}],
                },
                "optional": {"e": ["STRING", {}]},
            },
            "input_order": {"required": ["a", "b", "c", "d"], "optional": ["e"]},
            "output": [],
        }
    }
    assert convert_ui_to_api(one_node("Grown", [7]), info)["1"]["inputs"] == {
        "a": 7,
        "b": 0.5,
        "c": "x",
        "d": False,
        "e": "",
    }


def test_array_values_are_wrapped_like_the_frontend_and_unwrapped_on_load() -> None:
    info = {
        "Multi": {
            "input": {"required": {"tags": ["COMBO", {"options": ["p", "q"], "multi_select": True}]}},
            "input_order": {"required": ["tags"]},
            "output": ["STRING"],
            "output_node": True,
        }
    }
    ui = one_node("Multi", {"tags": ["p", "q"]})
    assert convert_ui_to_api(ui, info)["1"]["inputs"] == {"tags": {"__value__": ["p", "q"]}}
    assert load_workflow(ui, info).prompt["1"]["inputs"] == {"tags": ["p", "q"]}


def test_impossible_conversions_name_node_type_and_expectation(object_info: dict[str, Any]) -> None:
    with pytest.raises(
        WorkflowFormatError, match=r"node 1 \(KSampler\): expected 'widgets_values' to be a list"
    ):
        convert_ui_to_api(one_node("KSampler", "42"), object_info)
    definition = {
        "id": "sg",
        "inputs": [],
        "outputs": [],
        "nodes": [],
        "links": [{"id": 1, "origin_id": -10}],
    }
    ui = one_node("sg", [])
    ui["definitions"] = {"subgraphs": [definition]}
    with pytest.raises(WorkflowFormatError, match=r"node 1 \(subgraph sg\): expected links as"):
        convert_ui_to_api(ui, object_info)


def test_loom_catalogue_converts_a_comfyui_ksampler_without_shifting() -> None:
    from nodes import register_core

    registry = NodeRegistry()
    register_core(registry)
    info = registry.object_info()
    api = convert_ui_to_api(load("frontend_shapes.json"), info)
    assert api["3"]["inputs"]["steps"] == 20 and api["3"]["inputs"]["sampler_name"] == "euler"
    assert (
        api["13"]["inputs"]["end_at_step"] == 30
        and api["13"]["inputs"]["return_with_leftover_noise"] == "disable"
    )
    assert "guidance_rescale" not in info["KSampler"]["input"].get("optional", {})


def test_conversion_leaves_its_argument_alone(object_info: dict[str, Any]) -> None:
    ui = load("frontend_shapes.json")
    before = copy.deepcopy(ui)
    convert_ui_to_api(ui, object_info, [])
    assert ui == before
