"""KSampler / KSamplerAdvanced over the sigma-space core: ComfyUI's semantics on the tiny models."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from nodes.diffusion.names import SAMPLER_NAMES, SCHEDULER_NAMES
from nodes.encode.conditioning import CLIPTextEncode, ConditioningSetArea
from nodes.latent.vae import EmptyLatentImage, VAEDecode
from nodes.load.handles import open_checkpoint
from nodes.sample.ksampler import KSampler, KSamplerAdvanced, SamplingError

SIZE = 64


@pytest.fixture(scope="module")
def sd15(tiny_sd15_ckpt: Any) -> Any:
    return open_checkpoint(tiny_sd15_ckpt)


@pytest.fixture()
def ctx(make_ctx: Any) -> Any:
    torch.set_num_threads(1)
    return make_ctx()


def _encode(ctx: Any, clip: Any, text: str) -> list:
    return CLIPTextEncode().run(ctx, text=text, clip=clip)[0]


def _empty(ctx: Any, batch: int = 1, width: int = SIZE) -> dict:
    return EmptyLatentImage().run(ctx, width=width, height=SIZE, batch_size=batch)[0]


def _ksampler(ctx: Any, ck: Any, latent: dict, **kw: Any) -> dict:
    args: dict[str, Any] = dict(
        seed=42,
        steps=3,
        cfg=7.5,
        sampler_name="euler",
        scheduler="normal",
        denoise=1.0,
        positive=_encode(ctx, ck.clip, "a photo of a cat"),
        negative=_encode(ctx, ck.clip, "blurry"),
    )
    args.update(kw)
    return KSampler().run(ctx, model=ck.unet, latent_image=latent, **args)[0]


def _advanced(ctx: Any, ck: Any, latent: dict, **kw: Any) -> dict:
    args: dict[str, Any] = dict(
        add_noise="enable",
        noise_seed=42,
        steps=4,
        cfg=7.5,
        sampler_name="euler",
        scheduler="normal",
        positive=_encode(ctx, ck.clip, "a photo of a cat"),
        negative=_encode(ctx, ck.clip, "blurry"),
        start_at_step=0,
        end_at_step=10000,
        return_with_leftover_noise="disable",
    )
    args.update(kw)
    return KSamplerAdvanced().run(ctx, model=ck.unet, latent_image=latent, **args)[0]


def test_inputs_are_exactly_comfyuis() -> None:
    names = [i.name for i in KSampler.SCHEMA.inputs]
    assert names == [
        "model",
        "seed",
        "steps",
        "cfg",
        "sampler_name",
        "scheduler",
        "positive",
        "negative",
        "latent_image",
        "denoise",
    ]
    adv = [i.name for i in KSamplerAdvanced.SCHEMA.inputs]
    assert adv == [
        "model",
        "add_noise",
        "noise_seed",
        "steps",
        "cfg",
        "sampler_name",
        "scheduler",
        "positive",
        "negative",
        "latent_image",
        "start_at_step",
        "end_at_step",
        "return_with_leftover_noise",
    ]
    sampler = KSampler.SCHEMA.input("sampler_name")
    assert sampler is not None and len(sampler.options or ()) == 44


@pytest.fixture(scope="module")
def pair_run(sd15: Any, model_folders_module: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One context, one resident model and one pair of prompts for the whole sampler x scheduler grid."""
    from engine.context import Folders, NodeContext, RunSettings
    from engine.memory.manager import ModelManager

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("pairs")
    manager = ModelManager(ram_budget_bytes=2**30, prefetch=False)
    folders = Folders(root / "input", root / "output", root / "temp", model_files=model_folders_module)
    folders.ensure()
    ctx = NodeContext(node_id="1", prompt_id="pairs", folders=folders, models=manager, settings=RunSettings())
    conds = {
        "positive": _encode(ctx, sd15.clip, "a photo of a cat"),
        "negative": _encode(ctx, sd15.clip, "blurry"),
    }
    yield ctx, conds
    manager.close()


@pytest.fixture(scope="module")
def model_folders_module(models_dir: Any) -> Any:
    from engine.folders import ModelFolders

    return ModelFolders(models_dir)


@pytest.mark.parametrize("scheduler", SCHEDULER_NAMES)
@pytest.mark.parametrize("sampler", SAMPLER_NAMES)
def test_every_sampler_scheduler_pair_gives_an_image(
    sampler: str, scheduler: str, sd15: Any, pair_run: Any
) -> None:
    ctx, conds = pair_run
    out = _ksampler(ctx, sd15, _empty(ctx), sampler_name=sampler, scheduler=scheduler, steps=3, **conds)
    image = VAEDecode().run(ctx, samples=out, vae=sd15.vae)[0]
    assert out["samples"].shape == (1, 4, SIZE // 8, SIZE // 8)
    assert torch.isfinite(out["samples"]).all() and torch.isfinite(image).all()
    assert float(image.std()) > 1e-4, "the image is constant"


def test_same_seed_same_latent_and_seeds_differ(sd15: Any, ctx: Any) -> None:
    a = _ksampler(ctx, sd15, _empty(ctx), sampler_name="euler_ancestral")
    b = _ksampler(ctx, sd15, _empty(ctx), sampler_name="euler_ancestral")
    c = _ksampler(ctx, sd15, _empty(ctx), sampler_name="euler_ancestral", seed=43)
    assert torch.equal(a["samples"], b["samples"])
    assert not torch.allclose(a["samples"], c["samples"])


def test_batch_items_match_their_batch_index(sd15: Any, ctx: Any) -> None:
    """Item k of a batch equals the same latent sampled alone with batch_index [k] (ComfyUI's noise)."""
    full = _ksampler(ctx, sd15, _empty(ctx, batch=2))
    alone = _empty(ctx)
    alone["batch_index"] = [1]
    second = _ksampler(ctx, sd15, alone)
    torch.testing.assert_close(full["samples"][1:], second["samples"], atol=2e-3, rtol=1e-3)


def test_cfg_one_skips_the_negative(sd15: Any, ctx: Any) -> None:
    a = _ksampler(ctx, sd15, _empty(ctx), cfg=1.0)
    b = _ksampler(
        ctx, sd15, _empty(ctx), cfg=1.0, negative=_encode(ctx, sd15.clip, "something else entirely")
    )
    c = _ksampler(
        ctx, sd15, _empty(ctx), cfg=1.5, negative=_encode(ctx, sd15.clip, "something else entirely")
    )
    assert torch.equal(a["samples"], b["samples"])
    assert not torch.allclose(a["samples"], c["samples"])


def test_advanced_split_equals_one_run_for_euler(sd15: Any, ctx: Any) -> None:
    """Steps 0-2 with leftover noise, then 2-end without added noise, is the 4-step run."""
    whole = _advanced(ctx, sd15, _empty(ctx))
    first = _advanced(ctx, sd15, _empty(ctx), end_at_step=2, return_with_leftover_noise="enable")
    second = _advanced(ctx, sd15, first, start_at_step=2, add_noise="disable")
    torch.testing.assert_close(second["samples"], whole["samples"], atol=1e-4, rtol=1e-4)


def test_advanced_empty_window_returns_the_latent(sd15: Any, ctx: Any) -> None:
    latent = _empty(ctx)
    out = _advanced(ctx, sd15, latent, start_at_step=4)
    assert torch.equal(out["samples"], latent["samples"])


def test_denoise_zero_returns_the_latent_and_low_denoise_stays_close(sd15: Any, ctx: Any) -> None:
    start = _ksampler(ctx, sd15, _empty(ctx))
    same = _ksampler(ctx, sd15, start, denoise=0.0)
    assert torch.equal(same["samples"], start["samples"])
    light = _ksampler(ctx, sd15, start, denoise=0.2, seed=7)
    heavy = _ksampler(ctx, sd15, start, denoise=1.0, seed=7)
    assert (light["samples"] - start["samples"]).abs().mean() < (
        heavy["samples"] - start["samples"]
    ).abs().mean()


def test_noise_mask_keeps_the_latent_outside(sd15: Any, ctx: Any) -> None:
    start = _ksampler(ctx, sd15, _empty(ctx))
    mask = torch.zeros(1, SIZE, SIZE)
    mask[:, :, SIZE // 2 :] = 1.0
    out = _ksampler(ctx, sd15, {**start, "noise_mask": mask}, seed=9)
    left, right = slice(0, SIZE // 16), slice(SIZE // 16 + 1, SIZE // 8)
    torch.testing.assert_close(out["samples"][..., left], start["samples"][..., left], atol=1e-3, rtol=1e-4)
    assert not torch.allclose(out["samples"][..., right], start["samples"][..., right], atol=1e-2)


def test_area_conditioning_changes_only_near_its_area(sd15: Any, ctx: Any) -> None:
    base = _encode(ctx, sd15.clip, "a photo of a cat")
    area = ConditioningSetArea().run(
        ctx, conditioning=_encode(ctx, sd15.clip, "a red ball"), width=32, height=32, x=0, y=0, strength=1.0
    )[0]
    plain = _ksampler(ctx, sd15, _empty(ctx), positive=base)
    mixed = _ksampler(ctx, sd15, _empty(ctx), positive=base + area)
    assert not torch.allclose(plain["samples"], mixed["samples"])


def test_wrong_conditioning_width_is_a_teaching_error(sd15: Any, tiny_sdxl_ckpt: Any, ctx: Any) -> None:
    xl = open_checkpoint(tiny_sdxl_ckpt)
    with pytest.raises(SamplingError, match="CLIP output of the same checkpoint"):
        _ksampler(ctx, sd15, _empty(ctx), positive=_encode(ctx, xl.clip, "a cat"))
