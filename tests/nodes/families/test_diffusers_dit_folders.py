"""Diffusers folders of the DiT families (SD3's StableDiffusion3Pipeline, Flux's FluxPipeline: a
``transformer/`` instead of a ``unet/``) are not read yet; DiffusersLoader says which family the
folder is and which single files and loaders to use instead, rather than that ``unet/config.json``
is missing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.context import Folders, NodeContext, RunSettings
from engine.folders import ModelFolders
from engine.memory.manager import ModelManager
from nodes.core.tensors import ModelLoadError
from nodes.load.checkpoint_loaders import DiffusersLoader


def _sd3() -> Any:
    from diffusers import SD3Transformer2DModel

    return SD3Transformer2DModel(
        sample_size=8,
        patch_size=2,
        in_channels=16,
        num_layers=1,
        attention_head_dim=8,
        num_attention_heads=2,
        joint_attention_dim=32,
        caption_projection_dim=16,
        pooled_projection_dim=16,
        out_channels=16,
        pos_embed_max_size=16,
    )


def _flux() -> Any:
    from diffusers import FluxTransformer2DModel

    return FluxTransformer2DModel(
        patch_size=1,
        in_channels=64,
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=8,
        num_attention_heads=2,
        joint_attention_dim=32,
        pooled_projection_dim=16,
        axes_dims_rope=(2, 2, 4),
    )


def _folder(root: Path, pipeline: str, transformer: Any) -> str:
    folder = root / "diffusers" / pipeline
    transformer.save_pretrained(folder / "transformer")
    index = {
        "_class_name": pipeline,
        "_diffusers_version": "0.35.0",
        "transformer": ["diffusers", type(transformer).__name__],
        "vae": ["diffusers", "AutoencoderKL"],
    }
    (folder / "model_index.json").write_text(json.dumps(index))
    return pipeline


@pytest.mark.parametrize(
    "pipeline,make,title", [("StableDiffusion3Pipeline", _sd3, "SD3"), ("FluxPipeline", _flux, "Flux")]
)
def test_dit_diffusers_folders_say_which_files_to_use(
    pipeline: str, make: Any, title: str, tmp_path: Path
) -> None:
    torch.manual_seed(0)
    name = _folder(tmp_path / "models", pipeline, make())
    ctx = NodeContext(
        "4",
        "p",
        Folders(tmp_path, tmp_path, tmp_path, model_files=ModelFolders(tmp_path / "models")),
        models=ModelManager(),
        settings=RunSettings(),
    )
    with pytest.raises(
        ModelLoadError, match=f"diffusers {pipeline} folder .*{title}.*CheckpointLoaderSimple.*UNETLoader"
    ):
        DiffusersLoader().run(ctx, model_path=name)
