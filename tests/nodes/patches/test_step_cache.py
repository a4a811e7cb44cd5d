"""Step caches for transformers on the tiny Flux/Chroma demo models: ComfyUI's EasyCache and
LazyCache and Loom's FirstBlockCache. With threshold 0 each is bit-identical to sampling without
it; with a real threshold some transformer work is skipped — counted with forward hooks (the
transformer's calls, or the last block's attention for the first-block cache) — and the image
difference is printed. The benchmark at the end prints speed-up and difference, asserts no time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from nodes.bench.step_cache_runs import CACHES, STEPS, bench_lines, easy, first_block, sample
from nodes.demo.flux import DEMO_CHROMA, DEMO_CLIP_L, DEMO_FLUX_DEV, DEMO_T5XXL
from nodes.encode.conditioning import CLIPTextEncode
from nodes.load.handles import open_diffusion_model, open_text_encoders
from nodes.patches.easycache import EasyCache
from nodes.patches.first_block_cache import FirstBlockCacheError


@pytest.fixture
def flux(flux_demo: Path, make_ctx: Any) -> tuple[Any, Any, Any, Any]:
    torch.set_num_threads(1)
    ctx = make_ctx()
    clip = open_text_encoders(
        [flux_demo / "text_encoders" / DEMO_T5XXL, flux_demo / "text_encoders" / DEMO_CLIP_L], "flux"
    )
    pos = CLIPTextEncode().run(ctx, text="a cat on a roof", clip=clip)[0]
    neg = CLIPTextEncode().run(ctx, text="blurry", clip=clip)[0]
    return ctx, open_diffusion_model(flux_demo / "diffusion_models" / DEMO_FLUX_DEV), pos, neg


@pytest.mark.parametrize("name", list(CACHES))
def test_threshold_zero_is_bit_identical(name: str, flux: Any) -> None:
    ctx, model, pos, neg = flux
    plain, counted, _ = sample(ctx, model, pos, neg)
    cached, counted_cached, _ = sample(ctx, CACHES[name](ctx, model, 0.0), pos, neg)
    assert torch.equal(cached, plain)
    assert counted_cached.calls == counted.calls == STEPS  # cond and uncond in one batched call per step
    assert counted_cached.last_block == STEPS


@pytest.mark.parametrize(
    ("name", "threshold"), [("EasyCache", 0.2), ("LazyCache", 0.2), ("FirstBlockCache", 0.2)]
)
def test_real_threshold_skips_work(name: str, threshold: float, flux: Any) -> None:
    ctx, model, pos, neg = flux
    plain, _, _ = sample(ctx, model, pos, neg)
    cached, counted, _ = sample(ctx, CACHES[name](ctx, model, threshold), pos, neg)
    diff = (cached - plain).abs()
    print(
        f"\n{name} {threshold}: transformer calls {counted.calls}/{STEPS}, last-block runs {counted.last_block}/"
        f"{STEPS}; latent difference max {diff.max().item():.4f}, mean {diff.mean().item():.4f} "
        f"(latent std {plain.std().item():.3f})"
    )
    assert counted.last_block < STEPS
    if name == "FirstBlockCache":
        assert counted.calls == STEPS  # the first block always runs
    else:
        assert counted.calls == counted.last_block
    assert torch.isfinite(cached).all() and diff.max() > 0


def test_easycache_skips_every_call_of_a_step_together(flux: Any) -> None:
    """A positive with a reference latent cannot batch with its negative: two model calls per step.
    The first conditioning decides for the step; the other call follows with its own cached difference."""
    from nodes.encode.conditioning_edit import ReferenceLatent

    ctx, model, pos, neg = flux
    pos = ReferenceLatent().run(ctx, conditioning=pos, latent={"samples": torch.randn(1, 16, 8, 8)})[0]
    plain, counted_plain, _ = sample(ctx, model, pos, neg)
    cached, counted, _ = sample(ctx, easy(ctx, model, 0.3), pos, neg)
    print(
        f"\nEasyCache 0.3, unbatched branches: transformer calls {counted.calls}/{counted_plain.calls}, "
        f"latent difference max {(cached - plain).abs().max().item():.4f}"
    )
    assert counted_plain.calls == 2 * STEPS
    assert counted.calls < 2 * STEPS and counted.calls % 2 == 0


def test_outside_the_window_nothing_is_skipped(flux: Any) -> None:
    """start_percent 1.0 is sigma 0: no step is inside, whatever the threshold."""
    ctx, model, pos, neg = flux
    plain, _, _ = sample(ctx, model, pos, neg)
    late = EasyCache().run(
        ctx, model=model, reuse_threshold=3.0, start_percent=1.0, end_percent=1.0, verbose=False
    )[0]
    cached, counted, _ = sample(ctx, late, pos, neg)
    assert torch.equal(cached, plain) and counted.calls == STEPS


def test_first_block_cache_covers_chroma(flux_demo: Path, make_ctx: Any) -> None:
    """Chroma's single blocks carry text and image in one sequence: the cache replaces the image part."""
    ctx = make_ctx()
    clip = open_text_encoders([flux_demo / "text_encoders" / DEMO_T5XXL], "chroma")
    pos = CLIPTextEncode().run(ctx, text="a cat", clip=clip)[0]
    neg = CLIPTextEncode().run(ctx, text="", clip=clip)[0]
    model = open_diffusion_model(flux_demo / "diffusion_models" / DEMO_CHROMA)
    plain, _, _ = sample(ctx, model, pos, neg, size=64)
    same, _, _ = sample(ctx, first_block(ctx, model, 0.0), pos, neg, size=64)
    assert torch.equal(same, plain)
    cached, counted, _ = sample(ctx, first_block(ctx, model, 0.5), pos, neg, size=64)
    print(
        f"\nChroma FirstBlockCache 0.5: last-block runs {counted.last_block}/{STEPS}, latent difference max "
        f"{(cached - plain).abs().max().item():.4f}"
    )
    assert counted.last_block < STEPS and torch.isfinite(cached).all()


def test_first_block_cache_reuses_the_loaded_transformer(flux: Any) -> None:
    """The cache replaces forwards only during a call: the patched MODEL has the plain one's memory key,
    so the manager keeps one copy of the transformer (a full-size one does not load twice)."""
    ctx, model, _, _ = flux
    patched = first_block(ctx, model, 0.1)
    assert patched.key == model.key and patched.patches != model.patches


def test_first_block_cache_refuses_a_unet(tiny_sd15_ckpt: Path, make_ctx: Any) -> None:
    from nodes.load.handles import open_checkpoint

    unet = open_checkpoint(tiny_sd15_ckpt).unet
    with pytest.raises(FirstBlockCacheError, match="DeepCache"):
        first_block(make_ctx(), unet, 0.1)


# --- printed benchmark ---------------------------------------------------------------------------


def test_benchmark_prints_speedup_and_difference(flux: Any) -> None:
    """On the demo model (tiny: per-call overhead weighs more than in a real model; for a wider
    model run ``python main.py bench step_cache``). Printed, never asserted on time."""
    ctx, model, pos, neg = flux
    print()
    print(
        bench_lines(
            ctx, model, pos, neg, size=128, steps=STEPS, header="demo Flux dev (1+2 blocks, width 32)"
        )
    )


@pytest.mark.parametrize("node", ["EasyCache", "FirstBlockCache"])  # LazyCache has EasyCache's inputs
def test_cache_nodes_run_in_the_flux_dev_workflow(node: str, flux_demo: Path, tmp_path: Path) -> None:
    """The node between ModelSamplingFlux and the guider of the shipped Flux dev example."""
    import json

    from tests.nodes.test_generation_e2e import make_executor, run

    prompt = json.loads(
        (Path(__file__).resolve().parents[3] / "web" / "workflows" / "flux_dev.api.json").read_text()
    )
    inputs = {
        "EasyCache": {"reuse_threshold": 0.2, "start_percent": 0.15, "end_percent": 0.95, "verbose": False},
        "FirstBlockCache": {"residual_diff_threshold": 0.1, "start_percent": 0.0, "end_percent": 1.0},
    }
    prompt["50"] = {"class_type": node, "inputs": {"model": ["30", 0], **inputs[node]}}
    prompt["22"]["inputs"]["model"] = ["50", 0]
    result = run(make_executor(flux_demo, tmp_path), prompt)
    assert result.status == "success", (result.node_errors, result.error)
