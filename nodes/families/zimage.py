"""Z-Image (Turbo): a ``ZImageTransformer2DModel`` over 16-channel latents in 2×2 patches, text from
Qwen3-4B (the chat template, the second-to-last layer's hidden states, every token, no padding), the
Flux VAE and latent space (scale 0.3611, shift 0.1159: ComfyUI's Z-Image uses ``latent_formats.Flux``).

Sampling: discrete flow matching with shift 3 and multiplier 1 (ComfyUI's ``supported_models.ZImage``:
``ModelSamplingDiscreteFlow``, the model's timestep is sigma itself); the transformer kind turns it
into t = 1 − sigma and negates the output. ComfyUI's Z-Image Turbo template sets the same shift with
``ModelSamplingAuraFlow`` and samples 8 steps of ``res_multistep`` / ``simple`` at cfg 1, with the
negative prompt zeroed (``ConditioningZeroOut``).

Files as users have them: the transformer alone (``z_image_turbo_bf16.safetensors`` in
``models/diffusion_models``, keys with or without ``model.diffusion_model.``; UNETLoader), the text
encoder alone (``qwen_3_4b.safetensors`` in ``models/text_encoders``; CLIPLoader with type
``lumina2``, as ComfyUI's template) and the Flux ``ae.safetensors`` (VAELoader).
"""

from __future__ import annotations

from nodes.families.base import EncoderClaim, TextEncoderSpec
from nodes.families.components.qwen_text import QWEN3_FILES, QwenText, ZImagePrompt
from nodes.families.components.zimage_dit import ZImageTransformer
from nodes.families.discrete_sampling import FlowSampling
from nodes.families.dit_family import DiTFamily
from nodes.families.latent_format import FLUX_LATENT

QWEN3_4B = TextEncoderSpec(
    "qwen3_4b", "model.", "qwen3", "text_encoder", "qwen_tokenizer",
    default_layer=-2, final_norm=False, pooled=False, kind=QwenText(), files=QWEN3_FILES,
)  # fmt: skip


class ZImage(DiTFamily):
    name = "z_image"  # as in the presets table (nodes/load/presets.py)
    title = "Z-Image"
    aliases = ("lumina",)  # ComfyUI loads its text encoder as Lumina 2's (CLIPLoader type lumina2)
    pipeline_class = "ZImagePipeline"
    specificity = 6
    # Z-Image's blocks take their modulation from adaLN_modulation.0 (Lumina 2's from .1)
    markers = ("x_embedder.weight", "cap_embedder.1.weight", "layers.0.adaLN_modulation.0.weight")
    sampling = FlowSampling(3.0)
    latent_format = FLUX_LATENT
    denoiser = ZImageTransformer()
    prompt = ZImagePrompt()
    text_encoders = (QWEN3_4B,)
    context_dim = 2560  # Qwen3-4B
    single_clip_types = ("lumina2",)
    # a Qwen3-4B file is Z-Image's for every type but flux/flux2 (ComfyUI routes it to Flux.2 Klein there)
    encoder_claims = (EncoderClaim(("qwen3_4b",), except_types=("flux", "flux2")),)
    separate_files = (
        "the text encoder (qwen_3_4b.safetensors) with CLIPLoader (type lumina2) and the VAE "
        "(ae.safetensors) with VAELoader"
    )
