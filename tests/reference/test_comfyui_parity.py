"""ComfyUI parity: every public reference case of ``../shared/reference/comfyui`` (ComfyUI's own
latents and PNGs for small SD1.5 workflows) run through Loom gives the same latent and image
within the README's "same-output" tolerances: latent max |Δ| ≤ 0.02 and mean |Δ| ≤ 0.004,
pixel max |Δ| ≤ 2 and mean |Δ| ≤ 0.02.

The full-size random SD1.5 checkpoint is regenerated once (the reference folder's own script)
into ``~/.cache/loom-reference`` (or ``$LOOM_REFERENCE_CACHE``), checked against the README's
sha256, and loaded once per session (one executor for all cases). The workflows run unchanged
except that ComfyUI's ``SaveLatent`` is swapped for a test node that keeps the tensor.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
# ../shared/reference/comfyui beside the clone (as CI lays it out); LOOM_REFERENCE_DIR overrides it
# for a checkout elsewhere (e.g. a git worktree).
REFERENCE = Path(os.environ.get("LOOM_REFERENCE_DIR", ROOT.parent / "shared" / "reference" / "comfyui"))
CHECKPOINT_SHA256 = "4ad5b8fb598022dd12eeb290b44cb433aa7fad4ae3ecc40e2c770399edf73023"
LATENT_MAX, LATENT_MEAN, PIXEL_MAX, PIXEL_MEAN = 0.02, 0.004, 2.0, 0.02
# Cases whose second-order ancestral midpoint lands on a timestep tie (t = 166.5, see
# tests/nodes/diffusion/test_midpoint_ties.py): the reference CPU's float32 log/exp (oneMKL, Intel code path)
# put it on UNet timestep 167; other CPUs give 166 in ComfyUI as in Loom, ~0.02 latent |Δ| apart.
TIE_SENSITIVE = {"p05_dpm_2_ancestral_normal", "p08_dpmpp_2s_ancestral_sgm_uniform"}

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (REFERENCE / "public" / "cases.json").is_file(),
        reason=f"ComfyUI reference outputs not found at {REFERENCE} (CI puts shared/ beside the clone)",
    ),
]


def _cases() -> list[dict[str, Any]]:
    if not (REFERENCE / "public" / "cases.json").is_file():
        return []
    return [
        c for c in json.loads((REFERENCE / "public" / "cases.json").read_text())["cases"] if "error" not in c
    ]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def _cache() -> Path:
    """The models and inputs the workflows name, generated once by the reference scripts."""
    root = Path(os.environ.get("LOOM_REFERENCE_CACHE", Path.home() / ".cache" / "loom-reference"))
    ckpt = root / "models" / "checkpoints" / "ref_sd15.safetensors"
    stamp = ckpt.with_suffix(".sha256")
    if not (ckpt.is_file() and stamp.is_file() and stamp.read_text().strip() == CHECKPOINT_SHA256):
        ckpt.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, str(REFERENCE / "make_reference_sd15.py"), "--out", str(ckpt)], check=True
        )
        found = _sha256(ckpt)
        assert found == CHECKPOINT_SHA256, (
            f"regenerated checkpoint has sha256 {found}, expected {CHECKPOINT_SHA256}"
        )
        stamp.write_text(found)
    inputs = root / "input"
    if not (inputs / "ref_mask_64.png").is_file():
        subprocess.run([sys.executable, str(REFERENCE / "make_test_images.py"), str(inputs)], check=True)
    return root


class _Latents:
    """Where the test's SaveLatent stand-in puts each latent, by filename prefix."""

    def __init__(self) -> None:
        self.saved: dict[str, torch.Tensor] = {}


def _capture_node(store: _Latents) -> Any:
    from engine.node import Node
    from engine.schema import LATENT, STRING, Input, NodeSchema

    class SaveLatent(Node):
        SCHEMA = NodeSchema(
            node_id="SaveLatent",
            display_name="Save Latent (test capture)",
            category="test",
            description="Keeps the latent in memory for the parity test.",
            inputs=(Input("samples", LATENT, "The latent."), Input("filename_prefix", STRING, "Name.")),
            outputs=(),
            output_node=True,
        )

        def run(self, ctx: Any, *, samples: dict, filename_prefix: str) -> tuple[()]:
            store.saved[filename_prefix.split("/")[-1]] = samples["samples"].float().clone()
            return ()

    return SaveLatent


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from engine.cache import OutputCache
    from engine.context import Folders
    from engine.executor import Executor
    from engine.folders import ModelFolders
    from engine.memory.manager import ModelManager
    from engine.registry import NodeRegistry
    from nodes import register_core
    from nodes.image.load_save import register_image_options

    threads = torch.get_num_threads()
    # The references were made with one thread; two threads move latents by ~1e-3 (the measured noise
    # floor, noise_floor.json), far inside the tolerances, and halve this module's time on CI.
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    cache = _cache()
    work = tmp_path_factory.mktemp("parity")
    files = ModelFolders(cache / "models")
    folders = Folders(cache / "input", work / "output", work / "temp", model_files=files)
    folders.ensure()
    store = _Latents()
    registry = NodeRegistry()
    register_core(registry, files)
    capture = _capture_node(store)
    if "SaveLatent" in registry:
        registry._defs.pop("SaveLatent")
    registry.register(capture)
    register_image_options(registry, folders.input_dir)
    executor = Executor(
        registry,
        OutputCache(1 << 30),
        folders,
        models=ModelManager(ram_budget_bytes=12 << 30, prefetch=False),
    )
    yield executor, store, work
    torch.set_num_threads(threads)


def _breaks_ties_like_the_reference_cpu() -> bool:
    """Whether this CPU's float32 log/exp put p05's last dpm_2_ancestral midpoint on timestep 167,
    as the machine that made the references did (measured there: ComfyUI's result matches only with 167)."""
    from nodes.diffusion import model_sampling, schedulers
    from nodes.diffusion.k_samplers import get_ancestral_step

    sampling = model_sampling.discrete()
    sigmas = schedulers.ksampler_sigmas(sampling, "normal", "dpm_2_ancestral", 6)
    sigma_down, _ = get_ancestral_step(sigmas[4], sigmas[5])
    midpoint = sigmas[4].log().lerp(sigma_down.log(), 0.5).exp()
    return int(sampling.timestep(midpoint.expand(2))[0]) == 167


def _pixels(path: Path) -> np.ndarray:
    from PIL import Image

    with Image.open(path) as img:
        return np.asarray(img.convert("RGB")).astype(np.float64)


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c["name"])
def test_same_output_as_comfyui(case: dict[str, Any], reference_run: Any) -> None:
    from engine.executor import RunRequest

    executor, store, work = reference_run
    prompt = json.loads((REFERENCE / "public" / case["workflow"]).read_text())
    for node in prompt.values():
        if node["class_type"] == "SaveImage":
            node["inputs"]["filename_prefix"] = case["name"]
    result = executor.run(RunRequest(prompt=prompt))
    assert result.status == "success", (result.node_errors, result.error)
    report = []
    for name in case["latents"]:
        from safetensors.torch import load_file

        ref = load_file(str(REFERENCE / "public" / name))["latent_tensor"].double()
        mine = store.saved[name.removesuffix(".latent")].double()
        assert mine.shape == ref.shape
        d = (mine - ref).abs()
        report.append(f"{name}: latent max {float(d.max()):.2e} mean {float(d.mean()):.2e}")
        within = float(d.max()) <= LATENT_MAX and float(d.mean()) <= LATENT_MEAN
        if not within and case["name"] in TIE_SENSITIVE and not _breaks_ties_like_the_reference_cpu():
            pytest.xfail(
                f"{report}: this CPU's float32 log/exp break the t=166.5 timestep tie the other way "
                "from the reference CPU (ComfyUI on this CPU differs from its reference just as much)"
            )
        assert float(d.max()) <= LATENT_MAX and float(d.mean()) <= LATENT_MEAN, report
    images = sorted(
        str(Path(f.get("subfolder", "")) / f["filename"])
        for o in result.outputs.values()
        for f in o.get("images", [])
    )
    refs = [im["file"] for im in case["images"]]
    assert len(images) == len(refs)
    for mine_name, ref_name in zip(images, refs, strict=True):
        d = np.abs(_pixels(work / "output" / mine_name) - _pixels(REFERENCE / "public" / ref_name))
        report.append(f"{ref_name}: pixel max {d.max():.0f} mean {d.mean():.4f}")
        assert d.max() <= PIXEL_MAX and d.mean() <= PIXEL_MEAN, report
    print(case["name"], "; ".join(report))
