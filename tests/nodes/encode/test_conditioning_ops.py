"""ComfyUI's conditioning editors: their effect on the CondEntry, and through a tiny SD1.5/SDXL
sampling run that masks, areas, strengths and timestep ranges change the result where (and only
where) they should."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from nodes.core.cond import CondEntry
from nodes.encode.conditioning import CLIPTextEncode, ConditioningSetArea
from nodes.encode.conditioning_edit import (
    ConditioningAverage,
    ConditioningConcat,
    ConditioningSetAreaPercentage,
    ConditioningSetAreaStrength,
    ConditioningSetMask,
    ConditioningSetTimestepRange,
)
from nodes.families.components.unet import size_ids
from nodes.family_nodes.sd_nodes import CLIPTextEncodeSDXL, CLIPTextEncodeSDXLRefiner
from nodes.latent.vae import EmptyLatentImage
from nodes.load.handles import open_checkpoint
from nodes.sample.ksampler import KSampler

SIZE = 64


def _entry(tokens: int, value: float, pooled: float | None = None, width: int = 4) -> CondEntry:
    return CondEntry(
        torch.full((1, tokens, width), value),
        None if pooled is None else torch.full((1, 3), pooled),
        extras={"keep": 1},
    )


def _names(node: Any) -> list[str]:
    return [i.name for i in node.SCHEMA.inputs]


def test_inputs_are_comfyuis() -> None:
    assert _names(ConditioningAverage) == ["conditioning_to", "conditioning_from", "conditioning_to_strength"]
    assert _names(ConditioningConcat) == ["conditioning_to", "conditioning_from"]
    assert _names(ConditioningSetMask) == ["conditioning", "mask", "strength", "set_cond_area"]
    assert _names(ConditioningSetAreaPercentage) == ["conditioning", "width", "height", "x", "y", "strength"]
    assert _names(ConditioningSetAreaStrength) == ["conditioning", "strength"]
    assert _names(ConditioningSetTimestepRange) == ["conditioning", "start", "end"]
    assert _names(CLIPTextEncodeSDXL) == [
        "clip",
        "width",
        "height",
        "crop_w",
        "crop_h",
        "target_width",
        "target_height",
        "text_g",
        "text_l",
    ]
    assert _names(CLIPTextEncodeSDXLRefiner) == ["ascore", "width", "height", "text", "clip"]
    area = ConditioningSetMask.SCHEMA.input("set_cond_area")
    assert area is not None and tuple(area.options or ()) == ("default", "mask bounds")


def test_average_blends_tokens_and_pooled_and_pads_the_shorter_prompt_with_zeros(make_ctx: Any) -> None:
    to, src = _entry(4, 1.0, pooled=1.0), _entry(2, 3.0, pooled=5.0)
    (out,) = ConditioningAverage().run(
        make_ctx(), conditioning_to=[to], conditioning_from=[src], conditioning_to_strength=0.25
    )
    assert out[0].embeds[0, :2, 0].tolist() == [2.5, 2.5]  # 0.25 * 1 + 0.75 * 3
    assert out[0].embeds[0, 2:, 0].tolist() == [0.25, 0.25]  # 0.25 * 1 + 0.75 * 0
    assert out[0].pooled is not None and float(out[0].pooled[0, 0]) == 4.0
    assert out[0].extras == {"keep": 1}
    (only_from,) = ConditioningAverage().run(
        make_ctx(), conditioning_to=[_entry(4, 1.0)], conditioning_from=[src], conditioning_to_strength=0.5
    )
    assert only_from[0].pooled is src.pooled  # conditioning_to has none: from's is taken as is


def test_concat_appends_the_first_from_entry_and_rejects_other_widths(make_ctx: Any) -> None:
    (out,) = ConditioningConcat().run(
        make_ctx(),
        conditioning_to=[_entry(3, 1.0), _entry(2, 2.0)],
        conditioning_from=[_entry(2, 7.0), _entry(5, 9.0)],
    )
    assert [e.embeds.shape[1] for e in out] == [5, 4]
    assert out[0].embeds[0, 3:, 0].tolist() == [7.0, 7.0] and out[0].extras == {"keep": 1}
    with pytest.raises(ValueError, match="same CLIP"):
        ConditioningConcat().run(
            make_ctx(), conditioning_to=[_entry(3, 1.0)], conditioning_from=[_entry(3, 1.0, width=8)]
        )
    with pytest.raises(ValueError, match="empty"):
        ConditioningConcat().run(make_ctx(), conditioning_to=[_entry(3, 1.0)], conditioning_from=[])


def test_placement_nodes_set_comfyuis_keys(make_ctx: Any) -> None:
    ctx, cond = make_ctx(), [_entry(1, 1.0)]
    (masked,) = ConditioningSetMask().run(
        ctx, conditioning=cond, mask=torch.ones(8, 8), strength=0.5, set_cond_area="mask bounds"
    )
    assert masked[0].extras["mask"].shape == (1, 8, 8)
    assert masked[0].extras["mask_strength"] == 0.5 and masked[0].extras["set_area_to_bounds"] is True
    (pct,) = ConditioningSetAreaPercentage().run(
        ctx, conditioning=cond, width=0.5, height=0.25, x=0.5, y=0.0, strength=2.0
    )
    assert pct[0].extras["area_percentage"] == (0.25, 0.5, 0.0, 0.5) and pct[0].strength == 2.0
    (strong,) = ConditioningSetAreaStrength().run(ctx, conditioning=cond, strength=3.0)
    assert strong[0].strength == 3.0
    (ranged,) = ConditioningSetTimestepRange().run(ctx, conditioning=cond, start=0.2, end=0.6)
    assert (ranged[0].extras["start_percent"], ranged[0].extras["end_percent"]) == (0.2, 0.6)
    assert cond[0].extras == {"keep": 1}  # inputs are never edited


def test_percentage_area_resolves_to_latent_cells_and_set_area_overrides_it(make_ctx: Any) -> None:
    from nodes.sample import cond_batch as cb

    ctx = make_ctx()
    (pct,) = ConditioningSetAreaPercentage().run(
        ctx, conditioning=[_entry(1, 1.0)], width=0.5, height=0.25, x=0.5, y=0.1, strength=1.0
    )
    (prepared,) = cb.prepare(pct, (16, 8), lambda p: 1.0)
    assert prepared.area == (
        4,
        4,
        2,
        4,
    )  # (h, w, y, x): round(0.25*16), round(0.5*8), round(0.1*16), round(0.5*8)
    (fixed,) = ConditioningSetArea().run(ctx, conditioning=pct, width=64, height=64, x=0, y=0, strength=1.0)
    assert cb.prepare(fixed, (16, 8), lambda p: 1.0)[0].area == (8, 8, 0, 0)


def test_sdxl_size_ids_come_from_the_entry_or_the_image() -> None:
    assert size_ids({}, (512, 768)) == [512, 768, 0, 0, 512, 768]
    assert size_ids(
        {"width": 1024, "height": 900, "crop_w": 8, "crop_h": 16, "target_width": 640, "target_height": 480},
        (64, 64),
    ) == [900, 1024, 16, 8, 480, 640]
    assert size_ids({"aesthetic_score": 6.0, "width": 100, "height": 50}, (64, 64)) == [50, 100, 0, 0, 6.0]


# --- through sampling ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sd15(tiny_sd15_ckpt: Any) -> Any:
    return open_checkpoint(tiny_sd15_ckpt)


@pytest.fixture()
def ctx(make_ctx: Any) -> Any:
    torch.set_num_threads(1)
    return make_ctx()


def _encode(ctx: Any, clip: Any, text: str) -> list:
    return CLIPTextEncode().run(ctx, text=text, clip=clip)[0]


def _sample(ctx: Any, model: Any, positive: list, negative: list, steps: int = 1) -> torch.Tensor:
    latent = EmptyLatentImage().run(ctx, width=SIZE, height=SIZE, batch_size=1)[0]
    out = KSampler().run(
        ctx,
        model=model,
        seed=3,
        steps=steps,
        cfg=4.0,
        sampler_name="euler",
        scheduler="normal",
        positive=positive,
        negative=negative,
        latent_image=latent,
        denoise=1.0,
    )[0]
    return out["samples"]


@pytest.fixture()
def prompts(ctx: Any, sd15: Any) -> dict[str, list]:
    return {
        name: _encode(ctx, sd15.clip, text)
        for name, text in (("a", "a photo of a cat"), ("b", "a red house at night"), ("neg", "blurry"))
    }


def test_a_timestep_range_outside_every_step_is_the_same_as_no_entry(
    ctx: Any, sd15: Any, prompts: dict
) -> None:
    base = _sample(ctx, sd15.unet, prompts["a"], prompts["neg"], steps=3)
    (never,) = ConditioningSetTimestepRange().run(ctx, conditioning=prompts["b"], start=1.0, end=1.0)
    assert torch.equal(_sample(ctx, sd15.unet, prompts["a"] + never, prompts["neg"], steps=3), base)
    (always,) = ConditioningSetTimestepRange().run(ctx, conditioning=prompts["b"], start=0.0, end=1.0)
    assert not torch.allclose(_sample(ctx, sd15.unet, prompts["a"] + always, prompts["neg"], steps=3), base)
    (late,) = ConditioningSetTimestepRange().run(ctx, conditioning=prompts["b"], start=0.5, end=1.0)
    ranged = _sample(ctx, sd15.unet, prompts["a"] + late, prompts["neg"], steps=3)
    assert not torch.allclose(ranged, base)
    assert not torch.allclose(ranged, _sample(ctx, sd15.unet, prompts["a"] + always, prompts["neg"], steps=3))


def test_a_mask_changes_the_prediction_only_where_it_is_set(ctx: Any, sd15: Any, prompts: dict) -> None:
    base = _sample(
        ctx, sd15.unet, prompts["a"], prompts["neg"]
    )  # one euler step: the result is the prediction
    mask = torch.zeros(1, SIZE, SIZE)
    mask[:, :, SIZE // 2 :] = 1.0
    (right,) = ConditioningSetMask().run(
        ctx, conditioning=prompts["b"], mask=mask, strength=1.0, set_cond_area="default"
    )
    out = _sample(ctx, sd15.unet, prompts["a"] + right, prompts["neg"])
    assert torch.allclose(out[..., :3], base[..., :3], atol=1e-5)
    assert not torch.allclose(out[..., 5:], base[..., 5:], atol=1e-3)
    (weightless,) = ConditioningSetMask().run(
        ctx, conditioning=prompts["b"], mask=mask, strength=0.0, set_cond_area="default"
    )
    assert torch.allclose(_sample(ctx, sd15.unet, prompts["a"] + weightless, prompts["neg"]), base, atol=1e-5)
    (bounded,) = ConditioningSetMask().run(
        ctx, conditioning=prompts["b"], mask=mask, strength=1.0, set_cond_area="mask bounds"
    )
    out_b = _sample(ctx, sd15.unet, prompts["a"] + bounded, prompts["neg"])
    assert torch.allclose(out_b[..., :3], base[..., :3], atol=1e-5)
    assert not torch.allclose(out_b[..., 5:], out[..., 5:], atol=1e-4)  # the model saw only the bounding box


def test_an_area_and_its_strength_act_only_inside_it(ctx: Any, sd15: Any, prompts: dict) -> None:
    base = _sample(ctx, sd15.unet, prompts["a"], prompts["neg"])
    (left,) = ConditioningSetAreaPercentage().run(
        ctx, conditioning=prompts["b"], width=0.5, height=1.0, x=0.0, y=0.0, strength=1.0
    )
    out = _sample(ctx, sd15.unet, prompts["a"] + left, prompts["neg"])
    assert torch.allclose(out[..., 4:], base[..., 4:], atol=1e-5)
    assert not torch.allclose(out[..., :4], base[..., :4], atol=1e-3)
    (silent,) = ConditioningSetAreaStrength().run(ctx, conditioning=left, strength=0.0)
    assert torch.allclose(_sample(ctx, sd15.unet, prompts["a"] + silent, prompts["neg"]), base, atol=1e-5)
    (loud,) = ConditioningSetAreaStrength().run(ctx, conditioning=left, strength=4.0)
    loud_out = _sample(ctx, sd15.unet, prompts["a"] + loud, prompts["neg"])
    assert not torch.allclose(loud_out[..., :4], out[..., :4], atol=1e-4)
    assert torch.allclose(loud_out[..., 4:], base[..., 4:], atol=1e-5)


def test_average_at_full_strength_and_concat_through_sampling(ctx: Any, sd15: Any, prompts: dict) -> None:
    base = _sample(ctx, sd15.unet, prompts["a"], prompts["neg"])
    (same,) = ConditioningAverage().run(
        ctx, conditioning_to=prompts["a"], conditioning_from=prompts["b"], conditioning_to_strength=1.0
    )
    assert torch.equal(_sample(ctx, sd15.unet, same, prompts["neg"]), base)
    (longer,) = ConditioningConcat().run(ctx, conditioning_to=prompts["a"], conditioning_from=prompts["b"])
    assert longer[0].embeds.shape[1] == 154
    assert not torch.allclose(_sample(ctx, sd15.unet, longer, prompts["neg"]), base)


# --- SDXL ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sdxl(tiny_sdxl_ckpt: Any) -> Any:
    return open_checkpoint(tiny_sdxl_ckpt)


def _sdxl_encode(ctx: Any, clip: Any, **kw: Any) -> list:
    args: dict[str, Any] = dict(
        width=SIZE,
        height=SIZE,
        crop_w=0,
        crop_h=0,
        target_width=SIZE,
        target_height=SIZE,
        text_g="a cat",
        text_l="a cat",
    )
    args.update(kw)
    return CLIPTextEncodeSDXL().run(ctx, clip=clip, **args)[0]


def test_sdxl_encode_with_one_text_equals_clip_text_encode(ctx: Any, sdxl: Any) -> None:
    (entry,) = _sdxl_encode(ctx, sdxl.clip)
    (plain,) = _encode(ctx, sdxl.clip, "a cat")
    assert torch.equal(entry.embeds, plain.embeds)
    assert entry.pooled is not None and plain.pooled is not None and torch.equal(entry.pooled, plain.pooled)
    assert entry.extras["target_width"] == SIZE


def test_sdxl_encode_pads_the_shorter_prompt_with_empty_windows(ctx: Any, sdxl: Any) -> None:
    (entry,) = _sdxl_encode(ctx, sdxl.clip, text_l=" ".join(["cat"] * 100))
    assert entry.embeds.shape[1] == 154
    (only_l,) = _sdxl_encode(ctx, sdxl.clip, text_g="a dog")
    (plain_dog,) = _encode(ctx, sdxl.clip, "a dog")
    assert torch.equal(only_l.embeds[..., 32:], plain_dog.embeds[..., 32:])  # clip_g's half: text_g
    assert not torch.equal(only_l.embeds[..., :32], plain_dog.embeds[..., :32])  # clip_l's half: text_l


def test_sdxl_size_ids_reach_the_model(ctx: Any, sdxl: Any) -> None:
    neg = _encode(ctx, sdxl.clip, "blurry")
    plain = _sample(ctx, sdxl.unet, _sdxl_encode(ctx, sdxl.clip), neg)
    assert torch.equal(plain, _sample(ctx, sdxl.unet, _encode(ctx, sdxl.clip, "a cat"), neg))
    assert not torch.allclose(plain, _sample(ctx, sdxl.unet, _sdxl_encode(ctx, sdxl.clip, width=2048), neg))


def test_sdxl_encode_needs_two_encoders(ctx: Any, sd15: Any) -> None:
    with pytest.raises(ValueError, match="two text encoders"):
        _sdxl_encode(ctx, sd15.clip)


def test_refiner_encode_records_the_aesthetic_score(ctx: Any, sdxl: Any) -> None:
    ((entry,),) = CLIPTextEncodeSDXLRefiner().run(
        ctx, clip=sdxl.clip, ascore=2.5, width=640, height=480, text="x"
    )
    assert (entry.extras["aesthetic_score"], entry.extras["width"], entry.extras["height"]) == (2.5, 640, 480)
