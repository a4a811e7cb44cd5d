"""The unCLIP, Flux Redux and InstructPix2Pix example workflows run offline on the demo models
written by make-demo-model, through the executor and model manager; and LoraSave writes a LoRA of
a model difference that LoraLoader then loads, in one graph."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from tests.conftest import DemoFiles

ROOT = Path(__file__).resolve().parents[3]
WORKFLOWS = ROOT / "web" / "workflows"


@pytest.fixture(scope="module")
def demo_models(tmp_path_factory: pytest.TempPathFactory, all_demo_models_source: DemoFiles) -> Path:
    import torch

    torch.set_num_threads(1)
    demo = all_demo_models_source.copy_to(tmp_path_factory.mktemp("demo_unclip_models"))
    root, paths = demo.root, demo.written
    assert (root / "checkpoints" / "loom_demo_sd21_unclip.safetensors") in paths
    assert (root / "style_models" / "loom_demo_flux_redux.safetensors") in paths
    return root


def _run(demo_models: Path, tmp_path: Path, prompt: dict[str, Any]) -> Any:
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
        return Executor(registry, OutputCache(1 << 30), folders, models=manager).run(
            RunRequest(prompt=prompt)
        )
    finally:
        manager.close()


@pytest.mark.parametrize("name", ["unclip", "flux_redux", "instruct_pix2pix"])
def test_the_example_workflow_runs_offline(demo_models: Path, tmp_path: Path, name: str) -> None:
    prompt = json.loads((WORKFLOWS / f"{name}.api.json").read_text())
    result = _run(demo_models, tmp_path, prompt)
    assert result.status == "success", (result.node_errors, result.error)
    (image,) = result.outputs["9"]["images"]
    with Image.open(tmp_path / "output" / image["subfolder"] / image["filename"]) as png:
        assert png.size == (64, 64)


def test_an_unclip_conditioning_on_a_plain_checkpoint_fails_with_a_teaching_error(
    demo_models: Path, tmp_path: Path
) -> None:
    prompt = json.loads((WORKFLOWS / "unclip.api.json").read_text())
    prompt["1"] = {
        "class_type": "CheckpointLoaderSimple",
        "inputs": {"ckpt_name": "loom_demo_sd15.safetensors"},
    }
    prompt["3"]["inputs"]["model"] = ["1", 0]
    result = _run(demo_models, tmp_path, prompt)
    assert result.status == "error"
    assert "unCLIPCheckpointLoader" in json.dumps([result.error, result.node_errors], default=str)


def test_lorasave_of_a_difference_loads_back_with_loraloader(demo_models: Path, tmp_path: Path) -> None:
    extract = {
        "1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "loom_demo_sd15.safetensors"}},
        "2": {
            "class_type": "LoraLoader",
            "inputs": {
                "model": ["1", 0],
                "clip": ["1", 1],
                "lora_name": "loom_demo_lora.safetensors",
                "strength_model": 1.0,
                "strength_clip": 1.0,
            },
        },
        "3": {
            "class_type": "ModelMergeSubtract",
            "inputs": {"model1": ["2", 0], "model2": ["1", 0], "multiplier": 1.0},
        },
        "4": {
            "class_type": "LoraSave",
            "inputs": {
                "filename_prefix": "loras/extracted",
                "rank": 4,
                "lora_type": "standard",
                "bias_diff": True,
                "model_diff": ["3", 0],
            },
        },
    }
    result = _run(demo_models, tmp_path, extract)
    assert result.status == "success", (result.node_errors, result.error)
    (saved,) = result.outputs["4"]["models"]
    path = tmp_path / "output" / saved["subfolder"] / saved["filename"]
    target = demo_models / "loras" / "extracted_demo.safetensors"
    target.write_bytes(path.read_bytes())
    use = json.loads((WORKFLOWS / "txt2img.api.json").read_text())
    loader = next(k for k, v in use.items() if v["class_type"] == "CheckpointLoaderSimple")
    use["90"] = {
        "class_type": "LoraLoaderModelOnly",
        "inputs": {"model": [loader, 0], "lora_name": "extracted_demo.safetensors", "strength_model": 1.0},
    }
    for v in use.values():
        if v["class_type"] == "KSampler":
            v["inputs"]["model"] = ["90", 0]
    result = _run(demo_models, tmp_path, use)
    target.unlink()
    assert result.status == "success", (result.node_errors, result.error)
