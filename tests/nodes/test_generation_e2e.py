"""The shipped example workflows (web/workflows/*.api.json) run end to end with the demo models,
through the executor with the generation nodes registered, and bad inputs fail on the right node."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / "web" / "workflows"


@pytest.fixture(scope="module")
def demo_models(tmp_path_factory: pytest.TempPathFactory, demo_models_source: Path) -> Path:
    from tests.conftest import linked_copy

    return linked_copy(demo_models_source, tmp_path_factory.mktemp("demo_models"))


def make_executor(models_dir: Path, work: Path, **settings: Any) -> Any:
    from engine.cache import OutputCache
    from engine.context import Folders, RunSettings
    from engine.executor import Executor
    from engine.folders import ModelFolders
    from engine.memory.manager import ModelManager
    from engine.registry import NodeRegistry
    from nodes import register_core
    from nodes.encode.conditioning import NODES as CONDITIONING_NODES
    from nodes.image.load_save import NODES as IMAGE_NODES
    from nodes.image.load_save import register_image_options
    from nodes.latent.vae import NODES as LATENT_NODES
    from nodes.sample.ksampler import NODES as SAMPLING_NODES

    files = ModelFolders(models_dir)
    folders = Folders(work / "input", work / "output", work / "temp", model_files=files)
    folders.ensure()
    registry = NodeRegistry()
    register_core(registry, files)
    for group in (SAMPLING_NODES, CONDITIONING_NODES, LATENT_NODES, IMAGE_NODES):
        for node in group:
            if node.SCHEMA.node_id not in registry:
                registry.register(node)
    register_image_options(registry, folders.input_dir)
    manager = ModelManager(ram_budget_bytes=2**30, prefetch=False)
    return Executor(registry, OutputCache(1 << 30), folders, models=manager, settings=RunSettings(**settings))


def run(executor: Any, prompt: dict, **extra: Any) -> Any:
    from engine.executor import RunRequest

    return executor.run(RunRequest(prompt=prompt, **extra))


@pytest.mark.parametrize(
    "name",
    [
        "txt2img",
        "img2img",
        "lora",
        "inpaint",
        "sdxl",
        "controlnet",
        "controlnet_stacked",
        "t2i_adapter",
        "controlnet_diff",
        "controlnet_union_sdxl",
    ],
)
def test_example_workflow_runs(name: str, demo_models: Path, tmp_path: Path) -> None:
    prompt = json.loads((WORKFLOWS / f"{name}.api.json").read_text())
    result = run(make_executor(demo_models, tmp_path), prompt, extra_pnginfo={"workflow": {"nodes": []}})
    assert result.status == "success", (result.node_errors, result.error)
    (image,) = result.outputs["9"]["images"]
    path = tmp_path / "output" / image["subfolder"] / image["filename"]
    with Image.open(path) as png:
        assert png.size == (64, 64)
        assert json.loads(png.text["prompt"])["3"]["class_type"] == "KSampler"
        assert "workflow" in png.text


def test_bad_inputs_fail_on_the_right_node(demo_models: Path, tmp_path: Path) -> None:
    executor = make_executor(demo_models, tmp_path)
    prompt = json.loads((WORKFLOWS / "txt2img.api.json").read_text())
    prompt["5"]["inputs"]["width"] = 60
    result = run(executor, prompt)
    assert result.status == "invalid" and "5" in result.node_errors
    assert "multiple of 8" in json.dumps(result.node_errors["5"])

    sdxl = json.loads((WORKFLOWS / "sdxl.api.json").read_text())
    mixed = json.loads((WORKFLOWS / "txt2img.api.json").read_text())
    mixed.update({f"x{k}": _renumber(v) for k, v in sdxl.items() if k in ("4", "5", "6", "7", "3")})
    mixed["3"]["inputs"]["latent_image"] = ["x3", 0]
    result = run(executor, mixed)
    assert result.status == "error" and result.error["node_id"] == "3"
    assert "SDXL model" in result.error["exception_message"]

    (tmp_path / "input" / "fake.png").write_text("hello")
    img2img = json.loads((WORKFLOWS / "img2img.api.json").read_text())
    img2img["10"] = {"class_type": "LoadImage", "inputs": {"image": "fake.png"}}
    result = run(executor, img2img)
    assert result.status == "error" and result.error["node_id"] == "10"
    assert "not an image" in result.error["exception_message"]


def _renumber(node: dict) -> dict:
    inputs = {k: ([f"x{v[0]}", v[1]] if isinstance(v, list) else v) for k, v in node["inputs"].items()}
    return {**node, "inputs": inputs}


_SCRIPT = """
import json, sys
sys.path.insert(0, {root!r})
from pathlib import Path
from tests.nodes.test_generation_e2e import make_executor, run
ex = make_executor(Path({models!r}), Path({work!r}))
res = run(ex, json.loads(Path({wf!r}).read_text()))
print(json.dumps(res.outputs["9"]["images"][0]))
"""


@pytest.mark.slow
def test_same_workflow_same_pixels_in_two_processes(demo_models: Path, tmp_path: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    works = [tmp_path / f"w{i}" for i in range(2)]
    # two independent processes, started together (each spends most of its time importing)
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                _SCRIPT.format(
                    root=str(ROOT),
                    models=str(demo_models),
                    work=str(work),
                    wf=str(WORKFLOWS / "txt2img.api.json"),
                ),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=ROOT,
        )
        for work in works
    ]
    pixels = []
    for proc, work in zip(procs, works, strict=True):
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err
        image = json.loads(out.strip().splitlines()[-1])
        pixels.append(np.asarray(Image.open(work / "output" / image["subfolder"] / image["filename"])))
    assert np.array_equal(pixels[0], pixels[1])
