"""VAE nodes with a separate VAE file (VAELoader): a standalone file is read by its channel count
(a 4-channel KL VAE as SD1's, a 16-channel one as Flux's), so the VAE nodes compare the latents'
channel count with the VAE's and never the latent scale (VAE nodes never scale). SDXL latents decode
with a separate SDXL VAE file and SD3 latents with a separate SD3 VAE file, through VAEDecode,
VAEDecodeTiled, VAEEncode and VAEEncodeTiled; latents of another width still fail with a message."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.context import Folders, NodeContext, RunSettings
from engine.folders import ModelFolders
from engine.memory.manager import ModelManager
from nodes.families.catalog import SD3, SDXL
from nodes.latent.vae import LatentError, VAEDecode, VAEDecodeTiled, VAEEncode, VAEEncodeTiled, tag_latent
from nodes.load.checkpoint_loaders import VAELoader

SDXL_VAE = "tiny_vae.safetensors"  # SDXL's KL VAE layout is SD1's: a 4-channel file


@pytest.fixture(scope="module")
def vae_models(tmp_path_factory: pytest.TempPathFactory, models_dir: Path) -> Path:
    from nodes.demo.sd3 import make_sd3_demo

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("separate_vae")
    make_sd3_demo(root)
    shutil.copy(models_dir / "vae" / SDXL_VAE, root / "vae" / SDXL_VAE)
    return root


def _ctx(models: Path, tmp_path: Path) -> NodeContext:
    return NodeContext(
        "8",
        "p",
        Folders(tmp_path, tmp_path, tmp_path, model_files=ModelFolders(models)),
        models=ModelManager(),
        settings=RunSettings(),
    )


def _vae_file(family: Any) -> str:
    from nodes.demo.sd3 import DEMO_SD3_VAE

    return DEMO_SD3_VAE if family is SD3 else SDXL_VAE


def _sampled_latent(family: Any, side: int) -> dict:
    """What a sampler of ``family`` outputs: raw latents tagged with the family's latent space."""
    torch.manual_seed(0)
    return tag_latent({"samples": torch.randn(1, family.latent_format.channels, side, side)}, family())


@pytest.mark.parametrize("family", [SDXL, SD3])
def test_sampled_latents_decode_with_a_separate_vae_file(
    family: Any, vae_models: Path, tmp_path: Path
) -> None:
    ctx = _ctx(vae_models, tmp_path)
    (vae,) = VAELoader().run(ctx, vae_name=_vae_file(family))
    latent = _sampled_latent(family, 16)
    (image,) = VAEDecode().run(ctx, samples=latent, vae=vae)
    (tiles,) = VAEDecodeTiled().run(ctx, samples=latent, vae=vae, tile_size=64, overlap=32)
    assert image.shape == tiles.shape == (1, 128, 128, 3)
    assert (image - tiles).abs().mean() < 0.1  # the tiles blend to the whole decode


@pytest.mark.parametrize("family", [SDXL, SD3])
def test_images_encode_with_a_separate_vae_file_to_the_family_width(
    family: Any, vae_models: Path, tmp_path: Path
) -> None:
    ctx = _ctx(vae_models, tmp_path)
    (vae,) = VAELoader().run(ctx, vae_name=_vae_file(family))
    torch.manual_seed(1)
    pixels = torch.rand(1, 128, 128, 3)
    (whole,) = VAEEncode().run(ctx, pixels=pixels, vae=vae)
    (tiled,) = VAEEncodeTiled().run(ctx, pixels=pixels, vae=vae, tile_size=64, overlap=32)
    shape = (1, family.latent_format.channels, 16, 16)
    assert whole["samples"].shape == tiled["samples"].shape == shape
    (image,) = VAEDecodeTiled().run(ctx, samples=tiled, vae=vae, tile_size=64, overlap=32)
    assert image.shape == (1, 128, 128, 3)


@pytest.mark.parametrize("node", [VAEDecode, VAEDecodeTiled])
def test_latents_of_another_width_still_fail_with_a_message(
    node: Any, vae_models: Path, tmp_path: Path
) -> None:
    ctx = _ctx(vae_models, tmp_path)
    (vae,) = VAELoader().run(ctx, vae_name=SDXL_VAE)
    inputs = {"tile_size": 64, "overlap": 32} if node is VAEDecodeTiled else {}
    with pytest.raises(LatentError, match="made by a SD3 model.*16 channels.*decodes 4-channel"):
        node().run(ctx, samples=_sampled_latent(SD3, 8), vae=vae, **inputs)
