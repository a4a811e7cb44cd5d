"""The DiT ControlNet example workflows (web/workflows/controlnet_flux.api.json: a Flux union
ControlNet with a VAE-encoded control image stacked with an XLabs one; controlnet_sd3.api.json:
an SD3 ControlNet through ControlNetApplySD3; controlnet_sd35.api.json: Stability's SD3.5 depth
ControlNet layout through ControlNetApplyAdvanced; controlnet_flux_inpaint / controlnet_sd3_inpaint:
outpainting with AliMama's inpainting ControlNets through ControlNetInpaintingAliMamaApply) run
offline on the demo files, and the ControlNets change the picture."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from tests.nodes.test_generation_e2e import make_executor, run

WORKFLOWS = Path(__file__).resolve().parents[3] / "web" / "workflows"


@pytest.fixture(scope="module")
def sd3_demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch

    from nodes.demo.sd3 import make_sd3_demo

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("sd3_cn_demo")
    make_sd3_demo(root)
    return root


def with_controlnets(models: Path) -> Path:
    from safetensors.torch import save_file

    from nodes.demo.control import make_dit_control_demos

    def write(path: Path, tensors: dict[str, Any]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(path))

    make_dit_control_demos(models, write)
    return models


def run_to_image(executor: Any, prompt: dict, out: Path) -> np.ndarray:
    result = run(executor, prompt)
    assert result.status == "success", (result.node_errors, result.error)
    (image,) = result.outputs["9"]["images"]
    with Image.open(out / "output" / image["subfolder"] / image["filename"]) as png:
        assert png.size == (64, 64)
        return np.asarray(png).astype(np.float32)


def without_controlnets(prompt: dict, applies: tuple[str, ...]) -> dict:
    """The same workflow with the apply nodes bypassed (KSampler gets the plain conditioning)."""
    plain = json.loads(json.dumps(prompt))
    first = prompt[applies[0]]["inputs"]
    plain["3"]["inputs"]["positive"], plain["3"]["inputs"]["negative"] = first["positive"], first["negative"]
    for node in applies:
        del plain[node]
    return plain


@pytest.mark.parametrize(
    ("name", "applies"),
    [
        ("controlnet_flux", ("16", "18")),
        ("controlnet_sd3", ("15",)),
        ("controlnet_sd35", ("15",)),
        ("controlnet_flux_inpaint", ("16",)),
        ("controlnet_sd3_inpaint", ("15",)),
    ],
)
def test_dit_controlnet_workflow_runs_and_the_control_matters(
    name: str, applies: tuple[str, ...], flux_demo: Path, sd3_demo: Path, tmp_path: Path
) -> None:
    models = with_controlnets(flux_demo if name.startswith("controlnet_flux") else sd3_demo)
    prompt = json.loads((WORKFLOWS / f"{name}.api.json").read_text())
    executor = make_executor(models, tmp_path)
    controlled = run_to_image(executor, prompt, tmp_path)
    assert controlled.std() > 1.0  # not a flat image
    plain = run_to_image(executor, without_controlnets(prompt, applies), tmp_path)
    assert np.abs(controlled - plain).max() > 0
