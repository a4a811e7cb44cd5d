"""ResolutionBucket (nodes/latent/resolution_bucket.py): one batch per size in first-seen order,
each sample keeping its own conditioning, and teaching errors for unpaired inputs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.context import Folders, NodeContext
from nodes.latent.resolution_bucket import BucketError, ResolutionBucket


@pytest.fixture
def ctx(tmp_path: Path) -> NodeContext:
    return NodeContext(node_id="1", prompt_id="p", folders=Folders(tmp_path, tmp_path, tmp_path))


def test_groups_by_height_and_width(ctx: NodeContext) -> None:
    square = {"samples": torch.zeros(2, 4, 8, 8)}
    wide = {"samples": torch.ones(1, 4, 8, 12)}
    square_again = {"samples": torch.full((1, 4, 8, 8), 2.0)}
    latents, conds = ResolutionBucket().run(
        ctx, latents=[square, wide, square_again], conditioning=[["s0", "s1"], ["w0"], ["s2"]]
    )
    assert [tuple(b["samples"].shape) for b in latents] == [(3, 4, 8, 8), (1, 4, 8, 12)]
    assert conds == [["s0", "s1", "s2"], ["w0"]]
    assert latents[0]["samples"][2].eq(2.0).all()  # the later square sample comes last in its bucket
    info = ResolutionBucket.SCHEMA.export()
    assert info["output_is_list"] == [True, True] and info["output_name"] == ["latents", "conditioning"]


def test_unpaired_inputs_teach(ctx: NodeContext) -> None:
    latent = {"samples": torch.zeros(2, 4, 8, 8)}
    with pytest.raises(BucketError, match="latents: the list is empty"):
        ResolutionBucket().run(ctx, latents=[], conditioning=[])
    with pytest.raises(BucketError, match=r"conditioning: expected one entry per latent \(1\), found 2"):
        ResolutionBucket().run(ctx, latents=[latent], conditioning=[["a", "b"], ["c"]])
    with pytest.raises(BucketError, match=r"conditioning\[0\]: expected 2 entries"):
        ResolutionBucket().run(ctx, latents=[latent], conditioning=[["a"]])
