"""Streaming moves weights in their stored precision: a Flux transformer whose linear weights are
stored as fp8 (UNETLoader's ``weight_dtype``) streams its blocks as fp8 bytes — a quarter of their
fp32 size — computes in fp32 as the resident model does, and samples the bit-identical latent."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.memory.manager import ModelManager
from nodes.core.module_streaming import device_bytes
from nodes.demo.flux import DEMO_CLIP_L, DEMO_FLUX_DEV, DEMO_T5XXL
from nodes.encode.conditioning import CLIPTextEncode
from nodes.family_nodes.flux_nodes import EmptySD3LatentImage
from nodes.load.handles import open_diffusion_model, open_text_encoders
from nodes.quant.layers import QuantLayer
from nodes.quant.storage import StoragePatch
from tests.nodes.core.test_streaming import ksample, one_block_budget, streaming_record, with_budget


@pytest.fixture()
def streamed_manager() -> Iterator[ModelManager]:
    mm = ModelManager(ram_budget_bytes=2**30, prefetch=False)
    yield mm
    mm.close()


def test_fp8_blocks_stream_as_fp8_and_sample_bit_identically(
    flux_demo: Path, make_ctx: Any, streamed_manager: ModelManager
) -> None:
    torch.set_num_threads(1)
    ctx = make_ctx()
    clip = open_text_encoders(
        [flux_demo / "text_encoders" / DEMO_T5XXL, flux_demo / "text_encoders" / DEMO_CLIP_L], "flux"
    )
    pos = CLIPTextEncode().run(ctx, text="a cat on a roof", clip=clip)[0]
    neg = CLIPTextEncode().run(ctx, text="blurry", clip=clip)[0]
    model = open_diffusion_model(flux_demo / "diffusion_models" / DEMO_FLUX_DEV).with_patch(
        StoragePatch("fp8_e4m3fn")
    )
    latent = EmptySD3LatentImage().run(ctx, width=64, height=64, batch_size=1)[0]
    resident = ksample(ctx, model, pos, neg, latent)

    streamed_ctx = with_budget(ctx, streamed_manager, one_block_budget(model))
    streamed = ksample(streamed_ctx, model, pos, neg, latent)
    assert torch.equal(streamed, resident)

    with streamed_manager.use(model) as module:
        state = streamed_manager.streaming_of(model)
        assert state is not None
        blocks = model.stream_blocks(module)
        layers = [m for b in blocks for m in b.modules() if isinstance(m, QuantLayer)]
        assert layers and all(
            layer.qdata.dtype == torch.float8_e4m3fn for layer in layers
        )  # host copies, as stored
        assert all(layer.compute_dtype == torch.float32 for layer in layers)
        moved = sum(device_bytes(b, torch.float32) for b in blocks)  # fp8 weights at 1 byte, the rest fp32
        fp8 = sum(layer.qdata.numel() for layer in layers)
    record = streaming_record(streamed_manager, model)
    calls = record["fetches"] // record["blocks"]
    assert record["fetches"] == calls * record["blocks"] and calls >= 3
    assert record["bytes_streamed"] == calls * moved
    assert moved + 3 * fp8 > 3 * moved  # the same blocks in fp32 would move over 3x the bytes
