"""A preview decoder file in models/vae_approx never fails a job (issue 19, item 8): a damaged,
foreign or pickled TAESD file is logged once and the run previews with latent->RGB instead, and
``.pth`` decoders are read weights-only and refused under ``--refuse-pickle`` (the rule every
pickled file obeys)."""

from __future__ import annotations

import io
import logging
from pathlib import Path

import pytest
import torch

from engine.context import Folders, NodeContext, RunSettings
from engine.folders import ModelFolders
from engine.memory.manager import ModelManager
from nodes.families.catalog import SD15
from nodes.image.preview import PreviewRenderer, make_demo_taesd


def _ctx(models: Path, tmp_path: Path, **settings: object) -> NodeContext:
    ctx = NodeContext(
        "3",
        "p",
        Folders(tmp_path, tmp_path, tmp_path, model_files=ModelFolders(models)),
        models=ModelManager(),
        settings=RunSettings(**settings),
    )  # type: ignore[arg-type]
    ctx.on_preview = lambda node, preview: None
    return ctx


def _preview_size(renderer: PreviewRenderer) -> tuple[int, int]:
    from PIL import Image

    with Image.open(io.BytesIO(renderer.render(torch.randn(1, 4, 8, 8)).data)) as im:
        return im.size


def _stem() -> str:
    stem = SD15().latent_format.taesd_decoder
    assert stem is not None
    return stem


def test_a_damaged_decoder_falls_back_to_latent_rgb_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "models" / "vae_approx"
    folder.mkdir(parents=True)
    (folder / f"{_stem()}.safetensors").write_bytes(b"\x10\x00\x00\x00not a safetensors file at all")
    renderer = PreviewRenderer(_ctx(tmp_path / "models", tmp_path), SD15().latent_format)
    assert renderer.method == "taesd"
    with caplog.at_level(logging.WARNING, logger="nodes.image.preview"):
        assert renderer.estimate((1, 4, 8, 8)) == 0.0
        assert _preview_size(renderer) == (8, 8)  # the latent->RGB preview: one pixel per latent cell
        assert _preview_size(renderer) == (8, 8)
    assert renderer.method == "latent2rgb"
    warnings = [r for r in caplog.records if "cannot be used" in r.getMessage()]
    assert len(warnings) == 1 and "latent->RGB" in warnings[0].getMessage()


def test_pickled_decoders_are_refused_with_refuse_pickle_and_read_weights_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from safetensors.torch import load_file

    made = make_demo_taesd(tmp_path / "demo")
    source = next(p for p in made if p.stem == _stem())
    folder = tmp_path / "models" / "vae_approx"
    folder.mkdir(parents=True)
    torch.save(load_file(str(source)), folder / f"{_stem()}.pth")

    refused = PreviewRenderer(_ctx(tmp_path / "models", tmp_path, allow_pickle=False), SD15().latent_format)
    with caplog.at_level(logging.WARNING, logger="nodes.image.preview"):
        assert _preview_size(refused) == (8, 8)
    assert "--allow-pickle" in caplog.text and refused.method == "latent2rgb"

    allowed = PreviewRenderer(_ctx(tmp_path / "models", tmp_path), SD15().latent_format)
    assert _preview_size(allowed) == (64, 64) and allowed.method == "taesd"
