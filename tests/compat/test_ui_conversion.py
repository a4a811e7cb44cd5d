"""ComfyUI UI-format → API-format conversion on UI-format files written the way ComfyUI's frontend
saves them (tests/compat/workflows/*.json), against ComfyUI-shaped object_info entries for the
core nodes they use (tests/compat/object_info_core.json)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from engine.formats import WorkflowFormatError, convert_ui_to_api, detect_format

HERE = Path(__file__).parent
WORKFLOWS = HERE / "workflows"


@pytest.fixture(scope="module")
def object_info() -> dict[str, Any]:
    return json.loads((HERE / "object_info_core.json").read_text())


def load(name: str) -> dict[str, Any]:
    return json.loads((WORKFLOWS / name).read_text())


def ckpt() -> dict[str, Any]:
    return {
        "class_type": "CheckpointLoaderSimple",
        "inputs": {"ckpt_name": "sd15.safetensors"},
        "_meta": {"title": "Load Checkpoint"},
    }


def encode(text: str, clip: list[Any], title: str = "CLIP Text Encode (Prompt)") -> dict[str, Any]:
    return {"class_type": "CLIPTextEncode", "inputs": {"text": text, "clip": clip}, "_meta": {"title": title}}


def latent(width: Any, height: Any, batch: Any) -> dict[str, Any]:
    return {
        "class_type": "EmptyLatentImage",
        "inputs": {"width": width, "height": height, "batch_size": batch},
        "_meta": {"title": "Empty Latent Image"},
    }


def ksampler(
    seed: int,
    steps: int,
    cfg: float,
    sampler: str,
    scheduler: str,
    denoise: float,
    positive: list[Any],
    negative: list[Any],
    model: list[Any] | None = None,
) -> dict[str, Any]:
    return {
        "class_type": "KSampler",
        "inputs": {
            "model": model or ["4", 0],
            "seed": seed,
            "steps": steps,
            "cfg": cfg,
            "sampler_name": sampler,
            "scheduler": scheduler,
            "positive": positive,
            "negative": negative,
            "latent_image": ["5", 0],
            "denoise": denoise,
        },
        "_meta": {"title": "KSampler"},
    }


def decode(samples: list[Any], vae: list[Any] | None = None) -> dict[str, Any]:
    inputs: dict[str, Any] = {"samples": samples} if samples else {}
    inputs["vae"] = vae or ["4", 2]
    return {"class_type": "VAEDecode", "inputs": inputs, "_meta": {"title": "VAE Decode"}}


def save(images: list[Any], prefix: str) -> dict[str, Any]:
    return {
        "class_type": "SaveImage",
        "inputs": {"images": images, "filename_prefix": prefix},
        "_meta": {"title": "Save Image"},
    }


# --- the fixture files ------------------------------------------------------------------------
def test_txt2img_default_graph(object_info: dict[str, Any]) -> None:
    ui = load("txt2img.json")
    assert detect_format(ui) == "ui"
    assert convert_ui_to_api(ui, object_info) == {
        "3": ksampler(
            156680208700286, 20, 8, "euler", "normal", 1, ["6", 0], ["7", 0]
        ),  # "randomize" skipped
        "4": ckpt(),
        "5": latent(512, 512, 1),
        "6": encode("beautiful scenery nature glass bottle landscape, , purple galaxy bottle,", ["4", 1]),
        "7": encode("text, watermark", ["4", 1], title="Negative prompt"),
        "8": decode(["3", 0]),
        "9": save(["8", 0], "ComfyUI"),
        # the Note (10) is frontend-only: never emitted
    }


def test_muted_and_bypassed_nodes(object_info: dict[str, Any]) -> None:
    api = convert_ui_to_api(load("muted_bypassed.json"), object_info)
    assert api == {
        # the bypassed LoRA (10) passes its MODEL and CLIP inputs through to its consumers
        "3": ksampler(42, 25, 6.5, "dpmpp_2m", "karras", 1, ["6", 0], ["7", 0], model=["4", 0]),
        "4": ckpt(),
        "5": latent(768, 512, 2),
        "6": encode("a lighthouse at dusk", ["4", 1]),
        "7": encode("blurry", ["4", 1]),
        "8": decode(["3", 0]),
        "9": save(["8", 0], "lighthouse"),
        # the muted upscale (11) is dropped and the input that read it removed (validation will
        # report the missing input); the muted SaveImage (14) is dropped
        "12": decode([]),
        "13": {
            "class_type": "PreviewImage",
            "inputs": {"images": ["12", 0]},
            "_meta": {"title": "Preview Image"},
        },
    }


def test_reroutes_and_primitive_nodes(object_info: dict[str, Any]) -> None:
    api = convert_ui_to_api(load("reroute_primitive.json"), object_info)
    assert api == {
        # the seed comes from the "Seed" PrimitiveNode, not the stale widget value 1
        "3": ksampler(987654321, 30, 7.5, "euler_ancestral", "karras", 0.9, ["6", 0], ["7", 0]),
        "4": ckpt(),
        "5": latent(640, 448, 1),
        # one PrimitiveNode drives both prompts, the second through a Reroute
        "6": encode("a red fox in snow", ["4", 1]),
        "7": encode("a red fox in snow", ["4", 1]),
        "8": decode(["3", 0], vae=["4", 2]),  # through two chained Reroutes
        "9": save(["8", 0], "ComfyUI"),
    }


def test_converted_widget_dict_values_and_unknown_class(object_info: dict[str, Any]) -> None:
    api = convert_ui_to_api(load("converted_widget.json"), object_info)
    assert api == {
        "3": {
            "class_type": "KSamplerAdvanced",
            "inputs": {
                "model": ["4", 0],
                "add_noise": "enable",
                "noise_seed": 5,
                "steps": 12,
                "cfg": 5.0,
                "sampler_name": "euler",
                "scheduler": "simple",
                "positive": ["6", 0],
                "negative": ["7", 0],
                "latent_image": ["5", 0],
                "start_at_step": 0,
                "end_at_step": 10000,
                "return_with_leftover_noise": "disable",
            },
            "_meta": {"title": "KSampler (Advanced)"},
        },
        "4": ckpt(),
        # width and height are widgets converted to inputs, linked to a PrimitiveInt node:
        # the link wins over the dict-form widgets_values
        "5": latent(["50", 0], ["50", 0], 4),
        "6": encode("a cathedral, volumetric light", ["4", 1]),
        "7": encode("lowres", ["4", 1]),
        "8": decode(["3", 0]),
        "9": save(["8", 0], "cathedral"),
        "50": {"class_type": "PrimitiveInt", "inputs": {"value": 768}, "_meta": {"title": "Int"}},
        # an unknown class is kept as it is, without widget mapping; validation reports it
        "60": {
            "class_type": "ImpactWildcardProcessor",
            "inputs": {},
            "_meta": {"title": "Custom node not installed"},
        },
    }


def test_group_node_is_flattened(object_info: dict[str, Any]) -> None:
    api = convert_ui_to_api(load("group_node.json"), object_info)
    assert api == {
        "4": ckpt(),
        "5": latent(512, 768, 1),
        "6": encode("portrait of an astronaut", ["4", 1]),
        "7": encode("cartoon", ["4", 1]),
        "9": save(["10:1", 0], "astronaut"),
        # the group node's own widgets_values win over the ones stored in its definition
        "10:0": ksampler(31337, 28, 7, "dpmpp_2m", "karras", 1, ["6", 0], ["7", 0]),
        "10:1": decode(["10:0", 0]),
    }


def test_subgraph_is_flattened(object_info: dict[str, Any]) -> None:
    api = convert_ui_to_api(load("subgraph.json"), object_info)
    assert api == {
        "3": ksampler(7, 20, 8, "euler", "normal", 1, ["11:1", 0], ["11:2", 0]),
        "4": ckpt(),
        "5": latent(512, 512, 1),
        "8": decode(["3", 0]),
        "9": save(["8", 0], "village"),
        # "text" is promoted to a widget on the instance: its value reaches the inner node
        "11:1": encode("a snowy mountain village at night", ["4", 1], title="Positive"),
        "11:2": encode("ugly, deformed", ["4", 1]),
    }


UI_FILES = [
    "txt2img.json",
    "muted_bypassed.json",
    "reroute_primitive.json",
    "converted_widget.json",
    "group_node.json",
    "subgraph.json",
]


@pytest.mark.parametrize("name", UI_FILES)
def test_conversion_does_not_modify_its_argument(name: str, object_info: dict[str, Any]) -> None:
    ui = load(name)
    before = copy.deepcopy(ui)
    convert_ui_to_api(ui, object_info)
    assert ui == before


# --- rules in isolation -----------------------------------------------------------------------
def ui_graph(nodes: list[dict[str, Any]], links: list[Any], **extra: Any) -> dict[str, Any]:
    return {
        "last_node_id": 99,
        "last_link_id": 99,
        "nodes": nodes,
        "links": links,
        "groups": [],
        "config": {},
        "extra": {},
        "version": 0.4,
        **extra,
    }


def n(
    id: int,
    type: str,
    widgets: Any = None,
    inputs: list[Any] | None = None,
    outputs: list[Any] | None = None,
    mode: int = 0,
    **extra: Any,
) -> dict[str, Any]:
    node = {
        "id": id,
        "type": type,
        "pos": [0, 0],
        "size": [200, 100],
        "flags": {},
        "order": 0,
        "mode": mode,
        "inputs": inputs or [],
        "outputs": outputs or [],
        "properties": {},
        **extra,
    }
    if widgets is not None:
        node["widgets_values"] = widgets
    return node


def test_seed_without_control_value_is_not_shifted(object_info: dict[str, Any]) -> None:
    ui = ui_graph([n(3, "KSampler", [5, 20, 8, "euler", "normal", 1])], [])
    inputs = convert_ui_to_api(ui, object_info)["3"]["inputs"]
    assert inputs == {
        "seed": 5,
        "steps": 20,
        "cfg": 8,
        "sampler_name": "euler",
        "scheduler": "normal",
        "denoise": 1,
    }


def test_control_lookalike_value_is_kept_when_no_room_for_a_control_widget(
    object_info: dict[str, Any],
) -> None:
    info = {
        "Seeded": {
            "input": {
                "required": {"seed": ["INT", {"control_after_generate": True}], "label": ["STRING", {}]}
            },
            "input_order": {"required": ["seed", "label"]},
            "output": [],
            "display_name": "Seeded",
        }
    }
    ui = ui_graph([n(1, "Seeded", [3, "fixed"])], [])
    assert convert_ui_to_api(ui, info)["1"]["inputs"] == {"seed": 3, "label": "fixed"}
    ui = ui_graph([n(1, "Seeded", [3, "increment", "fixed"])], [])
    assert convert_ui_to_api(ui, info)["1"]["inputs"] == {"seed": 3, "label": "fixed"}


def test_force_input_and_optional_widgets(object_info: dict[str, Any]) -> None:
    info = {
        "Mixed": {
            "input": {
                "required": {"a": ["INT", {"forceInput": True}], "b": ["FLOAT", {}]},
                "optional": {"c": [["x", "y"], {}], "d": ["COMBO", {"options": ["p", "q"]}]},
            },
            "input_order": {"required": ["a", "b"], "optional": ["c", "d"]},
            "output": [],
        }
    }
    ui = ui_graph([n(1, "Mixed", [0.5, "y", "q"])], [])
    assert convert_ui_to_api(ui, info)["1"] == {
        "class_type": "Mixed",
        "inputs": {"b": 0.5, "c": "y", "d": "q"},
        "_meta": {"title": "Mixed"},
    }


def test_bypassed_node_without_matching_input_removes_the_link(object_info: dict[str, Any]) -> None:
    ui = ui_graph(
        [
            n(
                5,
                "EmptyLatentImage",
                [512, 512, 1],
                outputs=[{"name": "LATENT", "type": "LATENT", "links": [1]}],
                mode=4,
            ),
            n(8, "VAEDecode", inputs=[{"name": "samples", "type": "LATENT", "link": 1}]),
        ],
        [[1, 5, 0, 8, 0, "LATENT"]],
    )
    assert convert_ui_to_api(ui, object_info) == {
        "8": {"class_type": "VAEDecode", "inputs": {}, "_meta": {"title": "VAE Decode"}}
    }


def test_bypass_chain_and_same_index_preference(object_info: dict[str, Any]) -> None:
    # Two bypassed LoRAs in a row: CLIP (slot 1) passes through the CLIP input of each.
    lora = [{"name": "model", "type": "MODEL", "link": None}, {"name": "clip", "type": "CLIP", "link": None}]
    a = n(
        10,
        "LoraLoader",
        ["detail.safetensors", 1, 1],
        inputs=copy.deepcopy(lora),
        mode=4,
        outputs=[
            {"name": "MODEL", "type": "MODEL", "links": []},
            {"name": "CLIP", "type": "CLIP", "links": [3]},
        ],
    )
    b = n(
        11,
        "LoraLoader",
        ["style.safetensors", 1, 1],
        inputs=copy.deepcopy(lora),
        mode=4,
        outputs=[
            {"name": "MODEL", "type": "MODEL", "links": []},
            {"name": "CLIP", "type": "CLIP", "links": [4]},
        ],
    )
    a["inputs"][0]["link"], a["inputs"][1]["link"] = 1, 2
    b["inputs"][1]["link"] = 3
    ui = ui_graph(
        [
            n(4, "CheckpointLoaderSimple", ["sd15.safetensors"]),
            a,
            b,
            n(6, "CLIPTextEncode", ["hi"], inputs=[{"name": "clip", "type": "CLIP", "link": 4}]),
        ],
        [
            [1, 4, 0, 10, 0, "MODEL"],
            [2, 4, 1, 10, 1, "CLIP"],
            [3, 10, 1, 11, 1, "CLIP"],
            [4, 11, 1, 6, 0, "CLIP"],
        ],
    )
    assert convert_ui_to_api(ui, object_info)["6"]["inputs"] == {"text": "hi", "clip": ["4", 1]}


def test_reroute_without_input_keeps_widget_and_reroute_loop_is_removed(object_info: dict[str, Any]) -> None:
    ui = ui_graph(
        [
            n(
                20,
                "Reroute",
                inputs=[{"name": "", "type": "*", "link": None}],
                outputs=[{"name": "", "type": "STRING", "links": [1]}],
            ),
            n(
                6,
                "CLIPTextEncode",
                ["kept"],
                inputs=[{"name": "text", "type": "STRING", "link": 1, "widget": {"name": "text"}}],
            ),
            n(
                21,
                "Reroute",
                inputs=[{"name": "", "type": "*", "link": 3}],
                outputs=[{"name": "", "type": "*", "links": [2, 4]}],
            ),
            n(
                22,
                "Reroute",
                inputs=[{"name": "", "type": "*", "link": 2}],
                outputs=[{"name": "", "type": "*", "links": [3]}],
            ),
            n(
                7,
                "CLIPTextEncode",
                ["dropped"],
                inputs=[{"name": "text", "type": "STRING", "link": 4, "widget": {"name": "text"}}],
            ),
        ],
        [
            [1, 20, 0, 6, 0, "STRING"],
            [2, 21, 0, 22, 0, "*"],
            [3, 22, 0, 21, 0, "*"],
            [4, 21, 0, 7, 0, "STRING"],
        ],
    )
    api = convert_ui_to_api(ui, object_info)
    assert api["6"]["inputs"] == {"text": "kept"}
    assert api["7"]["inputs"] == {}


def test_dangling_link_keeps_the_widget_value(object_info: dict[str, Any]) -> None:
    ui = ui_graph(
        [
            n(
                5,
                "EmptyLatentImage",
                [640, 480, 1],
                inputs=[{"name": "width", "type": "INT", "link": 77, "widget": {"name": "width"}}],
            )
        ],
        [],
    )
    assert convert_ui_to_api(ui, object_info)["5"]["inputs"] == {"width": 640, "height": 480, "batch_size": 1}


def test_version_1_links_as_objects(object_info: dict[str, Any]) -> None:
    ui = ui_graph(
        [
            n(4, "CheckpointLoaderSimple", ["sd15.safetensors"]),
            n(6, "CLIPTextEncode", ["x"], inputs=[{"name": "clip", "type": "CLIP", "link": 1}]),
        ],
        [{"id": 1, "origin_id": 4, "origin_slot": 1, "target_id": 6, "target_slot": 0, "type": "CLIP"}],
        version=1,
    )
    assert convert_ui_to_api(ui, object_info)["6"]["inputs"] == {"text": "x", "clip": ["4", 1]}


def nested_subgraphs(outer_mode: int = 0) -> dict[str, Any]:
    inner_def = {
        "id": "inner-uuid",
        "name": "Inner",
        "inputs": [{"name": "clip", "type": "CLIP"}],
        "outputs": [{"name": "cond", "type": "CONDITIONING"}],
        "nodes": [
            n(
                1,
                "CLIPTextEncode",
                ["deep"],
                inputs=[{"name": "clip", "type": "CLIP", "link": 1}],
                outputs=[{"name": "CONDITIONING", "type": "CONDITIONING", "links": [2]}],
            )
        ],
        "links": [
            {"id": 1, "origin_id": -10, "origin_slot": 0, "target_id": 1, "target_slot": 0, "type": "CLIP"},
            {
                "id": 2,
                "origin_id": 1,
                "origin_slot": 0,
                "target_id": -20,
                "target_slot": 0,
                "type": "CONDITIONING",
            },
        ],
    }
    outer_def = {
        "id": "outer-uuid",
        "name": "Outer",
        "inputs": [{"name": "clip", "type": "CLIP"}],
        "outputs": [{"name": "cond", "type": "CONDITIONING"}],
        "nodes": [
            n(
                7,
                "inner-uuid",
                inputs=[{"name": "clip", "type": "CLIP", "link": 1}],
                outputs=[{"name": "cond", "type": "CONDITIONING", "links": [2]}],
            )
        ],
        "links": [
            {"id": 1, "origin_id": -10, "origin_slot": 0, "target_id": 7, "target_slot": 0, "type": "CLIP"},
            {
                "id": 2,
                "origin_id": 7,
                "origin_slot": 0,
                "target_id": -20,
                "target_slot": 0,
                "type": "CONDITIONING",
            },
        ],
    }
    return ui_graph(
        [
            n(4, "CheckpointLoaderSimple", ["sd15.safetensors"]),
            n(
                12,
                "outer-uuid",
                [],
                inputs=[{"name": "clip", "type": "CLIP", "link": 1}],
                outputs=[{"name": "cond", "type": "CONDITIONING", "links": [2]}],
                mode=outer_mode,
            ),
            n(
                3,
                "KSampler",
                [1, "fixed", 20, 8, "euler", "normal", 1],
                inputs=[{"name": "positive", "type": "CONDITIONING", "link": 2}],
            ),
        ],
        [[1, 4, 1, 12, 0, "CLIP"], [2, 12, 0, 3, 0, "CONDITIONING"]],
        definitions={"subgraphs": [outer_def, inner_def]},
    )


def test_nested_subgraphs_get_path_ids(object_info: dict[str, Any]) -> None:
    api = convert_ui_to_api(nested_subgraphs(), object_info)
    assert api["12:7:1"] == encode("deep", ["4", 1])
    assert api["3"]["inputs"]["positive"] == ["12:7:1", 0]
    assert list(api) == ["3", "4", "12:7:1"]  # emitted in natural id order


def test_muted_subgraph_instance_mutes_its_content(object_info: dict[str, Any]) -> None:
    api = convert_ui_to_api(nested_subgraphs(outer_mode=2), object_info)
    assert sorted(api) == ["3", "4"]
    assert "positive" not in api["3"]["inputs"]


def test_subgraph_that_contains_itself_is_refused(object_info: dict[str, Any]) -> None:
    loop = {"id": "loop", "nodes": [n(1, "loop")], "links": []}
    ui = ui_graph([n(1, "loop")], [], definitions={"subgraphs": [loop]})
    with pytest.raises(WorkflowFormatError, match="nest deeper"):
        convert_ui_to_api(ui, object_info)


def test_title_falls_back_to_display_name_then_class(object_info: dict[str, Any]) -> None:
    ui = ui_graph([n(1, "VAEDecode"), n(2, "SomethingElse"), n(3, "VAEDecode", title="Decode!")], [])
    api = convert_ui_to_api(ui, object_info)
    assert [api[k]["_meta"]["title"] for k in ("1", "2", "3")] == ["VAE Decode", "SomethingElse", "Decode!"]


@pytest.mark.parametrize(
    "ui, phrase",
    [
        ({"nodes": "x", "links": []}, "'nodes' list"),
        ({"nodes": [{"id": 1}], "links": []}, "node #0"),
        ({"nodes": [n(1, "VAEDecode")], "links": [["a", 1, 0, 2, 0, "X"]]}, "expected links as"),
        ([], "UI-format"),
    ],
)
def test_malformed_ui_raises_format_error(ui: Any, phrase: str, object_info: dict[str, Any]) -> None:
    with pytest.raises(WorkflowFormatError, match=phrase):
        convert_ui_to_api(ui, object_info)


def test_malformed_group_node_definition(object_info: dict[str, Any]) -> None:
    ui = load("group_node.json")
    ui["extra"]["groupNodes"]["Sample and decode"]["external"] = [["x", 0, "IMAGE"]]
    with pytest.raises(WorkflowFormatError, match="group node 10 .* extra.groupNodes is malformed"):
        convert_ui_to_api(ui, object_info)
