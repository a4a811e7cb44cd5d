"""The compatibility report (engine/plugins/compat_check.py) and `python main.py check` (exit codes,
--json); the API route is tested in tests/engine/server/test_check_api.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import main
from engine.plugins.compat_check import check_file, check_workflow, core_node_names

COMPAT = Path(__file__).resolve().parents[2] / "compat"  # the workflow files tests/compat shares
WORKFLOWS = COMPAT / "workflows"


@pytest.fixture(scope="module")
def object_info() -> dict[str, Any]:
    return json.loads((COMPAT / "object_info_core.json").read_text())


def node(id: int, type_: str, widgets: Any = None, mode: int = 0, **properties: Any) -> dict[str, Any]:
    return {
        "id": id,
        "type": type_,
        "mode": mode,
        "inputs": [],
        "outputs": [],
        "properties": properties,
        **({"widgets_values": widgets} if widgets is not None else {}),
    }


def mixed_workflow() -> dict[str, Any]:
    """Two core nodes Loom's test catalogue lacks, two custom ones (one with its pack named), a
    frontend-only note, a subgraph holding another custom node, and a malformed KSampler."""
    inner = {
        "id": "sub-1",
        "name": "Detailer",
        "inputs": [],
        "outputs": [],
        "links": [],
        "nodes": [
            node(1, "FaceDetailer", cnr_id="comfyui-impact-pack", aux_id="ltdrdata/ComfyUI-Impact-Pack")
        ],
    }
    return {
        "version": 0.4,
        "links": [],
        "definitions": {"subgraphs": [inner]},
        "nodes": [
            node(1, "CheckpointLoaderSimple", ["sd15.safetensors"], cnr_id="comfy-core"),
            node(2, "EmptyHunyuanLatentVideo", [848, 480, 25, 1], cnr_id="comfy-core"),
            node(3, "ImageUpscaleWithModel"),
            node(4, "FaceDetailer", cnr_id="comfyui-impact-pack", aux_id="ltdrdata/ComfyUI-Impact-Pack"),
            node(5, "MysteryNode"),
            node(6, "Note", ["hello"]),
            node(7, "sub-1"),
            node(8, "KSampler", [1, "fixed", "many", 8, "euler", "normal", 1]),
        ],
    }


def test_core_list_is_comfyuis(object_info: dict[str, Any]) -> None:
    names = core_node_names()
    assert len(names) > 400
    assert {"KSampler", "LatentCompositeMasked", "StringReplace", "ComfySwitchNode", "SaveLatent"} <= names
    assert "FaceDetailer" not in names and "Note" not in names


def test_report_lists_every_missing_type_and_problem(object_info: dict[str, Any]) -> None:
    report = check_workflow(mixed_workflow(), object_info)
    assert not report.ok and report.error is None and report.node_count == 7
    assert [(m.class_type, m.kind, m.pack, m.node_ids) for m in report.missing] == [
        ("EmptyHunyuanLatentVideo", "core", None, ["2"]),
        ("ImageUpscaleWithModel", "core", None, ["3"]),
        ("FaceDetailer", "custom", "comfyui-impact-pack", ["4", "Detailer:1"]),
        ("MysteryNode", "custom", None, ["5"]),
    ]
    assert report.missing[2].repository == "ltdrdata/ComfyUI-Impact-Pack"
    assert [str(p) for p in report.problems if p.level == "warning"] == [
        "node 8 (KSampler): widget 'steps' expects an integer but the file has 'many'; the widget values may be "
        "shifted (a node saved by another version, or a missing control-after-generate value)"
    ]
    text = "\n".join(report.lines())
    assert (
        "FaceDetailer (from the custom node pack comfyui-impact-pack (ltdrdata/ComfyUI-Impact-Pack); nodes 4, "
        "Detailer:1)" in text
    )
    assert "EmptyHunyuanLatentVideo (ComfyUI core node Loom does not have yet; node 2)" in text


def test_api_format_and_unreadable_input(object_info: dict[str, Any]) -> None:
    api = {
        "1": {"class_type": "KSampler", "inputs": {}},
        "2": {"class_type": "WAS_Text_Concat", "inputs": {}},
    }
    report = check_workflow(api, object_info)
    assert report.source_format == "api" and [m.class_type for m in report.missing] == ["WAS_Text_Concat"]
    assert report.missing[0].kind == "custom"
    broken = check_workflow([1, 2], object_info)
    assert not broken.ok and "expected ComfyUI API format" in (broken.error or "")


def test_available_workflow_is_ok(object_info: dict[str, Any]) -> None:
    report = check_workflow(json.loads((WORKFLOWS / "txt2img.json").read_text()), object_info)
    assert report.ok and report.missing == [] and report.to_json()["ok"] is True


def cli_dirs(tmp: Path) -> list[str]:
    return [
        "--output-dir",
        str(tmp / "out"),
        "--input-dir",
        str(tmp / "in"),
        "--temp-dir",
        str(tmp / "temp"),
        "--models-dir",
        str(tmp / "models"),
        "--disable-custom-nodes",
    ]


def test_cli_exit_codes_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "good.json"
    good.write_text((WORKFLOWS / "frontend_shapes.json").read_text())
    assert main.main(["check", str(good), *cli_dirs(tmp_path)]) == 0
    assert "every node type is available" in capsys.readouterr().out
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(mixed_workflow()))
    assert main.main(["check", str(bad), "--json", *cli_dirs(tmp_path)]) == 2
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False and report["missing_custom"] == 2
    missing = {m["class_type"] for m in report["missing"]}
    assert missing >= {"FaceDetailer", "MysteryNode"}
    assert (
        "EmptyHunyuanLatentVideo" not in missing
    )  # Loom's own catalogue has it (nodes/family_nodes/video_nodes.py)
    assert main.main(["check", str(tmp_path / "absent.json"), *cli_dirs(tmp_path)]) == 2
    assert "cannot read" in capsys.readouterr().out


def test_png_with_workflow_is_checked(tmp_path: Path, object_info: dict[str, Any]) -> None:
    from PIL import Image, PngImagePlugin

    info = PngImagePlugin.PngInfo()
    info.add_text("workflow", json.dumps(mixed_workflow()))
    path = tmp_path / "wf.png"
    Image.new("RGB", (4, 4)).save(path, pnginfo=info)
    report = check_file(path, object_info)
    assert report.source_format == "png-workflow" and len(report.missing) == 4
