"""Qwen-Image (and Qwen-Image-Edit): a ``QwenImageTransformer2DModel`` over 2×2-packed 16-channel latents,
text from Qwen2.5-VL-7B's language model (ComfyUI's system-prompted template, the last hidden state,
the template's head dropped), the Wan 2.1 VAE, and the Wan 2.1 latent space: per-channel mean and std,
``(latent − mean) / std`` (ComfyUI's ``latent_formats.Wan21``).

Sampling: discrete flow matching with shift 1.15 and multiplier 1 (ComfyUI's
``supported_models.QwenImage``; the model's timestep is sigma), real CFG with a negative prompt (plain
CFG as ComfyUI; diffusers' pipeline also rescales to the conditional norm, ComfyUI only with its
CFGNorm node). ComfyUI's Qwen-Image template sets shift 3.1 with ``ModelSamplingAuraFlow``.

Files as users have them: the transformer alone (``qwen_image_fp8_e4m3fn.safetensors`` /
``qwen_image_bf16.safetensors`` in ``models/diffusion_models``, diffusers' names, bare or under
``model.diffusion_model.``; UNETLoader), the text encoder alone (``qwen_2.5_vl_7b.safetensors`` in
``models/text_encoders``; CLIPLoader type ``qwen_image``; its ``visual.`` tensors, Qwen2.5-VL's vision
tower, are read only when Qwen-Image-Edit's nodes get a picture: ``nodes.family_nodes.qwen_image_edit``)
and ``qwen_image_vae.safetensors`` (the Wan layout; VAELoader).
"""

from __future__ import annotations

from nodes.families.base import EncoderClaim, TextEncoderSpec
from nodes.families.components.qwen25_text import QWEN25_FILES, Qwen25VLText, QwenImagePrompt
from nodes.families.components.qwen_image_dit import QwenImageTransformer
from nodes.families.components.wan_vae import WanVae
from nodes.families.discrete_sampling import FlowSampling
from nodes.families.dit_family import DiTFamily
from nodes.families.latent_format import WAN21_LATENT

QWEN25_7B = TextEncoderSpec(
    "qwen25_7b", "model.", "qwen25vl", "text_encoder", "qwen_tokenizer",
    default_layer=-1, final_norm=True, pooled=False, kind=Qwen25VLText(), files=QWEN25_FILES,
)  # fmt: skip


class QwenImage(DiTFamily):
    name = "qwen_image"
    title = "Qwen-Image"
    aliases = ("qwen", "wan")
    pipeline_class = "QwenImagePipeline"
    specificity = 5
    markers = ("img_in.weight", "txt_norm.weight", "transformer_blocks.0.img_mod.1.weight")
    resolution = 1328
    sampling = FlowSampling(1.15)
    latent_format = WAN21_LATENT
    denoiser = QwenImageTransformer(WAN21_LATENT)
    vae = WanVae()
    prompt = QwenImagePrompt()
    text_encoders = (QWEN25_7B,)
    context_dim = 3584  # Qwen2.5-VL-7B
    single_clip_types = ("qwen_image",)
    encoder_claims = (EncoderClaim(("qwen25_7b",), except_types=("hunyuan_image",)),)
    labels_vae_files = True  # qwen_image_vae.safetensors (the Wan 2.1 VAE)
    separate_files = (
        "the text encoder (qwen_2.5_vl_7b.safetensors) with CLIPLoader (type qwen_image) and the VAE "
        "(qwen_image_vae.safetensors) with VAELoader"
    )
