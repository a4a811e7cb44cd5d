"""Workflow formats: detection, API normalisation, Loom's saved format and its migrations, PNG text
chunks, and loading files of every kind (bad ones kept in tests/compat/workflows/bad/)."""

from __future__ import annotations

import copy
import io
import json
from pathlib import Path
from typing import Any

import pytest
from PIL import Image
from PIL.PngImagePlugin import PngInfo

from engine.formats import (
    WorkflowFormatError,
    detect_format,
    from_saved,
    load_workflow,
    load_workflow_file,
    normalize_api,
    read_png_workflow,
    to_saved,
)
from engine.formats.saved import MIGRATIONS, SAVED_VERSION, migrate_saved

COMPAT = Path(__file__).parent.parent / "compat"
WORKFLOWS = COMPAT / "workflows"
BAD = WORKFLOWS / "bad"


@pytest.fixture(scope="module")
def object_info() -> dict[str, Any]:
    return json.loads((COMPAT / "object_info_core.json").read_text())


@pytest.fixture
def api() -> dict[str, Any]:
    return json.loads((WORKFLOWS / "api_txt2img.json").read_text())


def png_bytes(**chunks: str) -> bytes:
    info = PngInfo()
    for key, value in chunks.items():
        if key.startswith("itxt_"):
            info.add_itxt(key[5:], value, zip=True)
        else:
            info.add_text(key, value)
    out = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 30, 30)).save(out, format="PNG", pnginfo=info)
    return out.getvalue()


# --- detection and API format -----------------------------------------------------------------
def test_detect_format(api: dict[str, Any]) -> None:
    assert detect_format(api) == "api"
    assert detect_format(json.loads((WORKFLOWS / "txt2img.json").read_text())) == "ui"
    assert detect_format(json.loads((WORKFLOWS / "saved_v1.json").read_text())) == "loom"
    assert detect_format(json.loads((WORKFLOWS / "saved_v2.json").read_text())) == "loom"


@pytest.mark.parametrize(
    "obj, phrase",
    [
        ([1, 2], "found a list"),
        ("KSampler", "found a string"),
        ({}, "empty object"),
        ({"name": "x", "steps": 3}, "found an object with keys 'name', 'steps'"),
        ({"1": {"class_type": "A", "inputs": {}}, "2": 7}, "node '2' should be an object"),
        ({"format": "other"}, "unknown workflow format 'other'"),
        ({"prompt": {"1": {"class_type": "A", "inputs": {}}}}, "a /prompt request body"),
        ({"nodes": []}, 'without a "links" list'),
    ],
)
def test_detect_format_errors_say_what_was_expected_and_found(obj: Any, phrase: str) -> None:
    with pytest.raises(WorkflowFormatError) as info:
        detect_format(obj)
    assert phrase in str(info.value)
    assert "\n" not in str(info.value)


def test_normalize_api_links_and_ids(api: dict[str, Any]) -> None:
    raw = {
        3: {"class_type": "KSampler", "inputs": {"model": [4, 0], "size": [512, 512], "seed": 1}},
        4: {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "a.safetensors"}},
        5: {"class_type": "Note"},
    }
    before = copy.deepcopy(raw)
    out = normalize_api(raw)
    assert out == {
        "3": {"class_type": "KSampler", "inputs": {"model": ["4", 0], "size": [512, 512], "seed": 1}},
        "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "a.safetensors"}},
        "5": {"class_type": "Note", "inputs": {}},
    }
    assert raw == before
    assert normalize_api(api) == api


@pytest.mark.parametrize(
    "obj, phrase",
    [
        ({}, "an empty object"),
        ({"1": {"inputs": {}}}, "node '1': \"class_type\" must be a non-empty string"),
        ({"1": {"class_type": "A", "inputs": 3}}, "node '1' (A): \"inputs\" must be an object"),
        ({"1": {"class_type": "A", "inputs": {}, "_meta": "t"}}, '"_meta" must be an object'),
        ({"1": []}, "node '1': expected an object"),
    ],
)
def test_normalize_api_errors(obj: Any, phrase: str) -> None:
    with pytest.raises(WorkflowFormatError, match=None) as info:
        normalize_api(obj)
    assert phrase in str(info.value)


# --- Loom's saved format ----------------------------------------------------------------------
def test_saved_round_trip(api: dict[str, Any]) -> None:
    layout = {
        "nodes": {
            3: {
                "pos": [863, 186],
                "size": [315, 262],
                "title": "Sampler",
                "color": "#223",
                "collapsed": False,
                "mode": 0,
            }
        },
        "groups": [{"title": "Prompts", "bounding": [400, 110, 460, 490], "color": "#3f789e"}],
        "links": {"1": {"color": "#fff"}},
    }
    saved = to_saved(api, layout, {"ds": {"scale": 1.2}})
    assert saved["format"] == "loom.workflow" and saved["version"] == SAVED_VERSION
    text = json.dumps(saved)
    back = from_saved(json.loads(text))
    assert back.prompt == api
    assert back.layout["nodes"] == {"3": layout["nodes"][3]}
    assert back.layout["groups"] == layout["groups"]
    assert back.layout["links"] == layout["links"]
    assert back.extra == {"ds": {"scale": 1.2}}
    assert back.loaded_version == SAVED_VERSION
    assert to_saved(back.prompt, back.layout, back.extra) == saved


def test_saved_without_layout_gets_an_empty_one(api: dict[str, Any]) -> None:
    saved = to_saved(api)
    assert saved["layout"] == {"nodes": {}, "groups": []}
    assert saved["extra"] == {}


def test_migration_chain_is_complete_and_each_step_bumps_the_version() -> None:
    assert len(MIGRATIONS) == SAVED_VERSION - 1
    v1 = json.loads((WORKFLOWS / "saved_v1.json").read_text())
    current = v1
    for step, migrate in enumerate(MIGRATIONS, start=1):
        assert current["version"] == step
        current = migrate(current)
        assert current["version"] == step + 1


def test_v1_migrates_on_load(api: dict[str, Any]) -> None:
    v1 = json.loads((WORKFLOWS / "saved_v1.json").read_text())
    before = copy.deepcopy(v1)
    saved = from_saved(v1)
    assert v1 == before  # the file's object is left as it was
    assert saved.loaded_version == 1
    assert saved.prompt == api
    assert saved.layout["groups"] == []
    assert saved.layout["nodes"]["6"] == {"pos": [415, 186], "size": [422, 164], "title": "Positive"}
    assert saved.layout["nodes"]["3"] == {"pos": [863, 186], "size": [315, 262]}
    assert saved.extra == {}
    assert migrate_saved(v1)["version"] == SAVED_VERSION


def test_v2_loads_as_is(api: dict[str, Any]) -> None:
    v2 = json.loads((WORKFLOWS / "saved_v2.json").read_text())
    saved = from_saved(v2)
    assert saved.loaded_version == 2
    assert saved.prompt == api
    assert saved.layout == v2["layout"]
    assert saved.extra == v2["extra"]


def saved_with_instance(api: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A saved file whose two prompts became one subgraph instance (id 10), as the editor writes
    it, and the flattened graph it runs."""
    outer = {k: copy.deepcopy(v) for k, v in api.items() if k not in ("6", "7")}
    outer["10"] = {"class_type": "sg-1", "inputs": {"clip": ["4", 1]}}
    outer["3"]["inputs"].update(positive=["10", 0], negative=["10", 1])
    flat = copy.deepcopy(api)
    flat["10:6"], flat["10:7"] = flat.pop("6"), flat.pop("7")
    flat["3"]["inputs"].update(positive=["10:6", 0], negative=["10:7", 0])
    layout = {
        "nodes": {},
        "groups": [],
        "runnable": flat,
        "subgraphs": [
            {
                "id": "sg-1",
                "name": "prompts",
                "inputs": [{"name": "clip", "type": "CLIP"}],
                "outputs": [
                    {"name": "positive", "type": "CONDITIONING"},
                    {"name": "negative", "type": "CONDITIONING"},
                ],
                "saved": {},
            }
        ],
    }
    return to_saved(outer, layout), flat


def test_a_saved_graph_with_subgraph_instances_runs_the_flattened_graph(
    api: dict[str, Any], object_info: dict[str, Any]
) -> None:
    saved, flat = saved_with_instance(api)
    loaded = load_workflow(saved, object_info)
    assert loaded.prompt == flat
    assert loaded.workflow is not None and loaded.workflow["prompt"]["10"]["class_type"] == "sg-1"


def test_a_saved_graph_with_instances_but_no_flattened_graph_says_how_to_fix(
    api: dict[str, Any], object_info: dict[str, Any]
) -> None:
    saved, _ = saved_with_instance(api)
    del saved["layout"]["runnable"]
    with pytest.raises(WorkflowFormatError, match="10 are subgraph instances.*save it again"):
        load_workflow(saved, object_info)


# --- PNG chunks -------------------------------------------------------------------------------
def test_read_png_workflow_text_and_itxt(api: dict[str, Any], tmp_path: Path) -> None:
    ui = json.loads((WORKFLOWS / "txt2img.json").read_text())
    data = png_bytes(prompt=json.dumps(api), itxt_workflow=json.dumps(ui))
    png = read_png_workflow(data)
    assert png.prompt == api and png.workflow == ui
    path = tmp_path / "out.png"
    path.write_bytes(data)
    assert read_png_workflow(path) == png
    assert read_png_workflow(str(path)) == png


def test_read_png_without_chunks_and_with_garbage() -> None:
    assert read_png_workflow(png_bytes()).prompt is None
    png = read_png_workflow(png_bytes(prompt="{not json", workflow="[1, 2]", parameters="a1111 text"))
    assert png.prompt is None and png.workflow is None
    with pytest.raises(WorkflowFormatError, match="expected a PNG"):
        read_png_workflow(b"GIF89a....")


def test_png_prefers_prompt_chunk(api: dict[str, Any], tmp_path: Path, object_info: dict[str, Any]) -> None:
    ui = json.loads((WORKFLOWS / "txt2img.json").read_text())
    path = tmp_path / "image.png"
    path.write_bytes(png_bytes(prompt=json.dumps(api), workflow=json.dumps(ui)))
    loaded = load_workflow_file(path, object_info)
    assert loaded.source_format == "png-prompt"
    assert loaded.prompt == api and loaded.workflow == ui


def test_png_falls_back_to_workflow_chunk(tmp_path: Path, object_info: dict[str, Any]) -> None:
    ui = json.loads((WORKFLOWS / "txt2img.json").read_text())
    path = tmp_path / "image.png"
    path.write_bytes(png_bytes(prompt=json.dumps({"3": 5}), workflow=json.dumps(ui)))
    loaded = load_workflow_file(path, object_info)
    assert loaded.source_format == "png-workflow"
    assert sorted(loaded.prompt) == ["3", "4", "5", "6", "7", "8", "9"]
    assert loaded.prompt["3"]["inputs"]["seed"] == 156680208700286


def test_png_without_workflow_names_the_file(tmp_path: Path, object_info: dict[str, Any]) -> None:
    path = tmp_path / "holiday.png"
    path.write_bytes(png_bytes(parameters="a photo"))
    with pytest.raises(WorkflowFormatError) as info:
        load_workflow_file(path, object_info)
    message = str(info.value)
    assert message.startswith(str(path)) and "carries no workflow" in message and "\n" not in message


def test_png_with_broken_prompt_and_no_workflow(tmp_path: Path, object_info: dict[str, Any]) -> None:
    path = tmp_path / "odd.png"
    path.write_bytes(png_bytes(prompt=json.dumps({"1": {"inputs": {}}})))
    with pytest.raises(WorkflowFormatError, match='"prompt" chunk is not a valid API workflow'):
        load_workflow_file(path, object_info)


# --- loading files of every kind --------------------------------------------------------------
@pytest.mark.parametrize(
    "name, kind",
    [
        ("api_txt2img.json", "api"),
        ("saved_v1.json", "loom"),
        ("saved_v2.json", "loom"),
        ("txt2img.json", "ui"),
        ("subgraph.json", "ui"),
        ("group_node.json", "ui"),
    ],
)
def test_load_workflow_file(name: str, kind: str, object_info: dict[str, Any], api: dict[str, Any]) -> None:
    loaded = load_workflow_file(WORKFLOWS / name, object_info)
    assert loaded.source_format == kind
    assert loaded.prompt and all("class_type" in node for node in loaded.prompt.values())
    if kind == "api":
        assert loaded.workflow is None and loaded.prompt == api
    if kind == "loom":
        assert loaded.prompt == api
        assert loaded.workflow is not None and loaded.workflow["version"] == SAVED_VERSION
    if kind == "ui":
        assert loaded.workflow == json.loads((WORKFLOWS / name).read_text())


def test_load_workflow_from_object(api: dict[str, Any], object_info: dict[str, Any]) -> None:
    assert load_workflow(api, object_info).prompt == api


BAD_FILES = {
    "not_json.json": "not JSON: Expecting",
    "not_utf8.json": "not JSON (not UTF-8 text) and not a PNG",
    "top_level_list.json": "found a list",
    "unknown_shape.json": "found an object with keys 'name', 'steps', 'sampler'",
    "empty_object.json": "empty object",
    "api_node_not_object.json": "node '4' should be an object with \"class_type\"",
    "api_inputs_not_object.json": "node '3' (KSampler): \"inputs\" must be an object, found a list",
    "api_empty_class_type.json": '"class_type" must be a non-empty string',
    "ui_bad_link.json": "expected links as [id, from_node, from_slot, to_node, to_slot, type]",
    "ui_node_without_type.json": "node #0 of the 'nodes' list",
    "ui_without_links.json": 'UI-format workflow without a "links" list',
    "ui_all_muted.json": "no nodes that run",
    "saved_future_version.json": "version 99 was written by a newer Loom",
    "saved_bad_layout.json": "layout of node '5': \"pos\" must be [2 numbers]",
    "saved_unknown_format.json": "unknown workflow format 'comfy.workflow'",
    "saved_version_missing.json": '"version" must be an integer from 1 to 2',
    "prompt_request_body.json": 'save only the value of "prompt"',
}


def test_every_bad_fixture_is_covered() -> None:
    assert sorted(p.name for p in BAD.iterdir()) == sorted(BAD_FILES)


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_bad_files_give_one_clear_line(name: str, object_info: dict[str, Any]) -> None:
    path = BAD / name
    with pytest.raises(WorkflowFormatError) as info:
        load_workflow_file(path, object_info)
    message = str(info.value)
    assert message.startswith(f"{path}: ")
    assert BAD_FILES[name] in message
    assert "\n" not in message


def test_missing_file_and_directory(tmp_path: Path, object_info: dict[str, Any]) -> None:
    with pytest.raises(WorkflowFormatError, match="no such file"):
        load_workflow_file(tmp_path / "nope.json", object_info)
    with pytest.raises(WorkflowFormatError, match="is a directory"):
        load_workflow_file(tmp_path, object_info)


def test_png_with_bad_workflow_chunk_says_which_chunk(tmp_path: Path, object_info: dict[str, Any]) -> None:
    path = tmp_path / "bad.png"
    path.write_bytes(png_bytes(workflow=json.dumps({"nodes": [{"id": 1}], "links": []})))
    with pytest.raises(WorkflowFormatError) as info:
        load_workflow_file(path, object_info)
    assert str(info.value).startswith(f'{path}: the PNG\'s "workflow" chunk: node #0')


def test_engine_workflow_modules_do_not_import_torch() -> None:
    import subprocess
    import sys

    code = "import sys, engine.formats; print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).parent.parent.parent,
    )
    assert out.stdout.strip() == "False"


def test_saved_format_modes_mute_and_bypass_as_comfyui() -> None:
    from engine.formats import load_workflow, to_saved

    info = {
        "Src": {"input": {"required": {}}, "output": ["IMAGE"]},
        "Blur": {
            "input": {"required": {"image": ["IMAGE", {}], "amount": ["FLOAT", {}]}},
            "output": ["IMAGE"],
        },
        "Save": {"input": {"required": {"images": ["IMAGE", {}]}}, "output": []},
        "Note": {"input": {"required": {"images": ["IMAGE", {}]}}, "output": []},
    }
    prompt = {
        "1": {"class_type": "Src", "inputs": {}},
        "2": {"class_type": "Blur", "inputs": {"image": ["1", 0], "amount": 2.0}},
        "3": {"class_type": "Blur", "inputs": {"image": ["2", 0], "amount": 3.0}},
        "4": {"class_type": "Save", "inputs": {"images": ["3", 0]}},
        "5": {"class_type": "Note", "inputs": {"images": ["1", 0]}},
    }
    layout = {
        "nodes": {
            "2": {"pos": [0, 0], "mode": 4},
            "3": {"pos": [0, 0], "mode": 4},
            "5": {"pos": [0, 0], "mode": 2},
        }
    }
    loaded = load_workflow(to_saved(prompt, layout), info)
    assert loaded.prompt == {
        "1": {"class_type": "Src", "inputs": {}},
        "4": {"class_type": "Save", "inputs": {"images": ["1", 0]}},
    }
    assert loaded.workflow is not None and set(loaded.workflow["prompt"]) == set(
        prompt
    )  # the editor keeps all
