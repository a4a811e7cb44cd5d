"""Demo models (plus demo TAESD and a second checkpoint) shared by the performance tests."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

CKPT = "loom_demo_sd15.safetensors"
CKPT_B = "loom_demo_sd15_b.safetensors"


@pytest.fixture(scope="session")
def perf_models(tmp_path_factory: pytest.TempPathFactory, demo_models_source: Path) -> Path:
    from nodes.image.preview import make_demo_taesd
    from tests.conftest import linked_copy

    root = linked_copy(demo_models_source, tmp_path_factory.mktemp("perf_models"))
    make_demo_taesd(root)
    ckpts = root / "checkpoints"
    try:  # another name is another model for Loom (fingerprints hold the path)
        os.link(ckpts / CKPT, ckpts / CKPT_B)
    except OSError:
        shutil.copy(ckpts / CKPT, ckpts / CKPT_B)
    return root


@pytest.fixture()
def runtime(perf_models: Path, tmp_path: Path) -> Any:
    from nodes.bench.runtime import BenchRuntime

    rt = BenchRuntime(perf_models, tmp_path / "work")
    yield rt
    rt.close()
