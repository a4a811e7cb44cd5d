"""Block streaming under a simulated device budget (the CPU as a "device" whose weight memory is
accounted against a hard limit): with room for the non-block part and ONE block, every block
streams in and out each call, and the images and text embeddings are bit-identical to the fully
resident run. Covers an SD1.5 UNet (the generic block list), the Flux transformer (its declared
block stack) and the Flux text encoders (T5 and CLIP-L)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.memory.device_budget import DeviceBudget, RunShape
from engine.memory.manager import ModelManager
from nodes.core.module_streaming import device_bytes, run_shape
from nodes.demo.flux import DEMO_CLIP_L, DEMO_FLUX_DEV, DEMO_T5XXL
from nodes.encode.conditioning import CLIPTextEncode
from nodes.family_nodes.flux_nodes import EmptySD3LatentImage
from nodes.latent.vae import EmptyLatentImage
from nodes.load.handles import open_checkpoint, open_diffusion_model, open_text_encoders
from nodes.sample.ksampler import KSampler, cfg_guider


def one_block_budget(handle: Any, run: RunShape | None = None) -> DeviceBudget:
    """A budget with room for the module's non-block part and its largest block beside the
    activation estimate of ``run`` (None: no run announced), nothing more."""
    module = handle.to_device(handle.load(), "cpu", "float32")
    sizes = [device_bytes(b, torch.float32) for b in handle.stream_blocks(module)]
    fixed = device_bytes(module, torch.float32) - sum(sizes)
    activation = 0 if run is None else handle.activation_bytes(module, run, "float32")
    return DeviceBudget(total_bytes=fixed + max(sizes) + activation, simulated=True)


def announced(model: Any, pos: Any, neg: Any, latent: dict, cfg: float = 3.0) -> RunShape:
    """The run KSampler announces to the manager for these inputs."""
    return run_shape([cfg_guider(model, pos, neg, cfg)], tuple(latent["samples"].shape))


@pytest.fixture()
def streamed_manager() -> Iterator[ModelManager]:
    mm = ModelManager(ram_budget_bytes=2**30, prefetch=False)
    yield mm
    mm.close()


def with_budget(ctx: Any, manager: ModelManager, budget: DeviceBudget) -> Any:
    manager.device_budget = budget
    return dataclasses.replace(ctx, models=manager)


def ksample(ctx: Any, model: Any, pos: Any, neg: Any, latent: Any, steps: int = 3) -> torch.Tensor:
    return KSampler().run(
        ctx,
        model=model,
        seed=5,
        steps=steps,
        cfg=3.0,
        sampler_name="euler",
        scheduler="normal",
        positive=pos,
        negative=neg,
        latent_image=latent,
        denoise=1.0,
    )[0]["samples"]


def sd15_prompts(path: Path, make_ctx: Any) -> tuple[Any, Any, Any, Any]:
    """The tiny SD1.5 checkpoint, a node context and its positive and negative prompts."""
    torch.set_num_threads(1)
    ckpt = open_checkpoint(path)
    ctx = make_ctx()
    pos = CLIPTextEncode().run(ctx, text="a red house", clip=ckpt.clip)[0]
    neg = CLIPTextEncode().run(ctx, text="blurry", clip=ckpt.clip)[0]
    return ckpt, ctx, pos, neg


def streaming_record(manager: ModelManager, handle: Any) -> dict[str, Any]:
    (record,) = [s for s in manager.stats()["streaming"] if s["key"] == handle.key]
    return record


def test_sd15_unet_streamed_one_block_at_a_time_is_bit_identical(
    tiny_sd15_ckpt: Path, make_ctx: Any, streamed_manager: ModelManager
) -> None:
    ckpt, ctx, pos, neg = sd15_prompts(tiny_sd15_ckpt, make_ctx)
    latent = EmptyLatentImage().run(ctx, width=64, height=64, batch_size=2)[0]
    resident = ksample(ctx, ckpt.unet, pos, neg, latent)

    budget = one_block_budget(ckpt.unet, announced(ckpt.unet, pos, neg, latent))
    streamed = ksample(with_budget(ctx, streamed_manager, budget), ckpt.unet, pos, neg, latent)

    assert torch.equal(streamed, resident)
    record = streaming_record(streamed_manager, ckpt.unet)
    assert record["resident"] == 0 and record["streamed"] == record["blocks"] > 1
    assert not record["prefetch"]  # one slot: no room to fetch the next block early
    assert not record["over_budget"] and record["activation_bytes"] > 0  # room left for the run
    assert record["peak_bytes"] <= record["budget_bytes"] == budget.total_bytes - record["activation_bytes"]
    calls = 3  # cond and uncond batched in one call per step
    assert record["fetches"] == calls * record["blocks"]


def test_flux_transformer_streams_its_declared_block_stack_bit_identically(
    flux_demo: Path, make_ctx: Any, streamed_manager: ModelManager
) -> None:
    torch.set_num_threads(1)
    ctx = make_ctx()
    clip = open_text_encoders(
        [flux_demo / "text_encoders" / DEMO_T5XXL, flux_demo / "text_encoders" / DEMO_CLIP_L], "flux"
    )
    pos = CLIPTextEncode().run(ctx, text="a cat on a roof", clip=clip)[0]
    neg = CLIPTextEncode().run(ctx, text="blurry", clip=clip)[0]
    model = open_diffusion_model(flux_demo / "diffusion_models" / DEMO_FLUX_DEV)
    latent = EmptySD3LatentImage().run(ctx, width=64, height=64, batch_size=1)[0]
    resident = ksample(ctx, model, pos, neg, latent)

    with ctx.models.use(model) as module:
        declared = len(module.transformer_blocks) + len(module.single_transformer_blocks)
    budget = one_block_budget(model, announced(model, pos, neg, latent))
    streamed = ksample(with_budget(ctx, streamed_manager, budget), model, pos, neg, latent)

    assert torch.equal(streamed, resident)
    record = streaming_record(streamed_manager, model)
    assert record["blocks"] == declared and record["resident"] == 0 and not record["over_budget"]


def test_flux_text_encoders_streamed_give_identical_embeddings(
    flux_demo: Path, make_ctx: Any, streamed_manager: ModelManager
) -> None:
    torch.set_num_threads(1)
    ctx = make_ctx()
    clip = open_text_encoders(
        [flux_demo / "text_encoders" / DEMO_T5XXL, flux_demo / "text_encoders" / DEMO_CLIP_L], "flux"
    )
    resident = CLIPTextEncode().run(ctx, text="a lighthouse at dusk", clip=clip)[0]
    streamed = CLIPTextEncode().run(
        with_budget(ctx, streamed_manager, one_block_budget(clip)), text="a lighthouse at dusk", clip=clip
    )[0]

    for r, s in zip(resident, streamed, strict=True):
        assert torch.equal(s.embeds, r.embeds)
        assert r.pooled is not None and s.pooled is not None and torch.equal(s.pooled, r.pooled)
    record = streaming_record(streamed_manager, clip)
    assert record["resident"] == 0 and record["fetches"] >= record["blocks"]  # T5's and CLIP-L's layers


def test_a_model_that_fits_is_not_split(tiny_sd15_ckpt: Path, streamed_manager: ModelManager) -> None:
    unet = open_checkpoint(tiny_sd15_ckpt).unet
    streamed_manager.device_budget = DeviceBudget(total_bytes=2**30, simulated=True)
    with streamed_manager.use(unet):
        assert streamed_manager.streaming_of(unet) is None
    assert streamed_manager.stats()["streaming"] == []


def test_dropping_a_streamed_model_stops_its_streaming(
    tiny_sd15_ckpt: Path, streamed_manager: ModelManager
) -> None:
    ckpt = open_checkpoint(tiny_sd15_ckpt)
    streamed_manager.device_budget = one_block_budget(ckpt.unet)
    with streamed_manager.use(ckpt.unet) as module:
        assert streamed_manager.streaming_of(ckpt.unet) is not None
        blocks = ckpt.unet.stream_blocks(module)
        assert any(b._forward_pre_hooks for b in blocks)
    streamed_manager.free()
    assert streamed_manager.streaming_of(ckpt.unet) is None
    assert all(not b._forward_pre_hooks and not b._forward_hooks for b in blocks)


def test_a_run_interrupted_inside_a_streamed_block_leaves_the_next_run_exact(
    tiny_sd15_ckpt: Path, make_ctx: Any, streamed_manager: ModelManager
) -> None:
    ckpt, ctx, pos, neg = sd15_prompts(tiny_sd15_ckpt, make_ctx)
    latent = EmptyLatentImage().run(ctx, width=64, height=64, batch_size=1)[0]
    resident = ksample(ctx, ckpt.unet, pos, neg, latent, steps=2)
    streamed_ctx = with_budget(ctx, streamed_manager, one_block_budget(ckpt.unet))

    def interrupt(*_: Any) -> None:
        raise KeyboardInterrupt("stopped inside a block")

    with streamed_manager.use(ckpt.unet) as module:
        hook = ckpt.unet.stream_blocks(module)[1].resnets[0].register_forward_hook(interrupt)
    with pytest.raises(KeyboardInterrupt):
        ksample(streamed_ctx, ckpt.unet, pos, neg, latent, steps=2)
    hook.remove()

    assert torch.equal(ksample(streamed_ctx, ckpt.unet, pos, neg, latent, steps=2), resident)
    state = streamed_manager.streaming_of(ckpt.unet)
    limit = one_block_budget(ckpt.unet).weights_bytes
    assert state is not None and limit is not None and state.account.peak <= limit


def test_a_cpu_copy_keeps_the_weights_offset_from_a_64_byte_boundary() -> None:
    from nodes.core.module_streaming import same_alignment_copy

    backing = torch.randn(1000)
    for start in (0, 1, 10, 33):  # weights mmapped from a file sit at any 4-byte offset
        host = backing[start : start + 64 * 9].view(64, 9)
        copy = same_alignment_copy(host)
        assert copy.data_ptr() % 64 == host.data_ptr() % 64 and copy.data_ptr() != host.data_ptr()
        assert torch.equal(copy, host) and copy.stride() == host.stride()
    conv = torch.randn(8, 4, 3, 3).contiguous(memory_format=torch.channels_last)
    assert same_alignment_copy(conv).stride() == conv.stride()
