"""Wan 2.1 (text-to-video 1.3B and 14B, image-to-video 14B): a
``WanTransformer3DModel`` over 5-D video latents (B, 16, frames, H/8, W/8) in 1×2×2 patches, text from
umt5-xxl (its hidden states, zero-padded to 512 tokens), the Wan 2.1 VAE, and the Wan 2.1 latent space
(ComfyUI's ``latent_formats.Wan21``: per-channel mean and std, shared with Qwen-Image).

Sampling: discrete flow matching with shift 8.0 and multiplier 1000 (ComfyUI's
``supported_models.WAN21_T2V``; the model's timestep is sigma·1000), real CFG with a negative prompt;
ComfyUI's Wan templates set their own shift with ``ModelSamplingSD3`` (8.0 as well).

Image-to-video: WanImageToVideo (and its siblings) put the start frames' latents, the frame mask and
CLIPVisionEncode's output on the conditioning; the transformer kind turns them into the model's 20
extra input channels and its image tokens as ComfyUI's ``WAN21`` model does
(:mod:`nodes.families.components.wan_i2v`).

Files as users have them: the transformer alone in the original Wan layout
(``wan2.1_t2v_1.3B_fp16.safetensors``, ``wan2.1_t2v_14B_fp8_e4m3fn.safetensors``,
``wan2.1_i2v_480p_14B_*.safetensors`` in ``models/diffusion_models``, bare or under
``model.diffusion_model.``; UNETLoader), the text encoder alone (``umt5_xxl_fp8_e4m3fn_scaled.safetensors``
in ``models/text_encoders``; CLIPLoader type ``wan``) and ``wan_2.1_vae.safetensors`` (VAELoader).
Variants Loom does not build yet (VACE, Fun, Camera, FLF2V, Wan 2.2 TI2V 5B with its 48-channel
latents, S2V, HuMo, Animate) are refused by the transformer kind with a message naming them.
"""

from __future__ import annotations

from nodes.families.components.umt5_text import UMT5_XXL, UMT5Prompt
from nodes.families.components.wan_dit import MARKERS, WanTransformer
from nodes.families.components.wan_vae import WanVae
from nodes.families.discrete_sampling import FlowSampling
from nodes.families.dit_family import DiTFamily
from nodes.families.latent_format import WAN21_VIDEO_LATENT


class Wan21(DiTFamily):
    name = "wan21"
    title = "Wan 2.1"
    pipeline_class = "WanPipeline"
    specificity = 5
    markers = MARKERS
    resolution = 832  # ComfyUI's Wan 2.1 templates: 832 × 480
    sampling = FlowSampling(8.0, multiplier=1000.0)
    latent_format = WAN21_VIDEO_LATENT
    denoiser = WanTransformer()
    vae = WanVae()
    prompt = UMT5Prompt()
    text_encoders = (UMT5_XXL,)
    context_dim = 4096  # umt5-xxl
    single_clip_types = ("wan",)
    architecture = "Wan 2.1"
    separate_files = (
        "the text encoder (umt5_xxl_fp8_e4m3fn_scaled.safetensors) with CLIPLoader (type wan) and the VAE "
        "(wan_2.1_vae.safetensors) with VAELoader"
    )
