"""Live previews per family: each family's latent format names its TAESD decoder file (ComfyUI's
``models/vae_approx`` names), the decoder reads its latent width from the file, so the 16-channel
taef1 (Flux, Chroma, Z-Image) and taesd3 (SD3) decoders preview like SD's 4-channel ones; families
without a TAESD decoder (Flux.2, Qwen-Image) preview with the latent->RGB map, without warnings."""

from __future__ import annotations

import io
import logging
from pathlib import Path

import pytest
import torch

from engine.context import Folders, NodeContext, RunSettings
from engine.folders import ModelFolders
from engine.memory.manager import ModelManager
from nodes.families.base import FamilyAdapter
from nodes.families.catalog import SD3, SD15, SDXL, Chroma, Flux, Flux2, QwenImage, ZImage
from nodes.image.preview import PreviewRenderer, make_demo_taesd


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("models")
    make_demo_taesd(root)
    return root


def _renderer(models: Path, tmp_path: Path, family: type[FamilyAdapter]) -> PreviewRenderer:
    ctx = NodeContext(
        "3",
        "p",
        Folders(tmp_path, tmp_path, tmp_path, model_files=ModelFolders(models)),
        models=ModelManager(),
        settings=RunSettings(),
    )
    return PreviewRenderer(ctx, family.latent_format)


def _preview_size(renderer: PreviewRenderer, channels: int) -> tuple[int, int]:
    from PIL import Image

    torch.manual_seed(0)
    with Image.open(io.BytesIO(renderer.render(torch.randn(1, channels, 8, 8)).data)) as im:
        return im.size


@pytest.mark.parametrize("family", [SD15, SDXL, Flux, Chroma, ZImage, SD3])
def test_families_with_a_taesd_decoder_preview_with_it(
    family: type[FamilyAdapter], models: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    renderer = _renderer(models, tmp_path, family)
    with caplog.at_level(logging.WARNING, logger="nodes.image.preview"):
        assert _preview_size(renderer, family.latent_format.channels) == (64, 64)  # TAESD: 8x the latent
    assert renderer.method == "taesd" and not caplog.records


@pytest.mark.parametrize("family", [Flux2, QwenImage])
def test_families_without_one_preview_with_latent_rgb_quietly(
    family: type[FamilyAdapter], models: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert family.latent_format.taesd_decoder is None
    renderer = _renderer(models, tmp_path, family)
    with caplog.at_level(logging.WARNING):
        assert _preview_size(renderer, family.latent_format.channels) == (8, 8)  # one pixel per latent cell
    assert renderer.method == "latent2rgb" and not caplog.records


def test_demo_decoders_are_as_wide_as_their_family_latents(models: Path) -> None:
    from safetensors.torch import load_file

    for family in (SD15, SDXL, Flux, SD3):
        stem = family.latent_format.taesd_decoder
        first = load_file(str(models / "vae_approx" / f"{stem}.safetensors"))["1.weight"]
        assert first.shape[1] == family.latent_format.channels, stem


def test_an_old_four_channel_demo_taef1_is_rewritten(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    made = {p.stem: p for p in make_demo_taesd(tmp_path)}
    made["taef1_decoder"].write_bytes(made["taesd_decoder"].read_bytes())  # what older demos wrote
    make_demo_taesd(tmp_path)
    assert load_file(str(made["taef1_decoder"]))["1.weight"].shape[1] == 16


def test_a_decoder_of_the_wrong_width_falls_back_with_a_teaching_warning(
    models: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "wrong" / "vae_approx"
    folder.mkdir(parents=True)
    (folder / "taef1_decoder.safetensors").write_bytes(
        (models / "vae_approx" / "taesd_decoder.safetensors").read_bytes()
    )
    renderer = _renderer(tmp_path / "wrong", tmp_path, Flux)
    with caplog.at_level(logging.WARNING, logger="nodes.image.preview"):
        assert _preview_size(renderer, 16) == (8, 8)
    assert renderer.method == "latent2rgb"
    assert "decodes 4-channel latents" in caplog.text and "16-channel" in caplog.text
