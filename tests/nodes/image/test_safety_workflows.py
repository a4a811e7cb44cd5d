"""The ipadapter and safety example workflows run with the demo models through the executor, and the
``enforce`` policy replaces flagged images on disk and in preview frames without a SafetyChecker
node; ``off`` checks nothing."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from engine.image_guard import was_checked

ROOT = Path(__file__).resolve().parents[3]
WORKFLOWS = ROOT / "web" / "workflows"


@pytest.fixture(scope="module")
def demo_models(tmp_path_factory: pytest.TempPathFactory, demo_models_source: Path) -> Path:
    from nodes.demo.vision import make_demo_vision_models, tiny_safety_checker
    from tests.conftest import linked_copy

    root = linked_copy(demo_models_source, tmp_path_factory.mktemp("demo_vision_models"))
    paths = make_demo_vision_models(root)
    assert all(p.is_file() for p in paths)
    tiny_safety_checker(flag=True).save_pretrained(root / "safety" / "zz_flags_all")
    return root


def make_executor(models_dir: Path, work: Path, *, guard_model: str | None = None, **settings: Any) -> Any:
    from engine.cache import OutputCache
    from engine.context import Folders, RunSettings
    from engine.executor import Executor
    from engine.folders import ModelFolders
    from engine.memory import ModelManager
    from engine.registry import NodeRegistry
    from nodes import register_core
    from nodes.control.ipadapter import NODES as IPADAPTER_NODES
    from nodes.encode.clip_vision import NODES as CLIP_VISION_NODES
    from nodes.encode.conditioning import NODES as CONDITIONING_NODES
    from nodes.image.load_save import NODES as IMAGE_NODES
    from nodes.image.safety import NODES as SAFETY_NODES
    from nodes.image.safety import build_guard
    from nodes.latent.vae import NODES as LATENT_NODES
    from nodes.sample.ksampler import NODES as SAMPLING_NODES

    files = ModelFolders(models_dir)
    folders = Folders(work / "input", work / "output", work / "temp", model_files=files)
    folders.ensure()
    registry = NodeRegistry()
    register_core(registry, files)
    for group in (
        SAMPLING_NODES,
        CONDITIONING_NODES,
        LATENT_NODES,
        IMAGE_NODES,
        CLIP_VISION_NODES,
        IPADAPTER_NODES,
        SAFETY_NODES,
    ):
        for node in group:
            if node.SCHEMA.node_id not in registry:
                registry.register(node)
    manager = ModelManager(ram_budget_bytes=2**30, prefetch=False)
    guard = build_guard("enforce", files, manager, model_name=guard_model) if guard_model else None
    return Executor(
        registry,
        OutputCache(1 << 30),
        folders,
        models=manager,
        settings=RunSettings(**settings),
        image_guard=guard,
    )


def run(executor: Any, prompt: dict) -> Any:
    from engine.executor import RunRequest

    return executor.run(RunRequest(prompt=prompt))


def _saved(work: Path, result: Any, node: str = "9") -> np.ndarray:
    (image,) = result.outputs[node]["images"]
    with Image.open(work / "output" / image["subfolder"] / image["filename"]) as png:
        return np.asarray(png.convert("RGB"))


@pytest.mark.parametrize("name", ["ipadapter", "safety"])
def test_example_workflow_runs(name: str, demo_models: Path, tmp_path: Path) -> None:
    prompt = json.loads((WORKFLOWS / f"{name}.api.json").read_text())
    result = run(make_executor(demo_models, tmp_path), prompt)
    assert result.status == "success", (result.node_errors, result.error)
    assert _saved(tmp_path, result).shape == (64, 64, 3)
    if name == "safety":
        (verdict,) = result.outputs["20"]["safety"]
        assert verdict["flagged"] is False and verdict["action"] == "none"  # the demo checker flags nothing
    else:
        assert "clip_vision" in [x["kind"] for x in result.memory["loads"]]


def test_enforce_replaces_saved_images_and_previews_without_the_node(
    demo_models: Path, tmp_path: Path
) -> None:
    from engine import events as ev

    prompt = json.loads((WORKFLOWS / "txt2img.api.json").read_text())
    executor = make_executor(demo_models, tmp_path, guard_model="zz_flags_all/model.safetensors")
    frames: list[bytes] = []
    executor.bus.subscribe(lambda e: frames.append(e.image) if isinstance(e, ev.PreviewFrame) else None)
    result = run(executor, prompt)
    assert result.status == "success", result.error
    assert _saved(tmp_path, result).max() == 0  # flagged: blacked out on disk
    (image,) = result.outputs["9"]["images"]
    with Image.open(tmp_path / "output" / image["subfolder"] / image["filename"]) as png:
        assert json.loads(png.info["loom_safety"]) == {"checked": True, "policy": "enforce"}
    assert was_checked(tmp_path / "output" / image["subfolder"] / image["filename"])
    from engine.context import Preview

    # a preview frame on its way to the websocket goes through the guard too
    executor._preview(executor_request(), "3", Preview("PNG", _png(np.full((8, 8, 3), 200, np.uint8))))
    assert frames and np.asarray(Image.open(io.BytesIO(frames[-1]))).max() == 0


def test_off_and_node_policies_leave_images_alone(demo_models: Path, tmp_path: Path) -> None:
    prompt = json.loads((WORKFLOWS / "safety.api.json").read_text())
    prompt["20"]["inputs"].update(safety_model="zz_flags_all/model.safetensors", action="black")
    node = run(make_executor(demo_models, tmp_path / "node"), prompt)
    assert node.outputs["20"]["safety"][0]["flagged"] and _saved(tmp_path / "node", node).max() == 0
    off = run(make_executor(demo_models, tmp_path / "off", safety="off"), prompt)
    assert off.outputs["20"]["safety"][0]["checked"] is False and _saved(tmp_path / "off", off).max() > 0
    assert "safety" not in [x["kind"] for x in off.memory["loads"]]
    (image,) = off.outputs["9"]["images"]
    assert not was_checked(
        tmp_path / "off" / "output" / image["subfolder"] / image["filename"]
    )  # /view checks it


def executor_request() -> Any:
    from engine.executor import RunRequest

    return RunRequest(prompt={})


def _png(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()
