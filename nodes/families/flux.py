"""Flux.1 dev and schnell: a ``FluxTransformer2DModel`` over 2×2-packed 16-channel latents, text
from T5-XXL (tokens, padded to 256 as ComfyUI does) and CLIP-L (its pooled vector only), the
16-channel KL VAE with scale 0.3611 and shift 0.1159 (ComfyUI's ``latent_formats.Flux``).

dev is guidance-distilled (a ``guidance_in`` embedder; FluxGuidance sets the value, 3.5 when
unset) and samples with ComfyUI's ``ModelSamplingFlux`` (Flux's exponential time shift, mu 1.15 by
default, set from the image size by the ModelSamplingFlux node); schnell has no guidance embedder
and samples with plain flow matching (ComfyUI's ``ModelSamplingDiscreteFlow``, shift 1, timestep =
sigma). Both take the timestep as sigma (see the transformer kind).

Files: ComfyUI's all-in-one checkpoints (``model.diffusion_model.*``, ``text_encoders.clip_l.*``,
``text_encoders.t5xxl.*``, the VAE under ``first_stage_model.`` or ``vae.``), and the separate files
users have: the transformer (BFL ``flux1-dev.safetensors``, with or without the prefix), the text
encoders (``clip_l.safetensors``, ``t5xxl_*.safetensors``) and ``ae.safetensors``.
"""

from __future__ import annotations

from dataclasses import replace

from nodes.families.base import TextEncoderSpec
from nodes.families.components.clip_text import CLIP_L_FILES
from nodes.families.components.flux_dit import FluxTransformer
from nodes.families.components.flux_text import FluxPrompt
from nodes.families.components.t5_text import T5_FILES, T5Text
from nodes.families.discrete_sampling import FlowSampling, PerPrediction
from nodes.families.dit_family import Checkpoint, DiTFamily
from nodes.families.latent_format import FLUX_LATENT

CLIP_L = TextEncoderSpec(
    "clip_l", "text_encoders.clip_l.transformer.text_model.", "hf_clip", "text_encoder", "clip_tokenizer",
    default_layer=-1, final_norm=True, pooled=True, files=CLIP_L_FILES,
)  # fmt: skip
T5XXL = TextEncoderSpec(
    "t5xxl", "text_encoders.t5xxl.transformer.", "t5", "text_encoder_2", "t5_tokenizer",
    default_layer=-1, final_norm=True, pooled=False, kind=T5Text(min_length=256), files=T5_FILES,
)  # fmt: skip
MARKERS = ("double_blocks.0.img_attn.qkv.weight", "img_in.weight")
APPROXIMATOR = "distilled_guidance_layer.in_proj.weight"  # Chroma's modulation
VAE_PREFIXES = ("first_stage_model.", "vae.")


class FluxBlocks(DiTFamily):
    """What the families built on Flux.1's blocks share (not a family: it has no name)."""

    architecture = "Flux"
    sampling = PerPrediction({"flux": FlowSampling(1.15, schedule="flux"), "flow": FlowSampling(1.0)})
    latent_format = FLUX_LATENT
    prompt = FluxPrompt()
    context_dim = 4096  # T5-XXL
    vae_needed = "the 16-channel Flux VAE (ae.safetensors)"


class Flux(FluxBlocks):
    name = "flux"
    title = "Flux.1"
    aliases = ("kontext",)
    pipeline_class = "FluxPipeline"
    specificity = 7
    markers = MARKERS
    absent_markers = (APPROXIMATOR,)
    prediction, prediction_markers = "flow", (("guidance_in.in_layer.weight", "flux"),)  # schnell, dev
    denoiser = FluxTransformer(latent_format=FLUX_LATENT)
    text_encoders = (CLIP_L, T5XXL)
    dual_clip_types = ("flux",)
    labels_vae_files = True  # ae.safetensors
    checkpoint = Checkpoint(VAE_PREFIXES, ((CLIP_L.name, CLIP_L.prefix), (T5XXL.name, T5XXL.prefix)))
    separate_files = (
        "the text encoders with DualCLIPLoader (type flux) and the VAE (ae.safetensors) with VAELoader"
    )


class Chroma(FluxBlocks):
    """Chroma (Flux.1-schnell derived): the Flux blocks with one modulation approximator
    (``distilled_guidance_layer``) instead of per-block modulation, T5-XXL only (no CLIP-L, no
    pooled vector; ComfyUI does not pad its T5 tokens: min_length 1), real CFG with a negative
    prompt, ModelSamplingFlux with mu 1.15, the Flux VAE.

    Test-size note: ComfyUI always builds 344 modulation rows and takes the final layer's from the
    last two; diffusers (and so Loom) builds 3·single + 12·double + 2. They agree at the real depth
    (19 + 38 blocks), not for reduced-depth test models."""

    name = "chroma"
    title = "Chroma"
    pipeline_class = "ChromaPipeline"
    specificity = 8
    markers = (*MARKERS, APPROXIMATOR)
    prediction = "flux"
    denoiser = FluxTransformer(approximator=True, latent_format=FLUX_LATENT)
    text_encoders = (replace(T5XXL, kind=T5Text(min_length=1)),)
    single_clip_types = ("chroma",)
    checkpoint = Checkpoint(VAE_PREFIXES, ((T5XXL.name, T5XXL.prefix),))
    separate_files = (
        "the text encoder (t5xxl) with CLIPLoader (type chroma) and the VAE (ae.safetensors) with VAELoader"
    )
