"""Block streaming leaves room for the run's activations: the sampler announces the run (latent
shape, the CFG batch of cond and uncond, text tokens), the denoiser kind estimates its activation
bytes from its width and token count in the compute precision (``nodes/families/activation.py``),
and the split is chosen once per run from the budget less that estimate. A larger image under the
same budget keeps fewer blocks resident, and the images stay bit-identical to the resident run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.memory.device_budget import DeviceBudget, RunShape
from engine.memory.manager import ModelManager
from nodes.core.module_streaming import device_bytes
from nodes.demo.flux import DEMO_FLUX_DEV
from nodes.families.catalog import FAMILIES
from nodes.latent.vae import EmptyLatentImage
from nodes.load.handles import open_checkpoint, open_diffusion_model
from tests.nodes.core.test_streaming import announced, ksample, sd15_prompts, with_budget

LATENT_COPIES = 8  # float32 latents the sampler holds (nodes.families.activation.LATENT_COPIES)


@pytest.fixture()
def streamed_manager() -> Iterator[ModelManager]:
    mm = ModelManager(ram_budget_bytes=2**30, prefetch=False)
    yield mm
    mm.close()


def test_every_family_declares_an_estimate_for_its_denoiser() -> None:
    missing = [f.__name__ for f in FAMILIES if not callable(getattr(f.denoiser, "activation_bytes", None))]
    assert missing == []


def test_the_unet_estimate_grows_with_latent_area_and_batch_as_the_formula_says(tiny_sd15_ckpt: Path) -> None:
    unet = open_checkpoint(tiny_sd15_ckpt).unet
    module = unet.load()
    config = module.config
    assert tuple(config.block_out_channels) == (32, 64) and config.layers_per_block == 2
    assert [("CrossAttn" in kind) for kind in config.down_block_types] == [True, False]

    def estimate(run: RunShape, dtype: str = "float32") -> int:
        return unet.activation_bytes(module, run, dtype)

    def formula(rows: int, cells: int, element: int) -> int:
        # the full-resolution level with attention (14 widths of 32 channels) is the widest; the down
        # path keeps 3 outputs per level for the skip connections; the sampler's float32 latents
        per_row = cells * 32 * 14 + 3 * cells * 32 + 3 * (cells // 4) * 64
        return rows * per_row * element + LATENT_COPIES * rows * 4 * cells * 4

    cfg_pair = RunShape((1, 4, 8, 8), branches=2)  # cond and uncond in one call: 2 rows
    assert estimate(cfg_pair) == formula(2, 64, 4)
    assert estimate(RunShape((1, 4, 16, 16), branches=2)) == 4 * estimate(cfg_pair)  # 4x the area
    assert estimate(RunShape((3, 4, 8, 8), branches=2)) == 3 * estimate(cfg_pair)  # 3x the batch
    assert 2 * estimate(RunShape((1, 4, 8, 8), branches=1)) == estimate(cfg_pair)  # cfg 1: one branch
    assert estimate(cfg_pair, "float16") == formula(2, 64, 2)  # activations in the compute precision


def test_the_flux_estimate_counts_packed_image_tokens_beside_the_text_tokens(flux_demo: Path) -> None:
    model = open_diffusion_model(flux_demo / "diffusion_models" / DEMO_FLUX_DEV)
    module = model.load()
    width = module.config.num_attention_heads * module.config.attention_head_dim

    def estimate(height: int, width_cells: int, text: int, batch: int = 1) -> int:
        return model.activation_bytes(module, RunShape((batch, 16, height, width_cells), 1, text), "float32")

    def formula(tokens: int, cells: int, rows: int = 1) -> int:
        return rows * tokens * width * 19 * 4 + LATENT_COPIES * rows * 16 * cells * 4

    assert estimate(8, 8, 10) == formula(4 * 4 + 10, 64)  # 2x2 patches: 16 image tokens
    assert estimate(16, 16, 10) == formula(8 * 8 + 10, 256)
    assert estimate(16, 16, 10, batch=2) == formula(8 * 8 + 10, 256, rows=2)
    assert estimate(8, 8, 100) > estimate(8, 8, 10)  # joint attention: text tokens count too


def test_a_larger_image_under_the_same_budget_keeps_fewer_blocks_resident_and_stays_exact(
    tiny_sd15_ckpt: Path, make_ctx: Any, streamed_manager: ModelManager
) -> None:
    ckpt, ctx, pos, neg = sd15_prompts(tiny_sd15_ckpt, make_ctx)
    small = EmptyLatentImage().run(ctx, width=64, height=64, batch_size=1)[0]
    large = EmptyLatentImage().run(ctx, width=128, height=128, batch_size=1)[0]
    resident_small = ksample(ctx, ckpt.unet, pos, neg, small, steps=2)
    resident_large = ksample(ctx, ckpt.unet, pos, neg, large, steps=2)

    module = ckpt.unet.load()
    whole = device_bytes(module, torch.float32)
    small_run, large_run = announced(ckpt.unet, pos, neg, small), announced(ckpt.unet, pos, neg, large)
    assert small_run.batch == large_run.batch == 2  # cond and uncond batched together
    small_estimate = ckpt.unet.activation_bytes(module, small_run, "float32")
    large_estimate = ckpt.unet.activation_bytes(module, large_run, "float32")
    budget = DeviceBudget(total_bytes=whole + small_estimate, simulated=True)  # the small run fits whole
    streamed_ctx = with_budget(ctx, streamed_manager, budget)

    assert torch.equal(ksample(streamed_ctx, ckpt.unet, pos, neg, small, steps=2), resident_small)
    (placement,) = streamed_manager.stats()["placements"]
    assert placement["split"] is None and placement["activation_bytes"] == small_estimate
    assert placement["run"] == small_run.describe()

    assert torch.equal(ksample(streamed_ctx, ckpt.unet, pos, neg, large, steps=2), resident_large)
    (placement,) = streamed_manager.stats()["placements"]
    split = placement["split"]
    assert placement["activation_bytes"] == large_estimate == 4 * small_estimate  # 4x the latent area
    assert (
        0 < split["resident"] < split["blocks"] and not split["over_budget"]
    )  # a split, not everything streamed
    assert (
        split["budget_bytes"] == placement["weights_budget_bytes"] == whole + small_estimate - large_estimate
    )
    (record,) = streamed_manager.stats()["streaming"]
    assert record["peak_bytes"] <= split["budget_bytes"]
    events = [what for what, _, _ in streamed_manager.stats()["events"]]
    assert events.count("resplit") == 1  # chosen again once, for the larger run

    assert torch.equal(ksample(streamed_ctx, ckpt.unet, pos, neg, small, steps=2), resident_small)
    (placement,) = streamed_manager.stats()["placements"]
    assert placement["split"] is None  # the small run has the whole model resident again


@pytest.mark.parametrize(
    ("demo", "file", "channels"),
    [
        ("zimage_demo", "loom_demo_z_image_turbo.safetensors", 16),
        ("qwen_image_demo", "loom_demo_qwen_image.safetensors", 16),
        ("flux2_demo", "loom_demo_flux2_dev.safetensors", 128),
    ],
)
def test_the_other_transformers_estimate_from_their_own_width_and_tokens(
    demo: str, file: str, channels: int, request: pytest.FixtureRequest
) -> None:
    model = open_diffusion_model(request.getfixturevalue(demo) / "diffusion_models" / file)
    module = model.load()

    def estimate(cells: int, rows: int = 1, dtype: str = "float32") -> int:
        return model.activation_bytes(module, RunShape((rows, channels, cells, cells), 1, 20), dtype)

    latents = LATENT_COPIES * channels * 4
    growth = estimate(16) - estimate(8) - latents * (256 - 64)  # the transformer part only
    assert growth > 0 and estimate(16, rows=2) == 2 * estimate(16)
    assert estimate(32) - estimate(16) - latents * (1024 - 256) == 4 * growth  # linear in image tokens
    assert estimate(16, dtype="bfloat16") - latents * 256 == (estimate(16) - latents * 256) // 2
