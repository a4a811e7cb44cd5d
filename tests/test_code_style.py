"""The code style the project checks: ruff's lint rules and ruff's formatter, one config
(pyproject.toml), over the Python the project ships and tests."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PATHS = ["engine", "nodes", "tests", "main.py"]


def ruff(*args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("ruff")
    command = [exe] if exe else [sys.executable, "-m", "ruff"]
    return subprocess.run([*command, *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_ruff_lint_is_clean() -> None:
    done = ruff("check", *PATHS)
    assert done.returncode == 0, (
        f"ruff check found problems (fix them, or `ruff check --fix`):\n{done.stdout}"
    )


def test_the_code_is_formatted_by_ruff_format() -> None:
    done = ruff("format", "--check", *PATHS)
    assert done.returncode == 0, f"run `ruff format {' '.join(PATHS)}`; these files differ:\n{done.stdout}"
