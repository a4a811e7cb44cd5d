"""GetLatentSize (nodes/latent/latent_size.py): sizes in latent cells, frames of video latents, the
first stream of a nested latent, and a teaching error for something that is not a latent."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.context import Folders, NodeContext
from nodes.latent.latent_size import GetLatentSize


@pytest.fixture
def ctx(tmp_path: Path) -> NodeContext:
    return NodeContext(node_id="1", prompt_id="p", folders=Folders(tmp_path, tmp_path, tmp_path))


def test_image_and_video_latents(ctx: NodeContext) -> None:
    node = GetLatentSize()
    assert node.run(ctx, latent={"samples": torch.zeros(2, 4, 64, 96)}) == (96, 64, 1, 2)
    assert node.run(ctx, latent={"samples": torch.zeros(1, 16, 5, 30, 40)}) == (40, 30, 5, 1)
    nested = {"samples": [torch.zeros(3, 4, 8, 12), torch.zeros(3, 8, 1)]}
    assert node.run(ctx, latent=nested) == (12, 8, 1, 3)


def test_not_a_latent_teaches(ctx: NodeContext) -> None:
    with pytest.raises(ValueError, match=r"latent: expected samples \[B, C, H, W\].*shape \(4, 4\)"):
        GetLatentSize().run(ctx, latent={"samples": torch.zeros(4, 4)})
