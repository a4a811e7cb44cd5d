"""`main.py run` and `main.py nodes` as DESIGN.md's CLI contract says."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import main

ROOT = Path(__file__).resolve().parents[2]


def text_workflow(a: str = "hello", b: str = "world") -> dict[str, Any]:
    return {
        "1": {"class_type": "PrimitiveString", "inputs": {"value": a}},
        "2": {
            "class_type": "StringConcatenate",
            "inputs": {"string_a": ["1", 0], "string_b": b, "delimiter": " "},
        },
        "3": {"class_type": "PreviewAny", "inputs": {"source": ["2", 0]}},
    }


def dirs(tmp: Path) -> list[str]:
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


def run_cli(
    tmp: Path, capsys: pytest.CaptureFixture[str], *args: str
) -> tuple[int, list[dict[str, Any]], str]:
    code = main.main(["run", *args, "--json", *dirs(tmp)])
    out, err = capsys.readouterr()
    lines = [json.loads(line) for line in out.splitlines() if line.strip()]
    return code, lines, err


def write(tmp: Path, name: str, obj: Any) -> Path:
    path = tmp / name
    path.write_text(json.dumps(obj) if not isinstance(obj, str) else obj)
    return path


def test_run_prints_one_json_line_per_workflow_and_later_ones_hit_the_cache(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wf = write(tmp_path, "a.json", text_workflow())
    code, lines, err = run_cli(tmp_path, capsys, str(wf), str(wf))
    assert code == 0
    assert len(lines) == 2
    first, second = lines
    assert set(first) >= {
        "prompt_id",
        "status",
        "executed",
        "cached",
        "outputs",
        "node_errors",
        "error",
        "timings",
        "memory",
    }
    assert first["status"] == "success" and sorted(first["executed"]) == ["1", "2", "3"]
    assert first["outputs"] == {"3": {"text": ["hello world"]}}
    assert second["executed"] == [] and second["cached"] == ["1", "2", "3"]  # every node taken from the cache
    assert "nodes" in first["timings"] and "total_s" in first["timings"]
    assert "[a.json]" in err  # progress on stderr


def test_set_overrides_are_type_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wf = write(tmp_path, "a.json", text_workflow())
    code, lines, _ = run_cli(tmp_path, capsys, str(wf), "--set", "2.delimiter=-", "--set", "1.value=bye")
    assert code == 0 and lines[0]["outputs"]["3"] == {"text": ["bye-world"]}
    assert main.main(["run", str(wf), "--set", "9.value=1", *dirs(tmp_path)]) == 2
    assert "has no node '9'" in capsys.readouterr().err
    assert main.main(["run", str(wf), "--set", "1.nope=1", *dirs(tmp_path)]) == 2
    assert "has no input 'nope'" in capsys.readouterr().err
    assert main.main(["run", str(wf), "--set", "garbage", *dirs(tmp_path)]) == 2


def test_invalid_workflow_exits_2_with_node_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wf = text_workflow()
    wf["2"]["class_type"] = "StringConcatenat"
    code, lines, _ = run_cli(tmp_path, capsys, str(write(tmp_path, "bad.json", wf)))
    assert code == 2
    assert lines[0]["status"] == "invalid"
    assert lines[0]["node_errors"]["2"]["errors"][0]["type"] == "missing_node_type"


@pytest.mark.parametrize(
    ("content", "needle"),
    [("{not json", "not JSON"), ("[1, 2]", "found"), ('{"format": "other"}', "unknown workflow format")],
)
def test_bad_files_get_one_clear_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, needle: str
) -> None:
    path = write(tmp_path, "bad.json", content)
    assert main.main(["run", str(path), *dirs(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert needle in err and str(path) in err


def test_missing_file_and_later_workflows_still_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = write(tmp_path, "good.json", text_workflow())
    code, lines, err = run_cli(tmp_path, capsys, str(tmp_path / "nope.json"), str(good))
    assert code == 2
    assert "no such file" in err
    assert lines[-1]["status"] == "success"


def test_subprocess_bad_file_never_shows_a_traceback(tmp_path: Path) -> None:
    path = write(tmp_path, "bad.json", "{oops")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "main.py"), "run", str(path), *dirs(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("loom: ")


def test_nodes_catalogue(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main.main(["nodes", "--json", *dirs(tmp_path)[:-1]]) == 0
    info = json.loads(capsys.readouterr().out)
    entry = info["StringConcatenate"]
    assert entry["input_order"]["required"] == ["string_a", "string_b", "delimiter"]
    assert entry["output"] == ["STRING"] and entry["category"] == "utils/string"
    assert info["PreviewAny"]["output_node"] is True


def test_run_accepts_ui_format_saved_format_and_png(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from PIL import Image
    from PIL.PngImagePlugin import PngInfo

    from engine.formats import to_saved

    ui = {
        "last_node_id": 3,
        "last_link_id": 2,
        "version": 0.4,
        "groups": [],
        "config": {},
        "extra": {},
        "nodes": [
            {
                "id": 1,
                "type": "PrimitiveString",
                "pos": [0, 0],
                "size": [200, 60],
                "flags": {},
                "order": 0,
                "mode": 0,
                "inputs": [],
                "outputs": [{"name": "STRING", "type": "STRING", "links": [1]}],
                "properties": {},
                "widgets_values": ["from ui"],
            },
            {
                "id": 2,
                "type": "StringConcatenate",
                "pos": [250, 0],
                "size": [200, 100],
                "flags": {},
                "order": 1,
                "mode": 0,
                "inputs": [{"name": "string_a", "type": "STRING", "link": 1, "widget": {"name": "string_a"}}],
                "outputs": [{"name": "STRING", "type": "STRING", "links": [2]}],
                "properties": {},
                "widgets_values": ["", "!", "+"],
            },
            {
                "id": 3,
                "type": "PreviewAny",
                "pos": [500, 0],
                "size": [200, 60],
                "flags": {},
                "order": 2,
                "mode": 0,
                "inputs": [{"name": "source", "type": "*", "link": 2}],
                "outputs": [],
                "properties": {},
                "widgets_values": [],
            },
        ],
        "links": [[1, 1, 0, 2, 0, "STRING"], [2, 2, 0, 3, 0, "STRING"]],
    }
    ui_path = write(tmp_path, "ui.json", ui)
    saved_path = write(tmp_path, "saved.json", to_saved(text_workflow("saved")))
    png_path = tmp_path / "made.png"
    info = PngInfo()
    info.add_text("prompt", json.dumps(text_workflow("png")))
    Image.new("RGB", (8, 8)).save(png_path, pnginfo=info)
    code, lines, _ = run_cli(tmp_path, capsys, str(ui_path), str(saved_path), str(png_path))
    assert code == 0
    assert [line["outputs"]["3"]["text"][0] for line in lines] == ["from ui+!", "saved world", "png world"]


FAILING_PACK = """
from nodes.api import Input, Node, NodeSchema, Output, STRING


class AlwaysFails(Node):
    SCHEMA = NodeSchema(node_id="Test_AlwaysFails", display_name="Always fails", category="test",
                        description="raises when run", inputs=(Input("text", STRING, "ignored"),),
                        outputs=(Output("STRING", STRING, "never produced"),))

    def run(self, ctx, *, text):
        raise RuntimeError("the disk is on fire")


def loom_register(plugin):
    plugin.add_node(AlwaysFails)
"""


def test_a_workflow_failing_while_running_exits_1_and_names_node_and_pack(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    packs = tmp_path / "packs"
    packs.mkdir()
    (packs / "fire_pack.py").write_text(FAILING_PACK)
    wf = write(
        tmp_path,
        "fail.json",
        {
            "1": {"class_type": "Test_AlwaysFails", "inputs": {"text": "x"}},
            "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}},
        },
    )
    good = write(tmp_path, "good.json", text_workflow())
    args = [a for a in dirs(tmp_path) if a != "--disable-custom-nodes"]
    code = main.main(["run", str(wf), str(good), "--json", "--custom-nodes", str(packs), *args])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert code == 1
    assert lines[0]["status"] == "error"
    assert lines[0]["error"]["node_id"] == "1"
    assert "the disk is on fire" in lines[0]["error"]["exception_message"]
    assert "fire_pack" in lines[0]["error"]["exception_message"]
    assert lines[1]["status"] == "success"


def test_safety_enforce_without_a_model_refuses_to_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wf = write(tmp_path, "a.json", text_workflow())
    assert main.main(["run", str(wf), "--safety", "enforce", *dirs(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "no safety checker model" in err and "Traceback" not in err
