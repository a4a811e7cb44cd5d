"""Inside a transformer denoiser, every linear layer multiplies a contiguous input
(``nodes/core/linear_inputs.py``): a strided 3-D input makes torch take a batched product over an
expanded weight, which on CPU cost SD3.5 medium 7-12% per step against diffusers.

Each case runs a shipped example workflow for one step on the demo models (with its CFG, so the
conditional and unconditional passes share one batch) and records, through ``F.linear``, the
inputs of the denoiser's linear layers: plain ``nn.Linear`` and Loom's stored-precision layers
alike. Outside the denoiser (text encoders, VAE) nothing is recorded.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import DemoFiles
from tests.nodes.test_generation_e2e import make_executor, run

WORKFLOWS = Path(__file__).resolve().parents[3] / "web" / "workflows"


def _one_step(prompt: dict[str, Any]) -> dict[str, Any]:
    for node in prompt.values():
        if "steps" in node["inputs"]:
            node["inputs"]["steps"] = 1
    return prompt


def _sd35_fp8(prompt: dict[str, Any]) -> dict[str, Any]:
    """The SD3.5 example with its transformer read by UNETLoader in fp8 (stored-precision layers)."""
    from nodes.demo.sd3 import DEMO_SD3_MMDIT

    prompt["12"] = {
        "class_type": "UNETLoader",
        "inputs": {"unet_name": DEMO_SD3_MMDIT, "weight_dtype": "fp8_e4m3fn"},
    }
    prompt["3"]["inputs"]["model"] = ["12", 0]
    return prompt


CASES: dict[str, tuple[str, Callable[[dict[str, Any]], dict[str, Any]]]] = {
    "sd35": ("sd35.api.json", lambda p: p),
    "sd35_fp8": ("sd35.api.json", _sd35_fp8),
    "flux_schnell": ("flux_schnell.api.json", lambda p: p),
    "chroma": ("chroma.api.json", lambda p: p),
    "z_image_turbo": ("z_image_turbo.api.json", lambda p: p),
    "qwen_image": ("qwen_image.api.json", lambda p: p),
    "flux2_klein": ("flux2_klein.api.json", lambda p: p),
}


class StridedInputs:
    """Records the shapes of strided 3-D inputs that reach ``F.linear`` while a marked module runs."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, ...]] = []
        self.depth = 0

    def linear(self, plain: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        def recording(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            if self.depth and x.dim() > 2 and not x.is_contiguous():
                self.seen.append(tuple(x.shape))
            return plain(x, *args, **kwargs)

        return recording

    def mark(self, module: torch.nn.Module) -> torch.nn.Module:
        module.register_forward_pre_hook(lambda *_: setattr(self, "depth", self.depth + 1))
        module.register_forward_hook(lambda *_: setattr(self, "depth", self.depth - 1))
        return module


@pytest.fixture
def strided(monkeypatch: pytest.MonkeyPatch) -> StridedInputs:
    """A recorder on ``F.linear``, with every denoiser the loaders build marked."""
    import nodes.load.handles

    recorder = StridedInputs()
    build = nodes.load.handles.build_from_single_file

    def marking_build(part: Any, index: Any) -> Any:
        module = build(part, index)
        return recorder.mark(module) if part.name == "unet" else module

    monkeypatch.setattr(torch.nn.functional, "linear", recorder.linear(torch.nn.functional.linear))
    monkeypatch.setattr(nodes.load.handles, "build_from_single_file", marking_build)
    return recorder


@pytest.mark.parametrize("case", sorted(CASES))
def test_denoiser_linear_layers_get_contiguous_inputs(
    case: str, all_demo_models_source: DemoFiles, strided: StridedInputs, tmp_path: Path
) -> None:
    workflow, adapt = CASES[case]
    models = all_demo_models_source.copy_to(tmp_path / "models").root
    prompt = adapt(_one_step(json.loads((WORKFLOWS / workflow).read_text())))
    result = run(make_executor(models, tmp_path / "work"), prompt)
    assert result.status == "success", (result.node_errors, result.error)
    assert strided.seen == []


def test_the_recorder_sees_strided_inputs_inside_a_marked_module_only(strided: StridedInputs) -> None:
    """The check above can fail: a slice fed to a linear layer inside a marked module is recorded."""

    class Sliced(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.proj(x[:, :3])

    wide = torch.zeros(2, 5, 4)
    plain, marked = Sliced(), strided.mark(Sliced())
    with torch.no_grad():
        plain(wide)
        assert strided.seen == []
        marked(wide)
    assert strided.seen == [(2, 3, 4)]


def test_copy_sliced_inputs_gives_the_same_product() -> None:
    from nodes.core.linear_inputs import copy_sliced_inputs

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    wide = torch.randn(2, 7, 8)
    with torch.no_grad():
        expected = net[1](wide[:, :5])
        copy_sliced_inputs(net, ["1"])
        assert torch.allclose(net[1](wide[:, :5]), expected, atol=1e-6)
        assert net[0](wide[:, :5]).shape == (2, 5, 8)  # not named: untouched
    assert len(net[1]._forward_pre_hooks) == 1 and not net[0]._forward_pre_hooks
