"""Flux.2 (Klein and dev): a ``Flux2Transformer2DModel`` over 128-channel latents (the 32-channel
Flux.2 VAE's latent in 2×2 patches, BatchNorm-normalised: ComfyUI's ``latent_formats.Flux2``, scale 1,
shift 0), text from stacked LLM hidden states, sampled as ComfyUI's ``supported_models.Flux2``:
``ModelSamplingFlux`` with shift (mu) 2.02, the timestep is sigma; ComfyUI's templates replace the
schedule with ``Flux2Scheduler`` (mu from the image size and step count).

Klein and dev share the key layout (diffusers cannot tell them apart); Loom tells them by tensors:
dev has the guidance embedder (``guidance_in``, FluxGuidance sets the value) and a 15360-wide text
input (Mistral-Small 3.x, layers 10/20/30); Klein has no guidance embedder and takes Qwen3's layers
9/18/27 (7680 wide for Qwen3-4B, 12288 for Qwen3-8B).

Files as users have them: the transformer alone (``flux-2-klein-4b.safetensors`` in
``models/diffusion_models``, with or without ``model.diffusion_model.``; UNETLoader), the text encoder
alone (``qwen_3_4b.safetensors`` for Klein, ``mistral_3_small_flux2_bf16.safetensors`` with its tekken
tokenizer inside for dev; CLIPLoader type ``flux2``) and ``flux2-vae.safetensors`` (VAELoader); and
ComfyUI-saved Klein checkpoints (CheckpointLoaderSimple: ``model.diffusion_model.``,
``text_encoders.qwen3_4b.transformer.model.``, ``vae.``).
"""

from __future__ import annotations

from nodes.core.tensors import TensorIndex
from nodes.families.base import EncoderClaim, TextEncoderSpec
from nodes.families.components.flux2_dit import Flux2Transformer
from nodes.families.components.flux2_vae import Flux2Vae
from nodes.families.components.klein_text import Flux2Prompt, KleinText
from nodes.families.components.mistral_text import MISTRAL3_FILES, MistralText
from nodes.families.components.qwen_text import QWEN3_FILES
from nodes.families.discrete_sampling import FlowSampling
from nodes.families.dit_family import Checkpoint, DiTFamily
from nodes.families.latent_format import FLUX2_LATENT

QWEN3 = TextEncoderSpec(
    "qwen3_4b", "model.", "qwen3", "text_encoder", "qwen_tokenizer",
    default_layer=-1, final_norm=False, pooled=False, kind=KleinText(), files=QWEN3_FILES,
)  # fmt: skip
MISTRAL3 = TextEncoderSpec(
    "mistral3_24b", "model.", "mistral3", "text_encoder", "tekken",
    default_layer=-1, final_norm=False, pooled=False, kind=MistralText(), files=MISTRAL3_FILES,
)  # fmt: skip
GUIDANCE = "guidance_in.in_layer.weight"  # dev's guidance embedder


class Flux2(DiTFamily):
    name = "flux2"
    title = "Flux.2"
    aliases = ("klein", "mistral")
    pipeline_class = "Flux2KleinPipeline"
    specificity = 9  # its transformers have Flux.1's marker tensors too
    markers = ("double_stream_modulation_img.lin.weight", "img_in.weight")  # one modulation per stream
    prediction = "flux"
    sampling = FlowSampling(2.02, schedule="flux")  # ComfyUI's supported_models.Flux2
    latent_format = FLUX2_LATENT
    denoiser = Flux2Transformer()
    vae = Flux2Vae()
    prompt = Flux2Prompt()
    text_encoders = (QWEN3, MISTRAL3)
    context_dim = 7680  # Klein 4B: 3 × Qwen3-4B's 2560
    single_clip_types = ("flux2",)
    encoder_claims = (EncoderClaim(("qwen3_4b", "mistral3_24b"), clip_types=("flux", "flux2")),)
    labels_vae_files = True  # flux2-vae.safetensors
    checkpoint = Checkpoint(
        ("vae.",),
        ((QWEN3.name, "text_encoders.qwen3_4b.transformer.model."),),
        denoiser_prefix="model.diffusion_model.",
    )
    separate_files = (
        "the text encoder (qwen_3_4b.safetensors for Klein, the Mistral-Small file for dev) with CLIPLoader "
        "(type flux2) and the VAE (flux2-vae.safetensors) with VAELoader"
    )


def variant(index: TensorIndex) -> str:
    """``dev`` (guidance-distilled, Mistral text) or ``klein`` (Qwen3 text)."""
    return "dev" if index.has(f"{Flux2.transformer_prefix(index) or ''}{GUIDANCE}") else "klein"
