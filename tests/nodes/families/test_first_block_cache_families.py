"""FirstBlockCache on every DiT family that declares its block stack (Z-Image, SD3.5, Qwen-Image,
Flux.2 Klein; Flux and Chroma are in test_step_cache.py), on the tiny demo models: threshold 0 is
bit-identical to sampling without the cache; a real threshold skips the later blocks on some steps
(counted with a forward hook on the attention of the declared stack's last block) and stays finite. The
thresholds are high because the first block of a random tiny model changes a lot from step to step."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from nodes.demo.flux2 import DEMO_KLEIN, DEMO_KLEIN_QWEN3, make_flux2_demo
from nodes.demo.qwen_image import DEMO_QWEN25, DEMO_QWEN_IMAGE, make_qwen_image_demo
from nodes.demo.sd3 import DEMO_SD3_CLIP_G, DEMO_SD3_CLIP_L, DEMO_SD3_MMDIT, DEMO_SD3_T5XXL, make_sd3_demo
from nodes.demo.zimage import DEMO_QWEN3, DEMO_ZIMAGE, make_zimage_demo
from nodes.encode.conditioning import CLIPTextEncode
from nodes.load.handles import open_diffusion_model, open_text_encoders
from nodes.patches.first_block_cache import FirstBlockCache
from nodes.sample.ksampler import KSampler

STEPS = 10


@dataclass(frozen=True)
class Family:
    make: Callable[[Path], Any]
    transformer: str
    encoders: tuple[str, ...]
    clip_type: str
    cfg: float
    threshold: float


FAMILIES = {
    "zimage": Family(make_zimage_demo, DEMO_ZIMAGE, (DEMO_QWEN3,), "lumina2", 1.0, 0.8),
    "sd3": Family(
        make_sd3_demo, DEMO_SD3_MMDIT, (DEMO_SD3_CLIP_L, DEMO_SD3_CLIP_G, DEMO_SD3_T5XXL), "sd3", 3.0, 0.5
    ),
    "qwen_image": Family(make_qwen_image_demo, DEMO_QWEN_IMAGE, (DEMO_QWEN25,), "qwen_image", 2.5, 0.5),
    "flux2_klein": Family(make_flux2_demo, DEMO_KLEIN, (DEMO_KLEIN_QWEN3,), "flux2", 1.0, 0.8),
}


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Family, Path]:
    torch.set_num_threads(1)
    spec = FAMILIES[request.param]
    root = tmp_path_factory.mktemp(request.param)
    spec.make(root)
    return spec, root


def sample(ctx: Any, model: Any, pos: Any, neg: Any, cfg: float) -> tuple[torch.Tensor, int]:
    """KSampler (euler, simple) from an empty 8×8 latent; the output and how often the last block's
    attention ran."""
    runs = 0

    def count(*_: Any) -> None:
        nonlocal runs
        runs += 1

    with ctx.models.use(model) as module:
        last = model.denoiser.block_stack(module).blocks[-1][0]
        attention = (
            last.attn if hasattr(last, "attn") else last.attention
        )  # not run when the block is skipped
        handle = attention.register_forward_hook(count)
    latent = {"samples": torch.zeros(1, model.latent_format.channels, 8, 8)}
    try:
        out = KSampler().run(
            ctx,
            model=model,
            seed=3,
            steps=STEPS,
            cfg=cfg,
            sampler_name="euler",
            scheduler="simple",
            positive=pos,
            negative=neg,
            latent_image=latent,
            denoise=1.0,
        )[0]
    finally:
        handle.remove()
    return out["samples"], runs


def cached(ctx: Any, model: Any, threshold: float) -> Any:
    return FirstBlockCache().run(
        ctx, model=model, residual_diff_threshold=threshold, start_percent=0.0, end_percent=1.0
    )[0]


def test_first_block_cache_on_the_family(family: tuple[Family, Path], make_ctx: Any) -> None:
    spec, root = family
    ctx = make_ctx()
    clip = open_text_encoders([root / "text_encoders" / name for name in spec.encoders], spec.clip_type)
    pos = CLIPTextEncode().run(ctx, text="a cat on a roof", clip=clip)[0]
    neg = CLIPTextEncode().run(ctx, text="blurry", clip=clip)[0]
    model = open_diffusion_model(root / "diffusion_models" / spec.transformer)
    with ctx.models.use(model) as module:
        assert len(model.denoiser.block_stack(module).blocks) >= 2

    plain, plain_runs = sample(ctx, model, pos, neg, spec.cfg)
    same, same_runs = sample(ctx, cached(ctx, model, 0.0), pos, neg, spec.cfg)
    assert torch.equal(same, plain) and same_runs == plain_runs
    assert plain_runs in (STEPS, 2 * STEPS)  # cond and uncond in one call per step, or one call each

    fast, fast_runs = sample(ctx, cached(ctx, model, spec.threshold), pos, neg, spec.cfg)
    diff = (fast - plain).abs()
    print(
        f"\n{model.family.title} FirstBlockCache {spec.threshold}: last-block runs {fast_runs}/{plain_runs}, latent "
        f"difference max {diff.max().item():.4f} (latent std {plain.std().item():.3f})"
    )
    assert fast_runs < plain_runs and torch.isfinite(fast).all() and diff.max() > 0
