"""SD3 medium, SD3.5 large and SD3.5 medium: an ``SD3Transformer2DModel`` (MMDiT; MMDiT-X for 3.5
medium) on the 16-channel SD3 latent (ComfyUI's ``latent_formats.SD3``: scale 1.5305, shift
0.0609), text from CLIP-L, CLIP-G and T5-XXL (``components.sd3_text``: ComfyUI's ``sd3_clip.py``
recipe), flow matching with ComfyUI's ``ModelSamplingDiscreteFlow`` (shift 3.0, timestep =
1000·sigma), real CFG.

Files: SAI/ComfyUI all-in-one checkpoints (``model.diffusion_model.*``,
``text_encoders.{clip_l,clip_g,t5xxl}.transformer.*`` — any subset —, ``first_stage_model.*``), the
transformer alone (``models/diffusion_models``) and the text encoders alone (``clip_l``, ``clip_g``
with ``text_model.*`` + ``text_projection.weight``, ``t5xxl``).
"""

from __future__ import annotations

from nodes.families.base import TextEncoderSpec
from nodes.families.components.clip_text import CLIP_G_FILES, CLIP_L_FILES
from nodes.families.components.sd3_dit import SD3Transformer
from nodes.families.components.sd3_text import NestedClipText, SD3Prompt
from nodes.families.components.t5_text import T5_FILES, T5Text
from nodes.families.discrete_sampling import FlowSampling, PerPrediction
from nodes.families.dit_family import Checkpoint, DiTFamily
from nodes.families.latent_format import SD3_LATENT

CLIP_L = TextEncoderSpec(
    "clip_l", "text_encoders.clip_l.transformer.text_model.", "hf_clip", "text_encoder", "clip_tokenizer",
    default_layer=-2, final_norm=False, pooled=True, files=CLIP_L_FILES,
)  # fmt: skip
CLIP_G = TextEncoderSpec(
    "clip_g", "text_encoders.clip_g.transformer.", "hf_clip", "text_encoder_2", "clip_tokenizer_2",
    default_layer=-2, final_norm=False, pooled=True, kind=NestedClipText(), files=CLIP_G_FILES,
)  # fmt: skip
T5XXL = TextEncoderSpec(
    "t5xxl", "text_encoders.t5xxl.transformer.", "t5", "text_encoder_3", "t5_tokenizer",
    default_layer=-1, final_norm=True, pooled=False, kind=T5Text(min_length=77), files=T5_FILES,
)  # fmt: skip


class SD3(DiTFamily):
    name = "sd3"
    title = "SD3"
    aliases = ("sd3.5", "sd35")
    pipeline_class = "StableDiffusion3Pipeline"
    specificity = 4
    markers = ("joint_blocks.0.x_block.attn.qkv.weight", "x_embedder.proj.weight")
    sampling = PerPrediction({"flow": FlowSampling(3.0, multiplier=1000.0)})
    latent_format = SD3_LATENT
    denoiser = SD3Transformer()
    prompt = SD3Prompt()
    text_encoders = (CLIP_L, CLIP_G, T5XXL)
    context_dim = 4096  # T5-XXL
    single_clip_types = dual_clip_types = ("sd3",)
    vae_needed = "its 16-channel VAE"
    # SAI's sd3.5_*.safetensors hold no text encoders: their CLIP is empty (TripleCLIPLoader loads them)
    checkpoint = Checkpoint(
        ("first_stage_model.",), tuple((s.name, s.prefix) for s in text_encoders), every_text_encoder=False
    )
    separate_files = (
        "the text encoders with TripleCLIPLoader (clip_l, clip_g, t5xxl) and the VAE with VAELoader"
    )
