"""Skip-layer guidance on Flux (ComfyUI's SkipLayerGuidanceDiT and SkipLayerGuidanceDiTSimple,
whose skipped double/single blocks hand back their inputs), checked on the tiny Flux dev
demo model against a direct computation: one euler step from sigma 1 lands on the guided
denoised estimate, which is rebuilt here from transformer calls with the chosen blocks taken out
of the module (``d = x − σ·v`` for flow models):

- SkipLayerGuidanceDiT: ``cfg_result + scale·(d_cond − d_cond,skipped)``; scale 0 is plain sampling.
- SkipLayerGuidanceDiTSimple: the negative branch is computed with the blocks skipped, then CFG.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch

from nodes.demo.flux import DEMO_CLIP_L, DEMO_FLUX_DEV, DEMO_T5XXL
from nodes.encode.conditioning import CLIPTextEncode
from nodes.family_nodes.sd3_nodes import SkipLayerGuidanceDiT, SkipLayerGuidanceDiTSimple
from nodes.load.handles import open_diffusion_model, open_text_encoders
from nodes.sample.ksampler import KSampler, initial_noise

SEED = 5


@pytest.fixture
def flux(flux_demo: Path, make_ctx: Any) -> tuple[Any, Any, Any, Any]:
    torch.set_num_threads(1)
    ctx = make_ctx()
    te = flux_demo / "text_encoders"
    clip = open_text_encoders([te / DEMO_T5XXL, te / DEMO_CLIP_L], "flux")
    pos = CLIPTextEncode().run(ctx, text="a cat on a roof", clip=clip)[0]
    neg = CLIPTextEncode().run(ctx, text="blurry", clip=clip)[0]
    return ctx, open_diffusion_model(flux_demo / "diffusion_models" / DEMO_FLUX_DEV), pos, neg


def one_step(ctx: Any, model: Any, pos: Any, neg: Any, cfg: float) -> torch.Tensor:
    latent = {"samples": torch.zeros(1, 16, 8, 8)}
    return KSampler().run(
        ctx,
        model=model,
        seed=SEED,
        steps=1,
        cfg=cfg,
        sampler_name="euler",
        scheduler="simple",
        positive=pos,
        negative=neg,
        latent_image=latent,
        denoise=1.0,
    )[0]["samples"]


@contextmanager
def without_blocks(module: Any, double: tuple[int, ...], single: tuple[int, ...]) -> Iterator[None]:
    """The transformer with the chosen blocks removed from its block lists (an independent way
    to skip them)."""
    doubles, singles = module.transformer_blocks, module.single_transformer_blocks
    module.transformer_blocks = torch.nn.ModuleList(b for i, b in enumerate(doubles) if i not in double)
    module.single_transformer_blocks = torch.nn.ModuleList(
        b for i, b in enumerate(singles) if i not in single
    )
    try:
        yield
    finally:
        module.transformer_blocks, module.single_transformer_blocks = doubles, singles


def denoised(
    ctx: Any, model: Any, cond: Any, skipped: tuple[tuple[int, ...], tuple[int, ...]] | None = None
) -> torch.Tensor:
    """The denoised estimate at the first step (sigma 1) for one conditioning, by a direct call."""
    sigma = torch.tensor([1.0])
    x = initial_noise({"samples": torch.zeros(1, 16, 8, 8)}, SEED)  # noise at sigma 1 is the model input
    with ctx.models.use(model) as module, torch.no_grad():
        kwargs = model.denoiser.conditioning(list(cond), 1, (64, 64), like=x)
        timestep = model.model_sampling.timestep(sigma)
        if skipped is None:
            v = model.denoiser.forward(module, x, timestep, kwargs)
        else:
            with without_blocks(module, *skipped):
                v = model.denoiser.forward(module, x, timestep, kwargs)
    return x - 1.0 * v


def latent_of(model: Any, d: torch.Tensor) -> torch.Tensor:
    return model.latent_format.process_out(d)


def test_plain_one_step_equals_the_direct_computation(flux: Any) -> None:
    ctx, model, pos, neg = flux
    d_cond = denoised(ctx, model, pos)
    assert torch.allclose(one_step(ctx, model, pos, neg, 1.0), latent_of(model, d_cond), atol=1e-5)


def test_slg_scale_zero_is_plain_sampling(flux: Any) -> None:
    ctx, model, pos, neg = flux
    slg = SkipLayerGuidanceDiT().run(
        ctx,
        model=model,
        double_layers="0",
        single_layers="0",
        scale=0.0,
        start_percent=0.0,
        end_percent=1.0,
        rescaling_scale=0.0,
    )[0]
    assert torch.equal(one_step(ctx, slg, pos, neg, 1.0), one_step(ctx, model, pos, neg, 1.0))


@pytest.mark.parametrize(("double", "single"), [("0", ""), ("", "0"), ("0", "1")])
def test_slg_adds_scale_times_the_skipped_difference(double: str, single: str, flux: Any) -> None:
    ctx, model, pos, neg = flux
    scale = 2.0
    slg = SkipLayerGuidanceDiT().run(
        ctx,
        model=model,
        double_layers=double,
        single_layers=single,
        scale=scale,
        start_percent=0.0,
        end_percent=1.0,
        rescaling_scale=0.0,
    )[0]
    skipped = (tuple(int(i) for i in double.split(",") if i), tuple(int(i) for i in single.split(",") if i))
    d_cond = denoised(ctx, model, pos)
    d_skip = denoised(ctx, model, pos, skipped)
    assert (d_skip - d_cond).abs().max() > 1e-4  # skipping changes the prediction
    expected = latent_of(model, d_cond + scale * (d_cond - d_skip))
    out = one_step(ctx, slg, pos, neg, 1.0)
    assert torch.allclose(out, expected, atol=1e-5), (out - expected).abs().max()


def test_slg_simple_skips_blocks_in_the_negative_branch_only(flux: Any) -> None:
    ctx, model, pos, neg = flux
    cfg = 3.0
    simple = SkipLayerGuidanceDiTSimple().run(
        ctx, model=model, double_layers="0", single_layers="1", start_percent=0.0, end_percent=1.0
    )[0]
    d_cond = denoised(ctx, model, pos)
    d_uncond_skip = denoised(ctx, model, neg, ((0,), (1,)))
    expected = latent_of(model, d_uncond_skip + cfg * (d_cond - d_uncond_skip))
    out = one_step(ctx, simple, pos, neg, cfg)
    assert torch.allclose(out, expected, atol=1e-5), (out - expected).abs().max()
    assert not torch.allclose(out, one_step(ctx, model, pos, neg, cfg), atol=1e-5)
