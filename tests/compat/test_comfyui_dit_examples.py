"""ComfyUI's own example workflows for Flux dev, Flux schnell and SD3.5 (the graphs embedded in the
PNGs of comfyanonymous.github.io/ComfyUI_examples: the same node ids, links, widget orders,
control-after-generate values, PrimitiveNodes, Notes, groups and old-frontend shapes), saved in UI
format with the demo file names and a 64 px size, convert to the API prompt ComfyUI's frontend sent
for them (``*.api.json``: the published prompts with the same substitutions, plus the ``device``
widget today's CLIP loaders have) and run unchanged on the demo models."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from engine.formats import convert_ui_to_api
from tests.nodes.test_generation_e2e import make_executor, run

WORKFLOWS = Path(__file__).parent / "workflows"
EXAMPLES = ["flux_dev_example", "flux_schnell_example", "sd35_text_encoders_example"]


@pytest.fixture(scope="module")
def demo_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from nodes.demo.flux import make_flux_demo
    from nodes.demo.sd3 import make_sd3_demo

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("dit_examples")
    make_flux_demo(root)
    make_sd3_demo(root)
    return root


def load(name: str) -> Any:
    return json.loads((WORKFLOWS / name).read_text())


def graph(prompt: dict[str, Any]) -> dict[str, Any]:
    return {k: (v["class_type"], v["inputs"]) for k, v in prompt.items()}


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_converts_to_the_prompt_comfyuis_frontend_sends(
    name: str, demo_models: Path, tmp_path: Path
) -> None:
    executor = make_executor(demo_models, tmp_path)
    assert graph(convert_ui_to_api(load(f"{name}.json"), executor.registry.object_info())) == graph(
        load(f"{name}.api.json")
    )


def test_virtual_nodes_are_dissolved_and_shared_primitives_reach_both_targets(
    demo_models: Path, tmp_path: Path
) -> None:
    """Flux dev's width/height PrimitiveNodes feed EmptySD3LatentImage and ModelSamplingFlux; the
    Notes and the PrimitiveNodes themselves are not in the prompt."""
    executor = make_executor(demo_models, tmp_path)
    ui = load("flux_dev_example.json")
    ui["nodes"] = [
        n if n["type"] != "PrimitiveNode" else {**n, "widgets_values": [48, "fixed"]} for n in ui["nodes"]
    ]
    prompt = convert_ui_to_api(ui, executor.registry.object_info())
    assert {k: v for k, v in prompt["27"]["inputs"].items() if k != "batch_size"} == {
        "width": 48,
        "height": 48,
    }
    assert (prompt["30"]["inputs"]["width"], prompt["30"]["inputs"]["height"]) == (48, 48)
    assert not {"28", "34", "35", "37"} & set(prompt)


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_runs_unchanged_on_the_demo_models(name: str, demo_models: Path, tmp_path: Path) -> None:
    executor = make_executor(demo_models, tmp_path)
    prompt = convert_ui_to_api(load(f"{name}.json"), executor.registry.object_info())
    result = run(executor, prompt)
    assert result.status == "success", (result.node_errors, result.error)
    (image,) = result.outputs["9"]["images"]
    with Image.open(tmp_path / "output" / image["subfolder"] / image["filename"]) as png:
        assert png.size == (64, 64)
        assert np.asarray(png).std() > 1.0  # not a flat image


def test_unconnected_text_encoder_loaders_of_the_sd35_example_are_not_run(
    demo_models: Path, tmp_path: Path
) -> None:
    """The SD3.5 example's group shows CLIPLoader and DualCLIPLoader with nothing attached: ComfyUI
    sends them but runs only what an output needs, so a missing file there is no error."""
    executor = make_executor(demo_models, tmp_path)
    prompt = convert_ui_to_api(load("sd35_text_encoders_example.json"), executor.registry.object_info())
    prompt["41"]["inputs"]["clip_name"] = "not_there.safetensors"
    result = run(executor, prompt)
    assert result.status == "success", (result.node_errors, result.error)
