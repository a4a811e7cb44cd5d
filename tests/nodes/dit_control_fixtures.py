"""The shared setup of the DiT ControlNet parity tests (``test_controlnet_dit.py``,
``test_controlnet_sd35.py``, ``test_controlnet_inpaint_dit.py``): the tiny SD3 and Flux demo
components written as the files Loom loads, Loom's txt2img through KSampler with a ControlNet apply
step, and diffusers' ControlNet pipelines on the same modules, noise and sigmas.

Both sides encode the control image with the VAE; diffusers samples the posterior and ComfyUI takes
its mean, so the tiny VAEs here get a posterior of width ~3e-7 (log-variance biased to the clamp).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from nodes.conditioning import CLIPTextEncode
from nodes.diffusion.noise import prepare_noise
from nodes.families.flux_nodes import EmptySD3LatentImage, FluxGuidance, ModelSamplingFlux
from nodes.handles import open_diffusion_model, open_text_encoders
from nodes.sampling import KSampler

SIZE, STEPS, SEED = 64, 4, 42
Apply = Callable[[Any, Any], tuple[Any, Any]]  # (positive, negative) -> the same with a control


def save(path: Path, tensors: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))
    return path


def sharp_posterior(vae: Any) -> Any:
    """``vae`` with a posterior so narrow that diffusers' sample equals ComfyUI's mean."""
    with torch.no_grad():
        vae.encoder.conv_out.bias[vae.config.latent_channels :] = -100.0
    return vae


def control_image(batch: int = 1, seed: int = 5) -> torch.Tensor:
    """A random IMAGE (B, H, W, 3) in 0..1 at the test size."""
    return torch.rand(batch, SIZE, SIZE, 3, generator=torch.Generator().manual_seed(seed))


def noise() -> torch.Tensor:
    """The initial noise both sides start from (Loom's for SEED, as a diffusers latent)."""
    return prepare_noise(torch.zeros(1, 16, SIZE // 8, SIZE // 8), SEED)


def _sample(ctx: Any, model: Any, pos: Any, neg: Any, cfg: float, scheduler: str, batch: int) -> torch.Tensor:
    latent = EmptySD3LatentImage().run(ctx, width=SIZE, height=SIZE, batch_size=batch)[0]
    out = KSampler().run(
        ctx,
        model=model,
        seed=SEED,
        steps=STEPS,
        cfg=cfg,
        sampler_name="euler",
        scheduler=scheduler,
        positive=pos,
        negative=neg,
        latent_image=latent,
        denoise=1.0,
    )[0]
    return model.latent_format.process_in(out["samples"])


# --- SD3 ------------------------------------------------------------------------------------------
def write_sd3(root: Path, adjust: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """The tiny SD3 demo modules (sharp VAE posterior, then ``adjust``) written under ``root``."""
    from nodes.demo_sd3 import demo_sd3_modules, sd3_files

    torch.set_num_threads(1)
    modules = demo_sd3_modules()
    sharp_posterior(modules["vae"])
    if adjust is not None:
        adjust(modules)
    for name, tensors in sd3_files(modules).items():
        save(root / name, tensors)
    return modules


def sd3_run(ctx: Any, root: Path, apply: Apply | None, latent_batch: int = 1) -> tuple[Any, Any, Any]:
    """Loom's txt2img on the SD3 files under ``root`` (cfg 4, euler, normal), the prompts' conditioning
    through ``apply``: (model-space latent, positive, negative)."""
    from nodes.demo_sd3 import DEMO_SD3_CLIP_G, DEMO_SD3_CLIP_L, DEMO_SD3_MMDIT, DEMO_SD3_T5XXL

    model = open_diffusion_model(root / DEMO_SD3_MMDIT)
    clip = open_text_encoders([root / DEMO_SD3_CLIP_L, root / DEMO_SD3_CLIP_G, root / DEMO_SD3_T5XXL], "sd3")
    pos = CLIPTextEncode().run(ctx, text="a photo of a cat", clip=clip)[0]
    neg = CLIPTextEncode().run(ctx, text="blurry", clip=clip)[0]
    cpos, cneg = apply(pos, neg) if apply is not None else (pos, neg)
    return _sample(ctx, model, cpos, cneg, 4.0, "normal", latent_batch), pos, neg


def sd3_pipeline(modules: dict[str, Any], net: Any, cls: Any = None) -> Any:
    """diffusers' SD3 ControlNet pipeline (``cls``, default ``StableDiffusion3ControlNetPipeline``)
    on the tiny modules with ``net``."""
    from diffusers import FlowMatchEulerDiscreteScheduler, StableDiffusion3ControlNetPipeline

    from nodes.families.components.clip_text import load_tokenizer
    from nodes.families.components.t5_text import load_t5_tokenizer
    from tests.nodes.test_sd3_pipeline import clip_l_with_identity_projection

    pipe: Any = (cls or StableDiffusion3ControlNetPipeline)(
        transformer=modules["unet"],
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
        vae=modules["vae"],
        text_encoder=clip_l_with_identity_projection(modules["clip_l"]),
        tokenizer=load_tokenizer("clip_tokenizer"),
        text_encoder_2=modules["clip_g"],
        tokenizer_2=load_tokenizer("clip_tokenizer_2"),
        text_encoder_3=modules["t5xxl"],
        tokenizer_3=load_t5_tokenizer(),
        controlnet=net,
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def sd3_pipeline_latent(pipe: Any, pos: Any, neg: Any, strength: float, start: float, **control: Any) -> Any:
    """The pipeline's final latent for Loom's prompts, noise and schedule; ``control``: its control
    image arguments."""
    return pipe(
        prompt_embeds=pos[0].embeds,
        pooled_prompt_embeds=pos[0].pooled,
        negative_prompt_embeds=neg[0].embeds,
        negative_pooled_prompt_embeds=neg[0].pooled,
        height=SIZE,
        width=SIZE,
        num_inference_steps=STEPS,
        guidance_scale=4.0,
        latents=noise(),
        controlnet_conditioning_scale=strength,
        control_guidance_start=start,
        control_guidance_end=1.0,
        output_type="latent",
        **control,
    ).images


# --- Flux -----------------------------------------------------------------------------------------
def write_flux(root: Path) -> dict[str, Any]:
    """The tiny Flux dev demo modules (sharp VAE posterior) written under ``root``."""
    from nodes.demo_flux import demo_flux_modules, flux_files

    torch.set_num_threads(1)
    modules = demo_flux_modules(guidance=True)
    sharp_posterior(modules["vae"])
    for name, tensors in flux_files(modules).items():
        save(root / name, tensors)
    return modules


def flux_run(ctx: Any, root: Path, apply: Apply | None, latent_batch: int = 1) -> tuple[Any, Any]:
    """Loom's Flux dev txt2img on the files under ``root`` (guidance 4, cfg 1, euler, simple), the
    conditioning through ``apply``: (model-space latent, conditioning)."""
    from nodes.demo_flux import DEMO_CLIP_L, DEMO_FLUX_DEV, DEMO_T5XXL

    model = open_diffusion_model(root / DEMO_FLUX_DEV)
    model = ModelSamplingFlux().run(
        ctx, model=model, max_shift=1.15, base_shift=0.5, width=SIZE, height=SIZE
    )[0]
    clip = open_text_encoders([root / DEMO_T5XXL, root / DEMO_CLIP_L], "flux")
    cond = FluxGuidance().run(
        ctx, conditioning=CLIPTextEncode().run(ctx, text="a cat", clip=clip)[0], guidance=4.0
    )[0]
    pos, neg = apply(cond, cond) if apply is not None else (cond, cond)
    return _sample(ctx, model, pos, neg, 1.0, "simple", latent_batch), cond


def flux_pipeline_latent(modules: dict[str, Any], cond: Any, net: Any, **control: Any) -> torch.Tensor:
    """diffusers' ``FluxControlNetPipeline`` with ``net`` on the tiny modules, Loom's conditioning,
    noise and schedule: the final latent unpacked; ``control``: its control arguments."""
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxControlNetPipeline

    from nodes.families.components.clip_text import load_tokenizer
    from nodes.families.components.t5_text import load_t5_tokenizer

    sched = FlowMatchEulerDiscreteScheduler(
        shift=1.0,
        use_dynamic_shifting=True,
        base_shift=0.5,
        max_shift=1.15,
        base_image_seq_len=256,
        max_image_seq_len=4096,
    )
    pipe: Any = FluxControlNetPipeline(
        scheduler=sched,
        vae=modules["vae"],
        text_encoder=modules["clip_l"],
        tokenizer=load_tokenizer("clip_tokenizer"),
        text_encoder_2=modules["t5xxl"],
        tokenizer_2=load_t5_tokenizer(),
        transformer=modules["unet"],
        controlnet=net,
    )
    pipe.set_progress_bar_config(disable=True)
    packed = pipe._pack_latents(noise(), 1, 16, SIZE // 8, SIZE // 8)
    ref = pipe(
        prompt_embeds=cond[0].embeds,
        pooled_prompt_embeds=cond[0].pooled,
        height=SIZE,
        width=SIZE,
        num_inference_steps=STEPS,
        guidance_scale=4.0,
        latents=packed,
        output_type="latent",
        **control,
    ).images
    return pipe._unpack_latents(ref, SIZE, SIZE, pipe.vae_scale_factor)
