"""``python main.py bench AREA [options]`` runs one per-area script of ``nodes/bench/areas/``; the
suite's own flags stay the suite's; every area script is a ``main(argv)`` that imports nothing of
``tests/`` and does no work at import."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import main
from nodes.bench.cli import area_names

AREAS = Path(__file__).resolve().parents[3] / "nodes" / "bench" / "areas"


def test_every_area_script_is_reachable_from_the_cli() -> None:
    names = area_names()
    assert "executor" in names and "vs_comfyui" in names and len(names) == len(list(AREAS.glob("[!_]*.py")))
    args = main.make_parser().parse_args(["bench", "quant", "--size", "small", "--repeats", "3"])
    assert (args.area, args.area_args, args.repeats) == ("quant", ["--size", "small", "--repeats", "3"], None)
    suite = main.make_parser().parse_args(["bench", "--quick", "--repeats", "2"])
    assert (suite.area, suite.quick, suite.repeats) == (None, True, 2)


def test_an_area_runs_with_its_own_options(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "model_folders", "--folders", "4", "--per-folder", "2", "--repeats", "1"]
    assert main.main(argv) == 0
    assert "model folders: 8 files in 4 folders" in capsys.readouterr().out


def test_suite_flags_before_an_area_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main.main(["bench", "--quick", "model_folders"]) == 2
    assert "--quick belong to the suite" in capsys.readouterr().err


def test_an_area_runs_as_a_module_too(tmp_path: Path) -> None:
    root = AREAS.parents[2]
    done = subprocess.run(
        [sys.executable, "-m", "nodes.bench.areas.model_folders", "--folders", "2", "--per-folder", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        cwd=root,
    )
    assert "model folders: 2 files in 2 folders" in done.stdout


@pytest.mark.parametrize("path", sorted(AREAS.glob("[!_]*.py")), ids=lambda p: p.stem)
def test_an_area_script_has_a_main_and_imports_nothing_of_tests(path: Path) -> None:
    tree = ast.parse(path.read_text())
    imported = [
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    ]
    assert not [m for m in imported if m and m.split(".")[0] == "tests"]
    assert any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body)
    top_calls = [n for n in tree.body if isinstance(n, ast.Expr) and isinstance(n.value, ast.Call)]
    assert not top_calls, f"{path.name}: work at import time (calls outside main)"
