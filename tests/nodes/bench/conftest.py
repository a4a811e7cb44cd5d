"""The shared bench runtime of the fast-path tests (over ``demo_models_ab``, tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


@pytest.fixture()
def runtime(demo_models_ab: Path, tmp_path: Path) -> Any:
    from nodes.bench.runtime import BenchRuntime

    rt = BenchRuntime(demo_models_ab, tmp_path / "work")
    yield rt
    rt.close()
