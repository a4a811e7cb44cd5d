"""Loom's Z-Image txt2img against diffusers' ZImagePipeline on the same tiny components (the demo
files), the same seed-derived noise and the same sigmas: ComfyUI's discrete flow schedule (shift 3,
``simple``) handed to the pipeline's FlowMatchEulerDiscreteScheduler (shift 1, so it keeps them),
euler equal to the scheduler's step, and the calling convention (t = 1 − sigma, negated output,
per-row captions) equal to the pipeline's. Text encoding is compared with transformers' Qwen3Model
on ComfyUI's template (the pipeline asks a chat template of the tokenizer; the same string)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from nodes.demo.flux import DEMO_FLUX_VAE
from nodes.demo.zimage import DEMO_QWEN3, DEMO_ZIMAGE, demo_zimage_modules, zimage_files
from nodes.diffusion.noise import prepare_noise
from nodes.encode.conditioning import CLIPTextEncode
from nodes.families.components.qwen_text import load_qwen_tokenizer
from nodes.family_nodes.flux_nodes import EmptySD3LatentImage
from nodes.family_nodes.zimage_nodes import ModelSamplingAuraFlow
from nodes.load.handles import open_diffusion_model, open_text_encoders, open_vae
from nodes.sample.ksampler import KSampler

PROMPT, NEGATIVE, SIZE, STEPS, SEED = "a photo of a cat", "blurry, low quality", 64, 4, 42


@pytest.fixture(scope="module")
def zimage_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    from safetensors.torch import save_file

    from nodes.core.parts import Part
    from nodes.families.build import original_state_dict
    from nodes.families.components import KLVae

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("zimage")
    modules = demo_zimage_modules()
    files = zimage_files(modules)
    vae = modules["vae"]
    files[DEMO_FLUX_VAE] = original_state_dict(Part.make("vae", KLVae(), "", "vae", dict(vae.config)), vae)
    for name, tensors in files.items():
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(root / name))
    return root, modules


def _pipeline(modules: dict[str, Any]) -> Any:
    from diffusers import FlowMatchEulerDiscreteScheduler, ZImagePipeline

    pipe: Any = ZImagePipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(shift=1.0),
        vae=modules["vae"],
        text_encoder=modules["qwen3_4b"],
        tokenizer=load_qwen_tokenizer(),
        transformer=modules["unet"],
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _loom(root: Path, ctx: Any, cfg: float) -> tuple[Any, Any, Any, Any]:
    model = open_diffusion_model(root / DEMO_ZIMAGE)
    model = ModelSamplingAuraFlow().run(ctx, model=model, shift=3.0)[0]
    clip = open_text_encoders([root / DEMO_QWEN3], "lumina2")
    pos = CLIPTextEncode().run(ctx, text=PROMPT, clip=clip)[0]
    neg = CLIPTextEncode().run(ctx, text=NEGATIVE, clip=clip)[0]
    latent = EmptySD3LatentImage().run(ctx, width=SIZE, height=SIZE, batch_size=1)[0]
    out = KSampler().run(
        ctx,
        model=model,
        seed=SEED,
        steps=STEPS,
        cfg=cfg,
        sampler_name="euler",
        scheduler="simple",
        positive=pos,
        negative=neg,
        latent_image=latent,
        denoise=1.0,
    )[0]
    return model, (pos, neg), latent, out


@pytest.mark.parametrize("cfg", [1.0, 3.0], ids=["turbo_cfg1", "cfg3"])
def test_z_image_txt2img_matches_zimage_pipeline(cfg: float, zimage_dir: Any, make_ctx: Any) -> None:
    from nodes.diffusion.schedulers import ksampler_sigmas

    torch.set_num_threads(1)
    root, modules = zimage_dir
    ctx = make_ctx()
    model, (pos, neg), latent, out = _loom(root, ctx, cfg)
    sigmas = ksampler_sigmas(model.model_sampling, "simple", "euler", STEPS)
    assert sigmas[0] == 1.0 and sigmas[-1] == 0.0

    pipe = _pipeline(modules)
    noise = prepare_noise(latent["samples"], SEED)
    kwargs = dict(
        prompt_embeds=[pos[0].embeds[0]],
        negative_prompt_embeds=[neg[0].embeds[0]],
        height=SIZE,
        width=SIZE,
        num_inference_steps=STEPS,
        sigmas=sigmas[:-1].tolist(),
        guidance_scale=cfg - 1.0,
        latents=noise.clone(),
    )
    ref = pipe(**kwargs, output_type="latent").images  # diffusers' guidance g is ComfyUI's cfg − 1
    mine = model.latent_format.process_in(out["samples"])
    assert (mine - ref).abs().max() < 1e-4
    assert (mine - noise).abs().max() > 0.1  # the model moved the latent

    # decoding: VAEDecode on the Flux VAE file equals the pipeline's image (shift and scale undone)
    from nodes.latent.vae import VAEDecode

    image = VAEDecode().run(ctx, samples=out, vae=open_vae(root / DEMO_FLUX_VAE))[0]
    ref_image = pipe(**kwargs, output_type="pt").images
    assert image.shape == (1, SIZE, SIZE, 3)
    assert (image - ref_image.permute(0, 2, 3, 1)).abs().max() < 1e-4


def test_z_image_default_sampling_is_discrete_flow_shift_3(zimage_dir: Any, make_ctx: Any) -> None:
    """Without ModelSamplingAuraFlow the model samples as ComfyUI's ZImage config says: shift 3,
    multiplier 1 — the same sigmas the template's ModelSamplingAuraFlow(3) gives."""
    from nodes.diffusion.schedulers import ksampler_sigmas

    root, _ = zimage_dir
    plain = open_diffusion_model(root / DEMO_ZIMAGE)
    shifted = ModelSamplingAuraFlow().run(make_ctx(), model=plain, shift=3.0)[0]
    expected = torch.tensor([1.0, 0.9, 0.75, 0.5, 0.0])  # 3t / (1 + 2t) at t = 1, .75, .5, .25
    for model in (plain, shifted):
        torch.testing.assert_close(ksampler_sigmas(model.model_sampling, "simple", "euler", 4), expected)
        assert float(model.model_sampling.timestep(torch.tensor(0.25))) == pytest.approx(0.25)


def test_z_image_text_encoding_matches_qwen3_on_comfyui_template(zimage_dir: Any, make_ctx: Any) -> None:
    root, modules = zimage_dir
    clip = open_text_encoders([root / DEMO_QWEN3], "lumina2")
    (entry,) = CLIPTextEncode().run(make_ctx(), text=PROMPT, clip=clip)[0]
    tokenizer = load_qwen_tokenizer()
    ids = tokenizer(f"<|im_start|>user\n{PROMPT}<|im_end|>\n<|im_start|>assistant\n", return_tensors="pt")
    ref = modules["qwen3_4b"](**ids, output_hidden_states=True).hidden_states[-2]
    assert entry.embeds.shape == (1, 13, 48) and entry.pooled is None
    torch.testing.assert_close(entry.embeds, ref, atol=1e-5, rtol=1e-5)
