"""The shared setup of the DiT parity tests: the tiny SD3 and Flux demo components written as the
files Loom loads, Loom's txt2img through KSampler (for the ControlNet tests with an apply step), and
diffusers' SD3 and Flux pipelines (plain or with a ControlNet) on the same modules, noise and sigmas.
Used by ``test_sd3_pipeline.py``, ``test_flux_pipeline.py``, ``test_controlnet_dit.py``,
``test_controlnet_sd35.py`` and ``test_controlnet_inpaint_dit.py``.

Both sides of a ControlNet test encode the control image with the VAE; diffusers samples the posterior
and ComfyUI takes its mean, so the tiny VAEs there get a posterior of width ~3e-7 (log-variance biased
to the clamp).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from nodes.diffusion.noise import prepare_noise
from nodes.encode.conditioning import CLIPTextEncode
from nodes.family_nodes.flux_nodes import EmptySD3LatentImage, FluxGuidance, ModelSamplingFlux
from nodes.load.handles import open_diffusion_model, open_text_encoders
from nodes.sample.ksampler import KSampler

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


def apply_control(
    ctx: Any,
    node: type,
    net: Any,
    vae: Any,
    image: torch.Tensor,
    strength: float,
    start: float = 0.0,
    **inputs: Any,
) -> Apply:
    """A ControlNet apply ``node`` (``ControlNetApplyAdvanced``, ``ControlNetApplySD3``,
    ``ControlNetInpaintingAliMamaApply``) with ``net``, ``vae`` and ``image`` from ``start`` to the end
    as the step between the prompts and the sampler; ``inputs``: the node's further inputs (``mask``)."""
    return lambda pos, neg: node().run(
        ctx,
        positive=pos,
        negative=neg,
        control_net=net,
        vae=vae,
        image=image,
        strength=strength,
        start_percent=start,
        end_percent=1.0,
        **inputs,
    )


def sample(ctx: Any, model: Any, pos: Any, neg: Any, cfg: float, scheduler: str, batch: int = 1) -> Any:
    """Loom's KSampler (SEED, STEPS, euler, full denoise) from an empty SD3/Flux latent: its LATENT."""
    latent = EmptySD3LatentImage().run(ctx, width=SIZE, height=SIZE, batch_size=batch)[0]
    return KSampler().run(
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


def _sample(ctx: Any, model: Any, pos: Any, neg: Any, cfg: float, scheduler: str, batch: int) -> torch.Tensor:
    return model.latent_format.process_in(sample(ctx, model, pos, neg, cfg, scheduler, batch)["samples"])


# --- SD3 ------------------------------------------------------------------------------------------
def write_sd3(root: Path, adjust: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """The tiny SD3 demo modules (sharp VAE posterior, then ``adjust``) written under ``root``."""
    from nodes.demo.sd3 import demo_sd3_modules, sd3_files

    torch.set_num_threads(1)
    modules = demo_sd3_modules()
    sharp_posterior(modules["vae"])
    if adjust is not None:
        adjust(modules)
    for name, tensors in sd3_files(modules).items():
        save(root / name, tensors)
    return modules


def write_sd3_with_controlnet(root: Path, net: Any, folder: str) -> dict[str, Any]:
    """The tiny SD3 files (``write_sd3``) and the diffusers-layout ControlNet ``net`` saved in ``folder``
    under ``root``: ``root``, ``modules``, ``net`` and ``cn`` (the ControlNet's weights file)."""
    modules = write_sd3(root)
    net.save_pretrained(root / folder)
    return {
        "root": root,
        "modules": modules,
        "net": net,
        "cn": root / folder / "diffusion_pytorch_model.safetensors",
    }


def sd3_clip(root: Path) -> Any:
    """The SD3 text encoders (CLIP-L, CLIP-G, T5-XXL) from the demo files under ``root``."""
    from nodes.demo.sd3 import DEMO_SD3_CLIP_G, DEMO_SD3_CLIP_L, DEMO_SD3_T5XXL

    return open_text_encoders([root / DEMO_SD3_CLIP_L, root / DEMO_SD3_CLIP_G, root / DEMO_SD3_T5XXL], "sd3")


def sd3_run(ctx: Any, root: Path, apply: Apply | None, latent_batch: int = 1) -> tuple[Any, Any, Any]:
    """Loom's txt2img on the SD3 files under ``root`` (cfg 4, euler, normal), the prompts' conditioning
    through ``apply``: (model-space latent, positive, negative)."""
    from nodes.demo.sd3 import DEMO_SD3_MMDIT

    model = open_diffusion_model(root / DEMO_SD3_MMDIT)
    clip = sd3_clip(root)
    pos = CLIPTextEncode().run(ctx, text="a photo of a cat", clip=clip)[0]
    neg = CLIPTextEncode().run(ctx, text="blurry", clip=clip)[0]
    cpos, cneg = apply(pos, neg) if apply is not None else (pos, neg)
    return _sample(ctx, model, cpos, cneg, 4.0, "normal", latent_batch), pos, neg


def clip_l_with_identity_projection(clip_l: Any) -> Any:
    """CLIP-L as diffusers' pipeline wants it (with a projection), the projection the identity."""
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection

    cfg = CLIPTextConfig(**(clip_l.config.to_dict() | {"projection_dim": clip_l.config.hidden_size}))
    model = CLIPTextModelWithProjection(cfg).eval()
    model.text_model.load_state_dict(clip_l.state_dict())
    with torch.no_grad():
        model.text_projection.weight.copy_(torch.eye(cfg.hidden_size))
    return model


def sd3_pipeline(modules: dict[str, Any], net: Any = None, cls: Any = None) -> Any:
    """diffusers' SD3 pipeline on the tiny modules: ``cls``, by default ``StableDiffusion3Pipeline``,
    or with a ControlNet ``net`` ``StableDiffusion3ControlNetPipeline``."""
    from diffusers import (
        FlowMatchEulerDiscreteScheduler,
        StableDiffusion3ControlNetPipeline,
        StableDiffusion3Pipeline,
    )

    from nodes.families.components.clip_text import load_tokenizer
    from nodes.families.components.t5_text import load_t5_tokenizer

    control = {} if net is None else {"controlnet": net}
    pipe: Any = (cls or (StableDiffusion3Pipeline if net is None else StableDiffusion3ControlNetPipeline))(
        transformer=modules["unet"],
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
        vae=modules["vae"],
        text_encoder=clip_l_with_identity_projection(modules["clip_l"]),
        tokenizer=load_tokenizer("clip_tokenizer"),
        text_encoder_2=modules["clip_g"],
        tokenizer_2=load_tokenizer("clip_tokenizer_2"),
        text_encoder_3=modules["t5xxl"],
        tokenizer_3=load_t5_tokenizer(),
        **control,
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def sd3_pipeline_output(
    pipe: Any, pos: Any, neg: Any, cfg: float = 4.0, output_type: str = "latent", **control: Any
) -> Any:
    """The SD3 pipeline's final latent (or image, by ``output_type``) for Loom's prompts, noise and
    schedule at guidance ``cfg``; ``control``: its ControlNet arguments."""
    return pipe(
        prompt_embeds=pos[0].embeds,
        pooled_prompt_embeds=pos[0].pooled,
        negative_prompt_embeds=neg[0].embeds,
        negative_pooled_prompt_embeds=neg[0].pooled,
        height=SIZE,
        width=SIZE,
        num_inference_steps=STEPS,
        guidance_scale=cfg,
        latents=noise(),
        output_type=output_type,
        **control,
    ).images


def sd3_pipeline_latent(pipe: Any, pos: Any, neg: Any, strength: float, start: float, **control: Any) -> Any:
    """The ControlNet pipeline's final latent for Loom's prompts, noise and schedule; ``control``: its
    control image arguments."""
    return sd3_pipeline_output(
        pipe,
        pos,
        neg,
        controlnet_conditioning_scale=strength,
        control_guidance_start=start,
        control_guidance_end=1.0,
        **control,
    )


# --- Flux -----------------------------------------------------------------------------------------
def write_flux(root: Path) -> dict[str, Any]:
    """The tiny Flux dev demo modules (sharp VAE posterior) written under ``root``."""
    from nodes.demo.flux import demo_flux_modules, flux_files

    torch.set_num_threads(1)
    modules = demo_flux_modules(guidance=True)
    sharp_posterior(modules["vae"])
    for name, tensors in flux_files(modules).items():
        save(root / name, tensors)
    return modules


def flux_model_and_clip(ctx: Any, root: Path, model_file: str) -> tuple[Any, Any]:
    """The Flux model ``model_file`` under ``root`` with ModelSamplingFlux's shift for the test size,
    and the Flux text encoders (T5-XXL, CLIP-L) of the demo files."""
    from nodes.demo.flux import DEMO_CLIP_L, DEMO_T5XXL

    model = ModelSamplingFlux().run(
        ctx,
        model=open_diffusion_model(root / model_file),
        max_shift=1.15,
        base_shift=0.5,
        width=SIZE,
        height=SIZE,
    )[0]
    return model, open_text_encoders([root / DEMO_T5XXL, root / DEMO_CLIP_L], "flux")


def flux_run(ctx: Any, root: Path, apply: Apply | None, latent_batch: int = 1) -> tuple[Any, Any]:
    """Loom's Flux dev txt2img on the files under ``root`` (guidance 4, cfg 1, euler, simple), the
    conditioning through ``apply``: (model-space latent, conditioning)."""
    from nodes.demo.flux import DEMO_FLUX_DEV

    model, clip = flux_model_and_clip(ctx, root, DEMO_FLUX_DEV)
    cond = FluxGuidance().run(
        ctx, conditioning=CLIPTextEncode().run(ctx, text="a cat", clip=clip)[0], guidance=4.0
    )[0]
    pos, neg = apply(cond, cond) if apply is not None else (cond, cond)
    return _sample(ctx, model, pos, neg, 1.0, "simple", latent_batch), cond


def flux_pipeline(modules: dict[str, Any], net: Any = None) -> Any:
    """diffusers' ``FluxPipeline`` on the tiny modules, or with a ControlNet ``net``
    ``FluxControlNetPipeline``; its scheduler shifts dynamically as ModelSamplingFlux."""
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxControlNetPipeline, FluxPipeline

    from nodes.families.components.clip_text import load_tokenizer
    from nodes.families.components.t5_text import load_t5_tokenizer

    control = {} if net is None else {"controlnet": net}
    sched = FlowMatchEulerDiscreteScheduler(
        shift=1.0,
        use_dynamic_shifting=True,
        base_shift=0.5,
        max_shift=1.15,
        base_image_seq_len=256,
        max_image_seq_len=4096,
    )
    pipe: Any = (FluxPipeline if net is None else FluxControlNetPipeline)(
        scheduler=sched,
        vae=modules["vae"],
        text_encoder=modules["clip_l"],
        tokenizer=load_tokenizer("clip_tokenizer"),
        text_encoder_2=modules["t5xxl"],
        tokenizer_2=load_t5_tokenizer(),
        transformer=modules["unet"],
        **control,
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def flux_pipeline_output(pipe: Any, cond: Any, output_type: str = "latent", **control: Any) -> torch.Tensor:
    """The Flux pipeline's output for Loom's conditioning, noise and schedule (guidance 4): the final
    latent unpacked, or the image for ``output_type="pt"``; ``control``: its ControlNet arguments."""
    out = pipe(
        prompt_embeds=cond[0].embeds,
        pooled_prompt_embeds=cond[0].pooled,
        height=SIZE,
        width=SIZE,
        num_inference_steps=STEPS,
        guidance_scale=4.0,
        latents=pipe._pack_latents(noise(), 1, 16, SIZE // 8, SIZE // 8),
        output_type=output_type,
        **control,
    ).images
    return pipe._unpack_latents(out, SIZE, SIZE, pipe.vae_scale_factor) if output_type == "latent" else out


def flux_pipeline_latent(modules: dict[str, Any], cond: Any, net: Any, **control: Any) -> torch.Tensor:
    """diffusers' ``FluxControlNetPipeline`` with ``net`` on the tiny modules, Loom's conditioning,
    noise and schedule: the final latent unpacked; ``control``: its control arguments."""
    return flux_pipeline_output(flux_pipeline(modules, net), cond, **control)
