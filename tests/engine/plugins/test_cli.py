"""Plugin nodes from the command line: ``main.py nodes --json`` and ``main.py run --json``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.engine.plugins.conftest import PACKS, REPO

pytestmark = pytest.mark.slow  # each call starts a Loom process


def loom(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(REPO / "main.py"), *args], cwd=cwd, capture_output=True, text=True, timeout=240
    )


def test_cli_lists_and_runs_plugin_nodes(tmp_path: Path) -> None:
    common = [
        "--custom-nodes",
        str(PACKS),
        "--output-dir",
        str(tmp_path / "out"),
        "--input-dir",
        str(tmp_path / "in"),
        "--temp-dir",
        str(tmp_path / "temp"),
        "--models-dir",
        str(tmp_path / "models"),
    ]
    workflow = tmp_path / "wf.json"
    workflow.write_text(
        json.dumps(
            {
                "1": {
                    "class_type": "TextTools_Repeat",
                    "inputs": {"text": "ab", "times": 2, "mode": "plain"},
                },
                "2": {"class_type": "OutputPack_ShowText", "inputs": {"text": ["1", 0]}},
                "3": {"class_type": "ExamplePack_WordCount", "inputs": {"text": ["1", 0]}},
                "4": {"class_type": "V3Pack_Show", "inputs": {"value": ["3", 0]}},
            }
        )
    )
    ran = loom("run", str(workflow), "--json", *common, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    result = json.loads(ran.stdout.splitlines()[-1])
    assert result["status"] == "success"
    assert result["outputs"]["2"] == {"text": ["abab"]} and result["outputs"]["4"]["text"] == ["1"]
    listed = loom("nodes", "--json", *common, cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    info = json.loads(listed.stdout)
    assert {"TextTools_Repeat", "V3Pack_Multiply", "ExamplePack_ImageBrightness", "Malformed_Good"} <= set(
        info
    )
    assert "Malformed_MissingFunction" not in info and info["StringConcatenate"]["python_module"] == "nodes"
