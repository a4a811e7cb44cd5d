"""KSampler against diffusers' own pipelines on the same tiny components, plus reproducibility."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest
import torch

from nodes.conditioning import CLIPTextEncode
from nodes.families.components.clip_text import load_tokenizer
from nodes.handles import open_checkpoint
from nodes.latent import EmptyLatentImage, VAEDecode, VAEEncode
from nodes.samplers import SAMPLER_NAMES, SCHEDULER_NAMES, compatible_schedulers, make_noise, make_scheduler
from nodes.sampling import KSampler, KSamplerAdvanced
from tests.nodes.gen_fixtures import gradient_image

PROMPT, NEGATIVE = "a photo of a cat, (sharp:1.0)", "blurry"
SIZE = 64


def _encode(ctx: Any, clip: Any, text: str) -> list:
    return CLIPTextEncode().run(ctx, text=text, clip=clip)[0]


def _ksampler(ctx: Any, ck: Any, latent: dict, **kw: Any) -> dict:
    args: dict[str, Any] = dict(
        seed=42, steps=3, cfg=7.5, sampler_name="euler", scheduler="normal", denoise=1.0,
        positive=_encode(ctx, ck.clip, "a photo of a cat"), negative=_encode(ctx, ck.clip, NEGATIVE),
    )
    args.update(kw)
    return KSampler().run(ctx, model=ck.unet, latent_image=latent, **args)[0]


def _empty(ctx: Any, batch: int = 1) -> dict:
    return EmptyLatentImage().run(ctx, width=SIZE, height=SIZE, batch_size=batch)[0]


def _sd15_pipe(modules: dict, scheduler: Any, img2img: bool = False) -> Any:
    from diffusers import StableDiffusionImg2ImgPipeline, StableDiffusionPipeline

    cls = StableDiffusionImg2ImgPipeline if img2img else StableDiffusionPipeline
    return cls(
        vae=modules["vae"], text_encoder=modules["clip_l"], tokenizer=load_tokenizer("clip_tokenizer"),
        unet=modules["unet"], scheduler=scheduler, safety_checker=None, feature_extractor=None,
        requires_safety_checker=False,
    )


@pytest.mark.parametrize(("sampler", "schedule"), [("euler", "normal"), ("dpmpp_2m", "karras")])
def test_txt2img_matches_diffusers_sd15(tiny_models: dict, tiny_sd15_ckpt: Any, make_ctx: Any,
                                        sampler: str, schedule: str) -> None:
    ck = open_checkpoint(tiny_sd15_ckpt)
    ctx = make_ctx()
    out = _ksampler(ctx, ck, _empty(ctx), sampler_name=sampler, scheduler=schedule)
    image = VAEDecode().run(ctx, samples=out, vae=ck.vae)[0]

    pipe = _sd15_pipe(tiny_models["sd15"].modules, make_scheduler(sampler, schedule, ck.unet.scheduler_config()))
    ref = pipe("a photo of a cat", negative_prompt=NEGATIVE, height=SIZE, width=SIZE, num_inference_steps=3,
               guidance_scale=7.5, latents=make_noise(42, (1, 4, 8, 8)), output_type="np").images
    assert image.shape == (1, SIZE, SIZE, 3)
    assert np.abs(image.numpy() - ref).max() < 1e-3


def test_img2img_matches_diffusers_sd15(tiny_models: dict, tiny_sd15_ckpt: Any, make_ctx: Any) -> None:
    ck = open_checkpoint(tiny_sd15_ckpt)
    ctx = make_ctx()
    latent = VAEEncode().run(ctx, pixels=gradient_image(SIZE), vae=ck.vae)[0]
    out = _ksampler(ctx, ck, latent, steps=2, denoise=0.5)  # ComfyUI: last 2 steps of a 4-step schedule
    image = VAEDecode().run(ctx, samples=out, vae=ck.vae)[0]

    pipe = _sd15_pipe(tiny_models["sd15"].modules, make_scheduler("euler", "normal", ck.unet.scheduler_config()),
                      img2img=True)
    scaled = latent["samples"] * ck.unet.latent_format.scale_factor  # the pipeline takes model-space latents as `image`
    ref = pipe("a photo of a cat", negative_prompt=NEGATIVE, image=scaled, strength=0.5, num_inference_steps=4,
               guidance_scale=7.5, generator=torch.Generator("cpu").manual_seed(42), output_type="np").images
    assert np.abs(image.numpy() - ref).max() < 1e-3


def test_txt2img_matches_diffusers_sdxl(tiny_models: dict, tiny_sdxl_ckpt: Any, make_ctx: Any) -> None:
    from diffusers import StableDiffusionXLPipeline

    ck = open_checkpoint(tiny_sdxl_ckpt)
    ctx = make_ctx()
    out = _ksampler(ctx, ck, _empty(ctx), cfg=5.0)
    image = VAEDecode().run(ctx, samples=out, vae=ck.vae)[0]

    m = tiny_models["sdxl"].modules
    vae = copy.deepcopy(m["vae"])
    vae.register_to_config(scaling_factor=ck.unet.latent_format.scale_factor)
    pipe = StableDiffusionXLPipeline(
        vae=vae, text_encoder=m["clip_l"], text_encoder_2=m["clip_g"], tokenizer=load_tokenizer("clip_tokenizer"),
        tokenizer_2=load_tokenizer("clip_tokenizer_2"), unet=m["unet"],
        scheduler=make_scheduler("euler", "normal", ck.unet.scheduler_config()),
    )
    ref = pipe("a photo of a cat", negative_prompt=NEGATIVE, height=SIZE, width=SIZE, num_inference_steps=3,
               guidance_scale=5.0, latents=make_noise(42, (1, 4, 8, 8)), output_type="np").images
    assert np.abs(image.numpy() - ref).max() < 1e-3


def test_same_seed_same_pixels_other_seed_differs(tiny_sd15_ckpt: Any, make_ctx: Any) -> None:
    ck = open_checkpoint(tiny_sd15_ckpt)
    ctx = make_ctx()
    a = _ksampler(ctx, ck, _empty(ctx), steps=2)["samples"]
    b = _ksampler(ctx, ck, _empty(ctx), steps=2)["samples"]
    c = _ksampler(ctx, ck, _empty(ctx), steps=2, seed=43)["samples"]
    assert torch.equal(a, b)
    assert (a - c).abs().max() > 1e-2


@pytest.mark.parametrize("sampler", ["euler", "euler_ancestral"])
def test_batch_item_k_equals_item_k_alone(tiny_sd15_ckpt: Any, make_ctx: Any, sampler: str) -> None:
    ck = open_checkpoint(tiny_sd15_ckpt)
    ctx = make_ctx()
    batch = _ksampler(ctx, ck, _empty(ctx, 3), steps=2, sampler_name=sampler)["samples"]
    first = _ksampler(ctx, ck, _empty(ctx, 1), steps=2, sampler_name=sampler)["samples"]
    third = _ksampler(ctx, ck, {**_empty(ctx, 1), "batch_index": [2]}, steps=2, sampler_name=sampler)["samples"]
    assert torch.allclose(batch[0:1], first, rtol=1e-4, atol=1e-3)
    assert torch.allclose(batch[2:3], third, rtol=1e-4, atol=1e-3)
    assert (batch[0] - batch[1]).abs().max() > 1e-2


@pytest.mark.slow
def test_every_sampler_and_every_scheduler_runs(tiny_sd15_ckpt: Any, make_ctx: Any) -> None:
    ck = open_checkpoint(tiny_sd15_ckpt)
    ctx = make_ctx()
    pos, neg = _encode(ctx, ck.clip, "cat"), _encode(ctx, ck.clip, "")
    pairs = [(s, "normal") for s in SAMPLER_NAMES] + [("euler", s) for s in SCHEDULER_NAMES]
    pairs += [("dpmpp_2m", "ays"), ("heun", "karras"), ("uni_pc", "exponential")]
    for sampler, schedule in pairs:
        assert schedule in compatible_schedulers(sampler)
        out = _ksampler(ctx, ck, _empty(ctx), steps=2, cfg=1.0, sampler_name=sampler, scheduler=schedule,
                        positive=pos, negative=neg)["samples"]
        assert torch.isfinite(out).all(), (sampler, schedule)
    assert "karras" not in compatible_schedulers("euler_ancestral")
    with pytest.raises(ValueError, match="does not work with sampler 'euler_ancestral'; pick one of"):
        make_scheduler("euler_ancestral", "karras", ck.unet.scheduler_config())


def test_advanced_split_equals_one_run_for_euler(tiny_sd15_ckpt: Any, make_ctx: Any) -> None:
    ck = open_checkpoint(tiny_sd15_ckpt)
    ctx = make_ctx()
    pos, neg = _encode(ctx, ck.clip, "cat"), _encode(ctx, ck.clip, "")
    common: dict[str, Any] = dict(model=ck.unet, steps=4, cfg=6.0, sampler_name="euler", scheduler="karras",
                                  positive=pos, negative=neg, noise_seed=7)
    adv = KSamplerAdvanced()
    full = adv.run(ctx, add_noise="enable", latent_image=_empty(ctx), start_at_step=0, end_at_step=10000,
                   return_with_leftover_noise="disable", **common)[0]
    half = adv.run(ctx, add_noise="enable", latent_image=_empty(ctx), start_at_step=0, end_at_step=2,
                   return_with_leftover_noise="enable", **common)[0]
    rest = adv.run(ctx, add_noise="disable", latent_image=half, start_at_step=2, end_at_step=10000,
                   return_with_leftover_noise="disable", **common)[0]
    assert torch.allclose(full["samples"], rest["samples"], atol=1e-4)


def test_cfg_one_skips_negative_and_v_prediction_runs(tiny_sd2_ckpt: Any, make_ctx: Any) -> None:
    ck = open_checkpoint(tiny_sd2_ckpt)
    assert ck.unet.prediction == "v_prediction"
    ctx = make_ctx()
    pos = _encode(ctx, ck.clip, "cat")
    a = KSampler().run(ctx, model=ck.unet, seed=1, steps=2, cfg=1.0, sampler_name="euler", scheduler="normal",
                       positive=pos, negative=[], latent_image=_empty(ctx), denoise=1.0)[0]
    assert torch.isfinite(a["samples"]).all()


def test_sdxl_latent_into_sd15_sampler_is_a_clear_error(tiny_sd15_ckpt: Any, tiny_sdxl_ckpt: Any,
                                                          make_ctx: Any) -> None:
    sd15, sdxl = open_checkpoint(tiny_sd15_ckpt), open_checkpoint(tiny_sdxl_ckpt)
    ctx = make_ctx()
    xl_latent = _ksampler(ctx, sdxl, _empty(ctx), steps=1)
    with pytest.raises(ValueError, match="SDXL model .*SD1.x model"):
        _ksampler(ctx, sd15, xl_latent, steps=1)


def test_progress_preview_and_interrupt(tiny_sd15_ckpt: Any, make_ctx: Any) -> None:
    from engine.context import Interrupted

    ck = open_checkpoint(tiny_sd15_ckpt)
    ctx = make_ctx()
    steps: list[tuple[int, int]] = []
    previews: list[Any] = []
    ctx.on_progress = lambda node, v, t: steps.append((v, t))
    ctx.on_preview = lambda node, p: previews.append(p)
    _ksampler(ctx, ck, _empty(ctx), steps=3)
    assert steps == [(1, 3), (2, 3), (3, 3)]
    assert previews and previews[-1].format == "JPEG" and previews[-1].data[:2] == b"\xff\xd8"

    def interrupt_after_first(node: str, v: int, t: int) -> None:
        ctx.interrupt.set()

    ctx.on_progress = interrupt_after_first
    calls: list[int] = []
    ctx.on_preview = None
    with pytest.raises(Interrupted):
        _ksampler(ctx, ck, _empty(ctx), steps=5)
    assert not calls
