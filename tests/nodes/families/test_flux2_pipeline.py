"""Loom's Flux.2 Klein txt2img against diffusers' Flux2KleinPipeline on the same tiny components (the
demo files), the same seed-derived noise and the same schedule: ComfyUI's Flux2Scheduler sigmas (mu from
the image size and step count) equal the pipeline's dynamically shifted FlowMatchEulerDiscreteScheduler,
euler equals its step, real CFG equals its guidance, and VAEDecode (BatchNorm statistics undone, 2×2
patches unfolded) equals its image. Text encoding equals the pipeline's own Qwen3 prompt embedding
(template, 512-token padding, hidden states 9/18/27 stacked)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from nodes.demo.flux2 import DEMO_FLUX2_VAE, DEMO_KLEIN, DEMO_KLEIN_QWEN3, demo_flux2_modules, flux2_files
from nodes.diffusion.noise import prepare_noise
from nodes.encode.conditioning import CLIPTextEncode
from nodes.families.components.qwen_text import load_qwen_tokenizer
from nodes.family_nodes.flux2_nodes import EmptyFlux2LatentImage, Flux2Scheduler
from nodes.load.handles import open_diffusion_model, open_text_encoders, open_vae
from nodes.sample.custom_sampling import SamplerCustom
from nodes.sample.sampler_nodes import KSamplerSelect

PROMPT, NEGATIVE, SIZE, STEPS, SEED = "a photo of a cat", "blurry, low quality", 64, 4, 42
# Qwen3's chat template as far as Klein uses it (one user turn, generation prompt, thinking disabled)
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is defined and "
    "not enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)


@pytest.fixture(scope="module")
def klein_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    from safetensors.torch import save_file

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("flux2")
    modules = demo_flux2_modules()
    for name, tensors in flux2_files(modules).items():
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(root / name))
    return root, modules


def _pipeline(modules: dict[str, Any]) -> Any:
    from diffusers import AutoencoderKLFlux2, FlowMatchEulerDiscreteScheduler, Flux2KleinPipeline

    vae = AutoencoderKLFlux2.from_config(
        modules["vae"].config
    )  # diffusers' own class: its latents are 32-channel
    vae.load_state_dict(modules["vae"].state_dict())
    scheduler = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, time_shift_type="exponential")
    pipe: Any = Flux2KleinPipeline(
        scheduler=scheduler,
        vae=vae.eval(),
        text_encoder=modules["qwen3_4b"],
        tokenizer=load_qwen_tokenizer(),
        transformer=modules["unet"],
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.mark.parametrize("cfg", [1.0, 3.0], ids=["distilled_cfg1", "cfg3"])
def test_klein_txt2img_matches_flux2_klein_pipeline(cfg: float, klein_dir: Any, make_ctx: Any) -> None:
    from nodes.latent.vae import VAEDecode

    torch.set_num_threads(1)
    root, modules = klein_dir
    ctx = make_ctx()
    model = open_diffusion_model(root / DEMO_KLEIN)
    clip = open_text_encoders([root / DEMO_KLEIN_QWEN3], "flux2")
    pos = CLIPTextEncode().run(ctx, text=PROMPT, clip=clip)[0]
    neg = CLIPTextEncode().run(ctx, text=NEGATIVE, clip=clip)[0]
    latent = EmptyFlux2LatentImage().run(ctx, width=SIZE, height=SIZE, batch_size=1)[0]
    sigmas = Flux2Scheduler().run(ctx, steps=STEPS, width=SIZE, height=SIZE)[0]
    sampler = KSamplerSelect().run(ctx, sampler_name="euler")[0]
    out = SamplerCustom().run(
        ctx,
        model=model,
        add_noise=True,
        noise_seed=SEED,
        cfg=cfg,
        positive=pos,
        negative=neg,
        sampler=sampler,
        sigmas=sigmas,
        latent_image=latent,
    )[0]

    pipe = _pipeline(modules)
    noise = prepare_noise(latent["samples"], SEED)
    kwargs = dict(
        prompt_embeds=pos[0].embeds,
        negative_prompt_embeds=neg[0].embeds,
        height=SIZE,
        width=SIZE,
        num_inference_steps=STEPS,
        guidance_scale=cfg,
        latents=noise.clone(),
    )
    ref = pipe(**kwargs, output_type="latent").images  # (1, 32, 8, 8): un-normalised and un-patchified
    from nodes.families.components.flux2_vae_module import patchify

    vae = modules["vae"]
    std = torch.sqrt(vae.bn.running_var + vae.config.batch_norm_eps).view(1, -1, 1, 1)
    ref_latent = (patchify(ref) - vae.bn.running_mean.view(1, -1, 1, 1)) / std
    assert out["samples"].shape == (1, 128, SIZE // 16, SIZE // 16)
    assert (out["samples"] - ref_latent).abs().max() < 1e-4
    assert (out["samples"] - noise).abs().max() > 0.1  # the model moved the latent

    image = VAEDecode().run(ctx, samples=out, vae=open_vae(root / DEMO_FLUX2_VAE))[0]
    ref_image = pipe(**kwargs, output_type="pt").images
    assert image.shape == (1, SIZE, SIZE, 3)
    assert (image - ref_image.permute(0, 2, 3, 1)).abs().max() < 1e-4


def test_klein_text_encoding_matches_the_pipeline_prompt_embeds(klein_dir: Any, make_ctx: Any) -> None:
    from diffusers import Flux2KleinPipeline

    root, modules = klein_dir
    clip = open_text_encoders([root / DEMO_KLEIN_QWEN3], "flux2")
    (entry,) = CLIPTextEncode().run(make_ctx(), text=PROMPT, clip=clip)[0]
    tokenizer = load_qwen_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    ref = Flux2KleinPipeline._get_qwen3_prompt_embeds(modules["qwen3_4b"], tokenizer, PROMPT)
    assert entry.embeds.shape == (1, 512, 3 * 16) and entry.pooled is None
    torch.testing.assert_close(entry.embeds, ref, atol=1e-5, rtol=1e-5)


def test_flux2_scheduler_equals_the_pipeline_schedule() -> None:
    """ComfyUI's Flux2Scheduler (t evenly 1 → 0, shifted by e^mu / (e^mu + 1/t − 1)) is the pipeline's
    schedule for the same size and steps, with the final 0 appended."""
    from diffusers import FlowMatchEulerDiscreteScheduler
    from diffusers.pipelines.flux2.pipeline_flux2_klein import compute_empirical_mu

    for steps, width, height in ((4, 1024, 1024), (20, 768, 1344), (50, 2048, 2048), (1, 64, 64)):
        ours = Flux2Scheduler().run(None, steps=steps, width=width, height=height)[0]  # type: ignore[arg-type]
        scheduler = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, time_shift_type="exponential")
        sigmas = torch.linspace(1.0, 1 / steps, steps).tolist()
        scheduler.set_timesteps(sigmas=sigmas, mu=compute_empirical_mu(width * height // 256, steps))
        assert ours.shape == (steps + 1,) and ours[-1] == 0.0
        torch.testing.assert_close(ours, scheduler.sigmas.float(), atol=1e-6, rtol=1e-6)
