"""Block streaming on Z-Image (a DiT without a declared block stack: the generic block list — its
noise refiner, context refiner and main layers) and its Qwen3 text encoder, under a simulated
budget of one block: the embeddings and the sampled latent are bit-identical to the resident run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.memory.manager import ModelManager
from nodes.demo.zimage import DEMO_QWEN3, DEMO_ZIMAGE, make_zimage_demo
from nodes.encode.conditioning import CLIPTextEncode
from nodes.family_nodes.flux_nodes import EmptySD3LatentImage
from nodes.load.handles import open_diffusion_model, open_text_encoders
from tests.nodes.core.test_streaming import ksample, one_block_budget, streaming_record, with_budget


@pytest.fixture(scope="module")
def zimage_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("zimage_streaming")
    make_zimage_demo(root)
    return root


@pytest.fixture()
def streamed_manager() -> Iterator[ModelManager]:
    mm = ModelManager(ram_budget_bytes=2**30, prefetch=False)
    yield mm
    mm.close()


def test_zimage_and_qwen3_streamed_one_block_at_a_time_are_bit_identical(
    zimage_root: Path, make_ctx: Any, streamed_manager: ModelManager
) -> None:
    torch.set_num_threads(1)
    ctx = make_ctx()
    clip = open_text_encoders([zimage_root / "text_encoders" / DEMO_QWEN3], "lumina2")
    model = open_diffusion_model(zimage_root / "diffusion_models" / DEMO_ZIMAGE)
    pos = CLIPTextEncode().run(ctx, text="a photo of a cat", clip=clip)[0]
    neg = CLIPTextEncode().run(ctx, text="blurry", clip=clip)[0]
    latent = EmptySD3LatentImage().run(ctx, width=64, height=64, batch_size=1)[0]
    resident = ksample(ctx, model, pos, neg, latent)

    text_ctx = with_budget(ctx, streamed_manager, one_block_budget(clip))
    pos_s = CLIPTextEncode().run(text_ctx, text="a photo of a cat", clip=clip)[0]
    assert all(torch.equal(s.embeds, r.embeds) for s, r in zip(pos_s, pos, strict=True))
    assert streaming_record(streamed_manager, clip)["fetches"] > 0

    streamed_manager.free()
    streamed = ksample(with_budget(ctx, streamed_manager, one_block_budget(model)), model, pos, neg, latent)
    assert torch.equal(streamed, resident)
    record = streaming_record(streamed_manager, model)
    # Z-Image declares its main layers as the block stack (the refiners stay in the resident part)
    assert record["resident"] == 0 and record["streamed"] == record["blocks"] >= 2
