"""Latent previews of video latents [B, C, T, h, w] (nodes/image/preview.py): the latent->RGB map of the
VAE's latent space applied to the first frame, as ComfyUI's Latent2RGBPreviewer does, for the Wan 2.1
(16-channel) and Wan 2.2 (48-channel) latent spaces."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch
from PIL import Image

from engine.context import Folders, NodeContext
from engine.folders import ModelFolders
from engine.memory.manager import ModelManager
from nodes.families.latent_format import WAN21_LATENT, WAN22_LATENT, LatentFormat
from nodes.image.preview import PreviewRenderer


@pytest.mark.parametrize("fmt", [WAN21_LATENT, WAN22_LATENT], ids=["wan21", "wan22"])
def test_a_video_latent_previews_its_first_frame(tmp_path: Path, fmt: LatentFormat) -> None:
    folders = Folders(tmp_path, tmp_path, tmp_path, model_files=ModelFolders(tmp_path / "models"))
    ctx = NodeContext("3", "p", folders, models=ModelManager())  # type: ignore[arg-type]
    renderer = PreviewRenderer(ctx, fmt, method="latent2rgb")
    # one colour per frame (JPEG keeps flat colours; noise it blurs)
    x0 = torch.randn(1, fmt.channels, 3, 1, 1, generator=torch.Generator().manual_seed(0)).expand(
        -1, -1, -1, 6, 10
    )
    with Image.open(io.BytesIO(renderer.render(x0).data)) as im:
        assert im.size == (10, 6)
        pixels = torch.tensor(list(im.getdata()), dtype=torch.float32).reshape(6, 10, 3)
    factors, bias = torch.tensor(fmt.rgb_factors), torch.tensor(fmt.rgb_bias)
    expected = ((torch.einsum("chw,cr->hwr", x0[0, :, 0], factors) + bias + 1) / 2).clamp(0, 1) * 255
    assert (pixels - expected).abs().mean() < 4  # JPEG at quality 80
    other = x0.clone().contiguous()
    other[:, :, 1:] = 0  # the later frames do not change it
    assert renderer.render(other).data == renderer.render(x0).data
