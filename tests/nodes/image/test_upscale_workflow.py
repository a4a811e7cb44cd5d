"""The hires-fix example workflow (sample, upscale with the demo ESRGAN, scale down, resample) runs
offline on the demo models written by make-demo-model, through the executor and model manager."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from tests.conftest import DemoFiles

ROOT = Path(__file__).resolve().parents[3]
WORKFLOWS = ROOT / "web" / "workflows"


@pytest.fixture(scope="module")
def demo_models(tmp_path_factory: pytest.TempPathFactory, all_demo_models_source: DemoFiles) -> Path:
    demo = all_demo_models_source.copy_to(tmp_path_factory.mktemp("demo_upscale_models"))
    root, paths = demo.root, demo.written
    assert (root / "upscale_models" / "loom_demo_esrgan_4x.safetensors") in paths
    return root


def test_hires_upscale_workflow_runs_offline(demo_models: Path, tmp_path: Path) -> None:
    from engine.cache import OutputCache
    from engine.context import Folders
    from engine.executor import Executor, RunRequest
    from engine.folders import ModelFolders
    from engine.memory import ModelManager
    from engine.registry import NodeRegistry
    from nodes import register_core

    files = ModelFolders(demo_models)
    folders = Folders(tmp_path / "input", tmp_path / "output", tmp_path / "temp", model_files=files)
    folders.ensure()
    registry = NodeRegistry()
    register_core(registry, files)
    manager = ModelManager(ram_budget_bytes=2**30, prefetch=False)
    try:
        executor = Executor(registry, OutputCache(1 << 30), folders, models=manager)
        prompt = json.loads((WORKFLOWS / "hires_upscale.api.json").read_text())
        result = executor.run(RunRequest(prompt=prompt))
    finally:
        manager.close()
    assert result.status == "success", (result.node_errors, result.error)
    (image,) = result.outputs["9"]["images"]
    with Image.open(tmp_path / "output" / image["subfolder"] / image["filename"]) as png:
        assert png.size == (128, 128)  # 64 px → ×4 by the model → ×0.5 → resampled at 128 px
    assert "upscale_model" in [x["kind"] for x in result.memory["loads"]]
