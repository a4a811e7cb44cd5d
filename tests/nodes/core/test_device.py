"""``--compile`` and ``--tf32`` (issue 9): the compiled UNet is built once per loaded model and kept
with it; images equal the eager run's; TF32 on the CPU changes nothing."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import nodes.core.device as device
from engine.context import RunSettings
from nodes.encode.conditioning import CLIPTextEncode
from nodes.latent.vae import EmptyLatentImage
from nodes.load.handles import open_checkpoint
from nodes.sample.ksampler import KSampler


class CountingCompile:
    """Stands in for torch.compile (a real compile takes about a minute on this CPU)."""

    def __init__(self) -> None:
        self.calls: list[Any] = []

    def __call__(self, module: Any, **kw: Any) -> Any:
        self.calls.append(module)

        def compiled(*args: Any, **kwargs: Any) -> Any:
            return module(*args, **kwargs)

        return compiled


def _sample(ctx: Any, ck: Any, seed: int = 7) -> torch.Tensor:
    pos = CLIPTextEncode().run(ctx, text="a cat", clip=ck.clip)[0]
    neg = CLIPTextEncode().run(ctx, text="blurry", clip=ck.clip)[0]
    latent = EmptyLatentImage().run(ctx, width=64, height=64, batch_size=1)[0]
    out = KSampler().run(
        ctx,
        model=ck.unet,
        seed=seed,
        steps=2,
        cfg=7.0,
        sampler_name="euler",
        scheduler="normal",
        positive=pos,
        negative=neg,
        latent_image=latent,
        denoise=1.0,
    )[0]
    return out["samples"]


def test_compile_once_across_runs_same_images(
    tiny_sd15_ckpt: Any, make_ctx: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    counter = CountingCompile()
    monkeypatch.setattr(device.torch, "compile", counter)
    ck = open_checkpoint(tiny_sd15_ckpt)
    eager = _sample(make_ctx(), ck)
    assert counter.calls == []  # opt-in only

    first = _sample(make_ctx(compile=True), ck)
    second = _sample(make_ctx(compile=True), ck, seed=8)
    assert len(counter.calls) == 1  # cached on the resident module, not rebuilt per run
    unet = counter.calls[0].__self__  # nn.Module.compile compiles the module's own call
    assert device.is_compiled(unet)
    assert torch.equal(first, eager)
    assert not torch.equal(second, first)


def test_tf32_is_harmless_on_cpu(tiny_sd15_ckpt: Any, make_ctx: Any) -> None:
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    ck = open_checkpoint(tiny_sd15_ckpt)
    plain = _sample(make_ctx(), ck)
    with_tf32 = _sample(make_ctx(tf32=True), ck)
    assert torch.equal(plain, with_tf32)
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == before


def test_tf32_scope_sets_and_restores_on_cuda_devices() -> None:
    """The flags are process-wide torch state; the scope turns them on only around sampling."""
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    with device.tf32_scope(RunSettings(tf32=True), torch.device("cuda")):  # setting flags needs no GPU
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == before
    with device.tf32_scope(RunSettings(tf32=False), torch.device("cuda")):
        assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == before


def test_coalesced_sampler_uses_the_compiled_unet_too(
    tiny_sd15_ckpt: Any, make_ctx: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nodes.sample.batched import KSamplerBatched

    counter = CountingCompile()
    monkeypatch.setattr(device.torch, "compile", counter)
    ck = open_checkpoint(tiny_sd15_ckpt)
    ctx = make_ctx(compile=True)
    pos = CLIPTextEncode().run(ctx, text="a cat", clip=ck.clip)[0]
    neg = CLIPTextEncode().run(ctx, text="blurry", clip=ck.clip)[0]
    latent = EmptyLatentImage().run(ctx, width=64, height=64, batch_size=1)[0]
    stacked = KSamplerBatched().run(
        ctx,
        model=[ck.unet],
        seed=[7, 8],
        steps=[2],
        cfg=[7.0],
        sampler_name=["euler"],
        scheduler=["normal"],
        positive=[pos],
        negative=[neg],
        latent_image=[latent],
        denoise=[1.0],
    )[0]
    assert len(counter.calls) == 1
    alone = _sample(make_ctx(), ck, seed=7)  # batched convolutions differ from batch 1 by float noise only
    assert torch.allclose(stacked[0]["samples"], alone, rtol=1e-4, atol=1e-3)
