# ruff: noqa: F811  (lora_files is the LoRA fixture, imported from test_lora)
"""Hook nodes on the tiny SD1.5 model: a hooked LoRA changes the sampler's output only through the
conditioning it is attached to, equals the merged LoRA where every evaluated entry carries it,
keyframes change its strength over the steps, and the model's weights are left as loaded."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from nodes.encode.conditioning import CLIPTextEncode
from nodes.encode.conditioning_props import ConditioningSetProperties
from nodes.latent.vae import EmptyLatentImage
from nodes.load.checkpoint_loaders import CheckpointLoaderSimple, LoraLoaderModelOnly
from nodes.load.hook_nodes import (
    CombineHooks2,
    CombineHooks8,
    CreateHookKeyframe,
    CreateHookKeyframesFromFloats,
    CreateHookKeyframesInterpolated,
    CreateHookLora,
    CreateHookLoraModelOnly,
    SetHookKeyframes,
)
from nodes.load.lora_hooks import HookGroup, KeyframeClock, Keyframes
from nodes.sample.ksampler import KSampler
from tests.nodes.load.test_lora import lora_files  # noqa: F401  (the LoRA files fixture)


@pytest.fixture()
def ctx(make_ctx: Any) -> Any:
    torch.set_num_threads(1)
    return make_ctx()


@pytest.fixture()
def sd15(ctx: Any) -> tuple[Any, Any]:
    model, clip, _ = CheckpointLoaderSimple().run(ctx, ckpt_name="tiny_sd15.safetensors")
    return model, clip


def _sample(ctx: Any, model: Any, positive: list, negative: list, cfg: float = 1.0) -> torch.Tensor:
    latent = EmptyLatentImage().run(ctx, width=64, height=64, batch_size=1)[0]
    out = KSampler().run(
        ctx,
        model=model,
        seed=3,
        steps=4,
        cfg=cfg,
        sampler_name="euler",
        scheduler="normal",
        positive=positive,
        negative=negative,
        latent_image=latent,
        denoise=1.0,
    )[0]
    return out["samples"]


def _hooked(cond: list, hooks: Any) -> list:
    return ConditioningSetProperties().run(
        None, cond_NEW=cond, strength=1.0, set_cond_area="default", hooks=hooks
    )[0]


def _prompts(ctx: Any, clip: Any) -> tuple[list, list]:
    enc = CLIPTextEncode()
    return enc.run(ctx, text="a cat", clip=clip)[0], enc.run(ctx, text="blurry", clip=clip)[0]


def test_a_hooked_lora_acts_only_through_its_conditioning(ctx: Any, sd15: Any, lora_files: Any) -> None:
    model, clip = sd15
    pos, neg = _prompts(ctx, clip)
    hooks = CreateHookLoraModelOnly().run(ctx, lora_name=lora_files["kohya"], strength_model=1.0)[0]
    merged = LoraLoaderModelOnly().run(ctx, model=model, lora_name=lora_files["kohya"], strength_model=1.0)[0]
    plain = _sample(ctx, model, pos, neg)
    with_lora = _sample(ctx, merged, pos, neg)
    assert not torch.allclose(plain, with_lora, atol=1e-4)
    # cfg 1: only the positive is evaluated; hooked there it is the merged model's result
    assert torch.allclose(_sample(ctx, model, _hooked(pos, hooks), neg), with_lora, atol=1e-4)
    # hooked on the negative (not evaluated at cfg 1): the plain result, bit for bit
    assert torch.equal(_sample(ctx, model, pos, _hooked(neg, hooks)), plain)
    # with CFG, a LoRA on the positive only is neither the plain nor the fully merged result
    only_pos = _sample(ctx, model, _hooked(pos, hooks), neg, cfg=5.0)
    both = _sample(ctx, model, _hooked(pos, hooks), _hooked(neg, hooks), cfg=5.0)
    assert torch.allclose(both, _sample(ctx, merged, pos, neg, cfg=5.0), atol=1e-4)
    assert not torch.allclose(only_pos, both, atol=1e-4)
    assert not torch.allclose(only_pos, _sample(ctx, model, pos, neg, cfg=5.0), atol=1e-4)
    # the weights are put back after every call: sampling without hooks again is the plain result
    assert torch.equal(_sample(ctx, model, pos, neg), plain)


def test_keyframes_change_the_hook_strength_over_the_steps(ctx: Any, sd15: Any, lora_files: Any) -> None:
    model, clip = sd15
    pos, neg = _prompts(ctx, clip)
    hooks = CreateHookLora().run(ctx, lora_name=lora_files["kohya"], strength_model=1.0, strength_clip=0.0)[0]
    off = CreateHookKeyframe().run(ctx, strength_mult=0.0, start_percent=0.0)[0]
    half = CreateHookKeyframe().run(ctx, strength_mult=0.0, start_percent=0.5, prev_hook_kf=None)[0]
    on_then_off = CreateHookKeyframe().run(ctx, strength_mult=1.0, start_percent=0.0, prev_hook_kf=half)[0]
    plain = _sample(ctx, model, pos, neg)
    full = _sample(ctx, model, _hooked(pos, hooks), neg)
    never = _sample(ctx, model, _hooked(pos, SetHookKeyframes().run(ctx, hooks=hooks, hook_kf=off)[0]), neg)
    assert torch.allclose(never, plain, atol=1e-5)
    first_half = _sample(
        ctx, model, _hooked(pos, SetHookKeyframes().run(ctx, hooks=hooks, hook_kf=on_then_off)[0]), neg
    )
    assert not torch.allclose(first_half, plain, atol=1e-4)
    assert not torch.allclose(first_half, full, atol=1e-4)
    assert SetHookKeyframes().run(ctx, hooks=hooks, hook_kf=None)[0] is hooks


def test_the_keyframe_clock_follows_comfyuis_guaranteed_steps() -> None:
    frames = CreateHookKeyframesFromFloats().run(
        None, floats_strength=[1.0, 0.5, 0.0], start_percent=0.0, end_percent=0.2
    )[0]
    assert [(k.start_percent, k.guarantee_steps) for k in frames.frames] == [(0.0, 1), (0.1, 0), (0.2, 0)]
    clock = KeyframeClock(frames, lambda p: 1.0 - p)  # sigma falls from 1 to 0 over the run
    # the first keyframe holds its guaranteed step, then every started keyframe is passed at once
    assert [clock.strength(s) for s in (1.0, 1.0, 0.5, 0.25)] == [1.0, 1.0, 0.0, 0.0]
    stepwise = Keyframes()
    for mult, start in ((1.0, 0.0), (2.0, 0.1), (3.0, 0.2)):
        stepwise = CreateHookKeyframe().run(
            None, strength_mult=mult, start_percent=start, prev_hook_kf=stepwise
        )[0]
    clock = KeyframeClock(stepwise, lambda p: 1.0 - p)
    # CreateHookKeyframe's keyframes each guarantee a step: one keyframe per step
    assert [clock.strength(s) for s in (1.0, 0.5, 0.4, 0.3)] == [1.0, 2.0, 3.0, 3.0]


def test_interpolated_keyframes_and_their_errors() -> None:
    kf = CreateHookKeyframesInterpolated().run(
        None,
        strength_start=0.0,
        strength_end=1.0,
        interpolation="ease_in",
        start_percent=0.0,
        end_percent=1.0,
        keyframes_count=3,
    )[0]
    assert [(k.start_percent, k.strength) for k in kf.frames] == [(0.0, 0.0), (0.5, 0.25), (1.0, 1.0)]
    with pytest.raises(ValueError, match="interpolation: expected one of linear"):
        CreateHookKeyframesInterpolated().run(
            None,
            strength_start=0,
            strength_end=1,
            interpolation="cubic",
            start_percent=0,
            end_percent=1,
            keyframes_count=2,
        )
    with pytest.raises(ValueError, match="floats_strength: expected a FLOATS list or a number"):
        CreateHookKeyframesFromFloats().run(None, floats_strength="1,2", start_percent=0.0, end_percent=1.0)


def test_combining_hooks(ctx: Any, lora_files: Any) -> None:
    a = CreateHookLoraModelOnly().run(ctx, lora_name=lora_files["kohya"], strength_model=1.0)[0]
    b = CreateHookLoraModelOnly().run(ctx, lora_name=lora_files["peft"], strength_model=0.5)[0]
    assert CombineHooks2().run(ctx, hooks_A=a, hooks_B=b)[0].hooks == a.hooks + b.hooks
    assert CombineHooks8().run(ctx)[0] == HookGroup()
    # strength 0 adds nothing; prev_hooks chain
    assert (
        CreateHookLora().run(
            ctx, lora_name=lora_files["kohya"], strength_model=0.0, strength_clip=0.0, prev_hooks=a
        )[0]
        is a
    )
    chained = CreateHookLoraModelOnly().run(
        ctx, lora_name=lora_files["peft"], strength_model=0.5, prev_hooks=a
    )[0]
    assert len(chained.hooks) == 2


def test_a_hook_lora_that_is_not_a_lora_is_refused_with_its_keys(ctx: Any, lora_files: Any) -> None:
    with pytest.raises(Exception, match="not a LoRA file"):
        CreateHookLoraModelOnly().run(ctx, lora_name="not_a_lora.safetensors", strength_model=1.0)


def test_bypass_loras_equal_the_merged_lora(ctx: Any, sd15: Any, lora_files: Any) -> None:
    from nodes.load.checkpoint_loaders import LoraLoader
    from nodes.load.lora_bypass import LoraLoaderBypass, LoraLoaderBypassModelOnly

    model, clip = sd15
    pos, neg = _prompts(ctx, clip)
    merged = LoraLoaderModelOnly().run(ctx, model=model, lora_name=lora_files["kohya"], strength_model=0.7)[0]
    bypass = LoraLoaderBypassModelOnly().run(
        ctx, model=model, lora_name=lora_files["kohya"], strength_model=0.7
    )[0]
    assert torch.allclose(_sample(ctx, bypass, pos, neg), _sample(ctx, merged, pos, neg), atol=1e-4)
    both = LoraLoaderBypass().run(
        ctx, model=model, clip=clip, lora_name=lora_files["kohya"], strength_model=1.0, strength_clip=1.0
    )
    ref = LoraLoader().run(
        ctx, model=model, clip=clip, lora_name=lora_files["kohya"], strength_model=1.0, strength_clip=1.0
    )
    assert torch.allclose(
        CLIPTextEncode().run(ctx, text="a cat", clip=both[1])[0][0].embeds,
        CLIPTextEncode().run(ctx, text="a cat", clip=ref[1])[0][0].embeds,
        atol=1e-5,
    )
    assert [i.name for i in LoraLoaderBypass.SCHEMA.inputs] == [
        "model", "clip", "lora_name", "strength_model", "strength_clip",
    ]  # fmt: skip
    with pytest.raises(Exception, match="not a LoRA file"):
        LoraLoaderBypassModelOnly().run(
            ctx, model=model, lora_name="not_a_lora.safetensors", strength_model=1.0
        )


def test_set_clip_hooks_applies_the_clip_lora_and_attaches_the_hooks(
    ctx: Any, sd15: Any, lora_files: Any
) -> None:
    from nodes.load.checkpoint_loaders import LoraLoader
    from nodes.load.hook_nodes import SetClipHooks

    model, clip = sd15
    hooks = CreateHookLora().run(ctx, lora_name=lora_files["kohya"], strength_model=1.0, strength_clip=0.5)[0]
    hooked_clip = SetClipHooks().run(ctx, clip=clip, apply_to_conds=True, schedule_clip=False, hooks=hooks)[0]
    ref_clip = LoraLoader().run(
        ctx, model=model, clip=clip, lora_name=lora_files["kohya"], strength_model=0.0, strength_clip=0.5
    )[1]
    (entry,) = CLIPTextEncode().run(ctx, text="a cat", clip=hooked_clip)[0]
    assert torch.allclose(
        entry.embeds, CLIPTextEncode().run(ctx, text="a cat", clip=ref_clip)[0][0].embeds, atol=1e-5
    )
    assert entry.extras["hooks"] is hooks
    kept = SetClipHooks().run(ctx, clip=clip, apply_to_conds=False, schedule_clip=False, hooks=hooks)[0]
    assert "hooks" not in CLIPTextEncode().run(ctx, text="a cat", clip=kept)[0][0].extras
    assert SetClipHooks().run(ctx, clip=clip, apply_to_conds=True, schedule_clip=False)[0] is clip
