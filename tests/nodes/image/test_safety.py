"""Safety checker: verdicts equal diffusers' at sensitivity 0.5, the actions, sensitivity, the
``off`` policy, the enforce guard on preview frames and saved images, and start-up refusal."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from engine.context import Preview
from engine.image_guard import GuardUnavailable, ImageGuard
from nodes.demo.vision import set_thresholds, tiny_safety_checker
from nodes.image.safety import SafetyChecker, SafetyGuard, SafetyHandle, blur, build_guard, scores

CONFIGS = Path(__file__).resolve().parents[3] / "models" / "configs"


def _images(n: int = 2, size: int = 64, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    small = torch.rand(n, 3, 6, 6, generator=g)
    big = torch.nn.functional.interpolate(small, size=(size, size), mode="bilinear", align_corners=False)
    return (big * 255).round().div(255).permute(0, 2, 3, 1).contiguous()


@pytest.fixture(scope="module")
def safety_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("safety_models")
    tiny_safety_checker(flag=True).save_pretrained(root / "safety" / "flags_all")
    tiny_safety_checker(flag=False).save_pretrained(root / "safety" / "flags_none")
    edge = tiny_safety_checker(seed=0)
    set_thresholds(edge, 2.0)
    (root / "safety" / "edge").mkdir(parents=True)
    edge.save_pretrained(root / "safety" / "edge")
    return root


@pytest.fixture()
def ctx(make_ctx: Any, model_folders: Any, safety_dir: Path) -> Any:
    model_folders.add_folder("safety", safety_dir / "safety")
    return make_ctx()


def _run(
    ctx: Any, images: torch.Tensor, model: str, action: str, sensitivity: float = 0.5
) -> tuple[torch.Tensor, list]:
    out = SafetyChecker().run(
        ctx, images=images, sensitivity=sensitivity, action=action, safety_model=f"{model}/model.safetensors"
    )
    assert out.ui is not None
    return out.values[0], out.ui["safety"]


def test_verdicts_equal_diffusers_safety_checker() -> None:
    from transformers import CLIPImageProcessor

    from nodes.encode.clip_vision import preprocess

    checker = tiny_safety_checker(seed=3)
    images = _images(6, seed=1)
    proc = CLIPImageProcessor.from_pretrained(CONFIGS / "safety")
    pil = [(im.numpy() * 255).round().astype(np.uint8) for im in images]
    clip_input = proc(pil, return_tensors="pt").pixel_values
    # within 2 8-bit levels (PIL rounds its fixed-point coefficients in both passes)
    assert torch.allclose(clip_input, preprocess(images, 224, "center"), atol=2 / 255 / 0.26)
    # thresholds at the median cosine so that some images are flagged and some not
    with torch.no_grad():
        raw = scores(checker, clip_input, 0.5) + 2.0  # cosine max with thresholds at 2
        set_thresholds(checker, float(raw.median()))
    ours = scores(checker, clip_input, 0.5) > 0
    _, ref = checker(clip_input=clip_input, images=images.clone().numpy())
    assert 0 < sum(ref) < len(ref)
    assert ours.tolist() == [bool(x) for x in ref]


def test_actions_do_what_they_say(ctx: Any) -> None:
    images = torch.rand(2, 64, 48, 3, generator=torch.Generator().manual_seed(0))  # full of detail
    black, verdicts = _run(ctx, images, "flags_all", "black")
    assert torch.count_nonzero(black) == 0 and all(v["flagged"] and v["action"] == "black" for v in verdicts)
    blurred, _ = _run(ctx, images, "flags_all", "blur")
    assert blurred.shape == images.shape and blurred.abs().sum() > 0
    assert (blurred - images).abs().max() > 0.01
    detail = (blurred[:, 1:] - blurred[:, :-1]).abs().mean()
    assert detail < 0.5 * (images[:, 1:] - images[:, :-1]).abs().mean()
    marked, verdicts = _run(ctx, images, "flags_all", "mark-only")
    assert torch.equal(marked, images) and all(v["flagged"] and v["action"] == "mark-only" for v in verdicts)
    clean, verdicts = _run(ctx, images, "flags_none", "black")
    assert torch.equal(clean, images) and not any(v["flagged"] for v in verdicts)
    assert blur(images).shape == images.shape


def test_sensitivity_shifts_thresholds(ctx: Any, safety_dir: Path) -> None:
    images = _images(1)
    handle = SafetyHandle.from_file(safety_dir / "safety" / "edge" / "model.safetensors")
    with ctx.models.use(handle) as checker:
        from nodes.encode.clip_vision import preprocess

        top = float(scores(checker, preprocess(images, 224, "center"), 0.5)[0])
        set_thresholds(checker, 2.0 + top + 0.05)  # score -0.05 at sensitivity 0.5 (the resident module)
        pixels = preprocess(images, 224, "center")
        assert float(scores(checker, pixels, 0.5)[0]) == pytest.approx(-0.05, abs=1e-4)
        # sensitivity 1 lowers every threshold by 0.1: special care now hits too (+0.01)
        assert float(scores(checker, pixels, 1.0)[0]) == pytest.approx(0.06, abs=1e-4)
    _, at_half = _run(ctx, images, "edge", "black", 0.5)
    _, at_one = _run(ctx, images, "edge", "black", 1.0)
    assert not at_half[0]["flagged"] and at_one[0]["flagged"]


def test_off_checks_nothing(make_ctx: Any, model_folders: Any, safety_dir: Path) -> None:
    model_folders.add_folder("safety", safety_dir / "safety")
    ctx = make_ctx(safety="off")
    images = _images(2)
    out, verdicts = _run(ctx, images, "flags_all", "black")
    assert torch.equal(out, images) and all(v["checked"] is False for v in verdicts)
    assert ctx.models.stats()["loads"] == []


def test_enforce_guard_replaces_previews_and_encoded_files(ctx: Any, safety_dir: Path) -> None:
    from PIL import Image

    handle = SafetyHandle.from_file(safety_dir / "safety" / "flags_all" / "model.safetensors")
    guard = SafetyGuard(handle, ctx.models, action="black", policy="enforce")
    assert isinstance(guard, ImageGuard)
    buf = io.BytesIO()
    Image.fromarray((_images(1)[0].numpy() * 255).astype(np.uint8)).save(buf, format="JPEG")
    checked = guard.check_preview(Preview("JPEG", buf.getvalue()))
    assert checked is not None and checked.format == "JPEG"
    assert np.asarray(Image.open(io.BytesIO(checked.data))).max() <= 2  # black (JPEG noise aside)
    assert any(x["kind"] == "safety" for x in ctx.models.stats()["loads"])


def test_enforce_refuses_without_a_model_or_with_mark_only(
    manager: Any, tmp_path: Path, safety_dir: Path
) -> None:
    from engine.folders import ModelFolders

    empty = ModelFolders(tmp_path / "models")
    with pytest.raises(GuardUnavailable, match="no safety checker model in models/safety"):
        build_guard("enforce", empty, manager)
    assert build_guard("node", empty, manager) is None
    folders = ModelFolders(tmp_path / "models")
    folders.add_folder("safety", safety_dir / "safety")
    with pytest.raises(ValueError, match="mark-only lets flagged images out"):
        build_guard("enforce", folders, manager, action="mark-only")
    assert isinstance(build_guard("enforce", folders, manager), SafetyGuard)
