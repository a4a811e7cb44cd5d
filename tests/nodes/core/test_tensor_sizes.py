"""Every core node that declares its outputs' sizes (``estimate_outputs``, helpers in
nodes/core/tensor_sizes.py) declares exactly what it then makes: each is run at small sizes and
its declared shape compared with the real output's. The issue's workflow (EmptyImage 4096² × 8 →
ImageInvert → ImageInvert) is refused under ``--ram-budget 1.5`` before anything is allocated."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

import main
from engine.node import NativeNodeDef, Node, TensorSize
from nodes.family_nodes.flux2_nodes import EmptyFlux2LatentImage
from nodes.family_nodes.flux_nodes import EmptySD3LatentImage
from nodes.image.load_save import EmptyImage, ImageScale, ImageScaleBy
from nodes.image.mask import SolidMask
from nodes.image.scale import ImageScaleToMaxDimension, ImageScaleToTotalPixels, ResizeAndPadImage
from nodes.image.transforms import ImageBatch, ImagePadForOutpaint, RepeatImageBatch
from nodes.latent.batch import LatentBatch, RepeatLatentBatch
from nodes.latent.vae import EmptyLatentImage, LatentUpscale, LatentUpscaleBy, VAEDecode

IMAGE = torch.rand(2, 24, 40, 3)
LATENT = {"samples": torch.zeros(2, 4, 6, 10)}


def _size(value: Any) -> TensorSize:
    tensor = value["samples"] if isinstance(value, dict) else value
    return TensorSize(tuple(tensor.shape), tensor.element_size())


def _declared(value: Any) -> Any:
    return _size(value) if isinstance(value, torch.Tensor | dict) else value


CASES: list[tuple[type[Node], dict[str, Any]]] = [
    (EmptyImage, {"width": 40, "height": 24, "batch_size": 3, "color": 0}),
    (EmptyLatentImage, {"width": 64, "height": 48, "batch_size": 2}),
    (EmptySD3LatentImage, {"width": 64, "height": 48, "batch_size": 2}),
    (EmptyFlux2LatentImage, {"width": 64, "height": 48, "batch_size": 2}),
    (SolidMask, {"value": 1.0, "width": 40, "height": 24}),
    (
        ImageScale,
        {"image": IMAGE, "upscale_method": "nearest-exact", "width": 64, "height": 0, "crop": "disabled"},
    ),
    (ImageScale, {"image": IMAGE, "upscale_method": "bilinear", "width": 30, "height": 30, "crop": "center"}),
    (ImageScale, {"image": IMAGE, "upscale_method": "bilinear", "width": 0, "height": 0, "crop": "disabled"}),
    (ImageScaleBy, {"image": IMAGE, "upscale_method": "bilinear", "scale_by": 1.3}),
    (
        ImageScaleToTotalPixels,
        {"image": IMAGE, "upscale_method": "area", "megapixels": 0.01, "resolution_steps": 8},
    ),
    (ImageScaleToMaxDimension, {"image": IMAGE, "upscale_method": "area", "largest_size": 50}),
    (
        ResizeAndPadImage,
        {
            "image": IMAGE,
            "target_width": 50,
            "target_height": 50,
            "padding_color": "white",
            "interpolation": "area",
        },
    ),
    (ImagePadForOutpaint, {"image": IMAGE, "left": 8, "top": 0, "right": 16, "bottom": 8, "feathering": 4}),
    (RepeatImageBatch, {"image": IMAGE, "amount": 3}),
    (ImageBatch, {"image1": IMAGE, "image2": torch.rand(1, 12, 20, 3)}),
    (
        LatentUpscale,
        {"samples": LATENT, "upscale_method": "bilinear", "width": 160, "height": 0, "crop": "disabled"},
    ),
    (
        LatentUpscale,
        {"samples": LATENT, "upscale_method": "bilinear", "width": 0, "height": 40, "crop": "disabled"},
    ),
    (LatentUpscaleBy, {"samples": LATENT, "upscale_method": "bilinear", "scale_by": 1.5}),
    (RepeatLatentBatch, {"samples": LATENT, "amount": 4}),
    (LatentBatch, {"samples1": LATENT, "samples2": {"samples": torch.zeros(3, 4, 6, 10)}}),
]


@pytest.mark.parametrize(
    ("cls", "inputs"), CASES, ids=[f"{c.__name__}-{i}" for i, (c, _) in enumerate(CASES)]
)
def test_declared_sizes_are_the_sizes_made(cls: type[Node], inputs: dict[str, Any]) -> None:
    declared = NativeNodeDef(cls).estimate_outputs({k: _declared(v) for k, v in inputs.items()})
    made = cls().run(None, **inputs)
    assert declared == tuple(_size(v) for v in made)


def test_vae_decode_declares_rgb_at_eight_times_the_latent() -> None:
    declared = NativeNodeDef(VAEDecode).estimate_outputs({"samples": TensorSize((2, 4, 64, 64)), "vae": None})
    assert declared == (TensorSize((2, 512, 512, 3)),)


def test_a_widget_fed_by_a_link_leaves_the_size_unknown() -> None:
    assert NativeNodeDef(EmptyImage).estimate_outputs({"width": None, "height": 512, "batch_size": 1}) == (
        None,
    )
    assert NativeNodeDef(ImageScaleBy).estimate_outputs({"image": None, "scale_by": 2.0}) == (None,)


ISSUE_WORKFLOW = {
    "1": {"class_type": "EmptyImage", "inputs": {"width": 4096, "height": 4096, "batch_size": 8, "color": 0}},
    "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
    "3": {"class_type": "ImageInvert", "inputs": {"image": ["2", 0]}},
    "4": {"class_type": "PreviewImage", "inputs": {"images": ["3", 0]}},
}


def test_the_issue_workflow_is_refused_under_a_small_budget_before_it_allocates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workflow = tmp_path / "big.json"
    workflow.write_text(json.dumps(ISSUE_WORKFLOW))
    folders = ["--output-dir", str(tmp_path / "out"), "--input-dir", str(tmp_path / "in")]
    folders += ["--temp-dir", str(tmp_path / "temp"), "--models-dir", str(tmp_path / "models")]
    code = main.main(
        ["run", str(workflow), "--json", "--ram-budget", "1.5", "--disable-custom-nodes", *folders]
    )
    line = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert code == 2 and line["status"] == "invalid" and line["executed"] == []
    issue = line["node_errors"]["1"]["errors"][0]
    assert line["node_errors"]["1"]["class_type"] == "EmptyImage"
    assert issue["type"] == "exceeds_ram_budget"
    assert issue["details"].startswith(
        "node 1 (EmptyImage) would make 1.50 GiB of tensors (8x4096x4096x3 values of 4 bytes), "
        "but the process RAM budget of 1.50 GiB leaves "
    )
    assert "raise --ram-budget" in issue["details"]
