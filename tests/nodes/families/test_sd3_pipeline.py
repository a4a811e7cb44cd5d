"""Loom's SD3 txt2img against diffusers' StableDiffusion3Pipeline on the same tiny components (the
demo files), the same seed-derived noise and the same sigmas: ComfyUI's ``normal`` schedule on
ModelSamplingDiscreteFlow (shift 3) equals FlowMatchEulerDiscreteScheduler(shift=3)'s, euler equals
its step, CFG and the calling convention (timestep = 1000·sigma, the model patchifies) equal the
pipeline's. Text encoding is compared separately where the two agree by construction: the pipeline
is asked for ComfyUI's T5 length (77, where it would use 256), and its CLIP-L gets an identity
projection (ComfyUI, like SAI's reference code, pools CLIP-L without its projection; diffusers
projects)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from nodes.demo.sd3 import DEMO_SD3_MMDIT, DEMO_SD3_VAE, demo_sd3_modules, sd3_files
from nodes.encode.conditioning import CLIPTextEncode
from nodes.families.components.clip_text import load_tokenizer
from nodes.load.handles import open_diffusion_model, open_vae
from tests.nodes.dit_control_fixtures import (
    SIZE,
    noise,
    sample,
    save,
    sd3_clip,
    sd3_pipeline,
    sd3_pipeline_output,
)

PROMPT, NEGATIVE, CFG = "a photo of a cat", "blurry", 4.0


@pytest.fixture(scope="module")
def sd3_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("sd3")
    modules = demo_sd3_modules()
    for name, tensors in sd3_files(modules).items():
        save(root / name, tensors)
    return root, modules


def test_sd3_txt2img_matches_stable_diffusion_3_pipeline(sd3_dir: Any, make_ctx: Any) -> None:
    from nodes.latent.vae import VAEDecode

    root, modules = sd3_dir
    ctx = make_ctx()
    model = open_diffusion_model(root / DEMO_SD3_MMDIT)
    clip = sd3_clip(root)
    pos = CLIPTextEncode().run(ctx, text=PROMPT, clip=clip)[0]
    neg = CLIPTextEncode().run(ctx, text=NEGATIVE, clip=clip)[0]
    out = sample(ctx, model, pos, neg, CFG, "normal")

    pipe = sd3_pipeline(modules)
    ref = sd3_pipeline_output(pipe, pos, neg, cfg=CFG)
    mine = model.latent_format.process_in(out["samples"])
    assert (mine - ref).abs().max() < 1e-4  # measured 1.4e-6
    assert (mine - noise()).abs().max() > 0.1  # the model moved the latent

    image = VAEDecode().run(ctx, samples=out, vae=open_vae(root / DEMO_SD3_VAE))[0]
    ref_image = sd3_pipeline_output(pipe, pos, neg, cfg=CFG, output_type="pt")
    assert image.shape == (1, SIZE, SIZE, 3)
    assert (image - ref_image.permute(0, 2, 3, 1)).abs().max() < 1e-4  # measured 3e-6


def test_sd3_text_encoding_matches_pipeline_at_comfyui_length(sd3_dir: Any, make_ctx: Any) -> None:
    root, modules = sd3_dir
    (entry,) = CLIPTextEncode().run(make_ctx(), text=PROMPT, clip=sd3_clip(root))[0]
    pipe = sd3_pipeline(modules)
    embeds, _, pooled, _ = pipe.encode_prompt(
        PROMPT, PROMPT, PROMPT, do_classifier_free_guidance=False, max_sequence_length=77
    )
    assert entry.embeds.shape == (1, 77 + 77, 64)  # CLIP tokens, then T5's padded to 77 (diffusers: 256)
    torch.testing.assert_close(entry.embeds, embeds, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(entry.pooled, pooled, atol=1e-5, rtol=1e-5)


def test_clip_l_pooled_is_not_projected(sd3_dir: Any, make_ctx: Any) -> None:
    """ComfyUI's SD3 CLIP-L returns its pooled output unprojected (return_projected_pooled=False):
    the first 32 pooled values are CLIP-L's final-normed end-token state, even when the file has a
    text_projection (as SAI's clip_l.safetensors has)."""
    from transformers import CLIPTokenizer

    root, modules = sd3_dir
    (entry,) = CLIPTextEncode().run(make_ctx(), text=PROMPT, clip=sd3_clip(root))[0]
    tokenizer: CLIPTokenizer = load_tokenizer("clip_tokenizer")
    ids = tokenizer(PROMPT, padding="max_length", max_length=77, return_tensors="pt").input_ids
    with torch.no_grad():
        unprojected = modules["clip_l"](ids).pooler_output
    torch.testing.assert_close(entry.pooled[:, :32], unprojected, atol=1e-5, rtol=1e-5)


def test_default_sampling_is_discrete_flow_shift_3_at_1000_sigma(sd3_dir: Any) -> None:
    from diffusers import FlowMatchEulerDiscreteScheduler

    from nodes.diffusion.schedulers import ksampler_sigmas

    root, _ = sd3_dir
    model = open_diffusion_model(root / DEMO_SD3_MMDIT)
    sigmas = ksampler_sigmas(model.model_sampling, "normal", "euler", 20)
    sched = FlowMatchEulerDiscreteScheduler(shift=3.0)
    sched.set_timesteps(20)
    torch.testing.assert_close(sigmas, sched.sigmas.float(), atol=1e-6, rtol=0)
    assert model.model_sampling.timestep(torch.tensor([0.25])).item() == pytest.approx(250.0)
