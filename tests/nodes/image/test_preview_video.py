"""A video latent (B, C, frames, h, w) previews as its first frame, as ComfyUI's previewers do: the
latent->RGB preview of a 5-D latent equals that of its first frame."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from engine.context import Folders, NodeContext, RunSettings
from engine.folders import ModelFolders
from engine.memory.manager import ModelManager
from nodes.families.catalog import family_by_name
from nodes.image.preview import PreviewRenderer


def _pixels(renderer: PreviewRenderer, latent: torch.Tensor) -> np.ndarray:
    with Image.open(io.BytesIO(renderer.render(latent).data)) as im:
        return np.asarray(im.convert("RGB"))


def test_a_video_latent_previews_its_first_frame(tmp_path: Path) -> None:
    ctx = NodeContext(
        "3",
        "p",
        Folders(tmp_path, tmp_path, tmp_path, model_files=ModelFolders(tmp_path / "models")),
        models=ModelManager(),
        settings=RunSettings(),
    )  # type: ignore[arg-type]
    fmt = family_by_name("wan21").latent_format
    renderer = PreviewRenderer(ctx, fmt)
    video = torch.randn(1, 16, 3, 6, 10, generator=torch.Generator().manual_seed(0))
    frame = _pixels(renderer, video)
    assert frame.shape == (6, 10, 3)
    np.testing.assert_array_equal(frame, _pixels(renderer, video[:, :, 0]))
    assert not np.array_equal(frame, _pixels(renderer, video[:, :, 1]))
