"""Model families as compositions (SD1.x, SD2.x, SDXL): ``detect_family`` picks one from a file's
tensor names and shapes, ``diffusers_family`` from a diffusers folder's configs,
``family_by_name`` from a stored name; ``standalone_vae`` reads a VAE file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nodes.core.parts import Part
from nodes.core.tensors import ModelLoadError, TensorIndex
from nodes.core.weights import read_index
from nodes.families.base import FamilyAdapter, TextEncoderSpec, describe_unknown
from nodes.families.flux import Chroma, Flux
from nodes.families.flux2 import Flux2
from nodes.families.keys import looks_like_diffusers_vae
from nodes.families.qwen_image import QwenImage, wan_vae_prefix
from nodes.families.sd2 import SD2, SD2Unclip
from nodes.families.sd3 import SD3
from nodes.families.sd15 import SD15
from nodes.families.sdxl import SDXL
from nodes.families.zimage import ZImage

FAMILIES: tuple[type[FamilyAdapter], ...] = (
    Flux2,
    Chroma,
    Flux,
    ZImage,
    QwenImage,
    SD3,
    SD2Unclip,
    SDXL,
    SD2,
    SD15,
)  # most specific first

__all__ = [
    "DUAL_CLIP_TYPES",
    "FAMILIES",
    "SD15",
    "SD2",
    "SDXL",
    "SD2Unclip",
    "SINGLE_CLIP_TYPES",
    "Chroma",
    "FamilyAdapter",
    "Flux",
    "Flux2",
    "ModelLoadError",
    "Part",
    "QwenImage",
    "SD3",
    "TensorIndex",
    "TextEncoderSpec",
    "describe_context_dim",
    "detect_family",
    "diffusers_family",
    "family_by_name",
    "family_for_clip_type",
    "read_index",
    "standalone_text_encoder",
    "standalone_vae",
    "ZImage",
]


def detect_family(index: TensorIndex) -> FamilyAdapter:
    for cls in FAMILIES:
        if cls.detect(index):
            return cls()
    raise ModelLoadError(f"{index.path}: {describe_unknown(index)}")


def family_by_name(name: str) -> FamilyAdapter:
    for cls in FAMILIES:
        if cls.name == name:
            return cls()
    raise ModelLoadError(f"unknown model family {name!r}; known: {[c.name for c in FAMILIES]}")


def diffusers_family(folder: Path, model_index: dict[str, Any], unet: dict[str, Any]) -> FamilyAdapter:
    for cls in FAMILIES:
        if cls.detect_diffusers(model_index, unet):
            return cls()
    pipeline = model_index.get("_class_name")
    for cls in FAMILIES:
        if cls.pipeline_class == pipeline:  # a known family whose diffusers folders Loom does not read (yet)
            raise ModelLoadError(
                f"{folder}: a diffusers {pipeline} folder ({cls.title}); Loom reads {cls.title} models from single "
                "files, not from diffusers folders: put the checkpoint .safetensors in models/checkpoints and load "
                "it with CheckpointLoaderSimple, or the transformer in models/diffusion_models (UNETLoader) with its "
                "text encoders in models/text_encoders and its VAE in models/vae"
            )
    known = ", ".join(c.title for c in FAMILIES)
    raise ModelLoadError(f"{folder}: pipeline {pipeline!r} is not one Loom knows ({known})")


def standalone_vae(index: TensorIndex) -> tuple[FamilyAdapter, Part]:
    """The family whose VAE architecture a standalone VAE file has, and its part. The KL VAE of
    SD1.x, SD2.x and SDXL is one architecture; the latent scale belongs to the MODEL, so the
    first family's is used for the config (VAE nodes never scale). The Wan 2.1 VAE (Qwen-Image's) is
    its own architecture and belongs to Qwen-Image, the 32-channel one with BatchNorm statistics to
    Flux.2."""
    wan = wan_vae_prefix(index)
    if wan is not None:
        qwen = QwenImage()
        return qwen, qwen.vae_part(index, wan)
    from nodes.families.components.flux2_vae import is_flux2_vae

    if is_flux2_vae(index):  # the 32-channel Flux.2 VAE with BatchNorm statistics
        return Flux2(), Flux2().vae_part(index, "")
    family = SD15()
    prefix = family.vae_prefix if index.any_with(family.vae_prefix) else ""
    diffusers_keys = looks_like_diffusers_vae(list(index.tensors))
    if not diffusers_keys and not (
        index.has(f"{prefix}encoder.conv_in.weight") and index.has(f"{prefix}decoder.conv_out.weight")
    ):
        raise ModelLoadError(
            f"{index.path}: not a VAE (no encoder/decoder tensors): {describe_unknown(index)}"
        )
    cfg = family.vae.config_from_tensors(index, prefix, family.latent_format.scale_factor, 512)
    # the latent space it belongs to, by its latent channels (the 16-channel KL VAE is Flux's ae.safetensors)
    by_channels = [cls() for cls in (SD15, Flux) if cls.latent_format.channels == cfg.get("latent_channels")]
    return (by_channels[0] if by_channels else family), Part.make("vae", family.vae, prefix, "vae", cfg)


TEXT_ENCODER_FILES = (  # (encoder name, where its tensors start, a tensor that marks it)
    ("clip_g", "", "text_model.encoder.layers.30.mlp.fc1.weight"),  # ComfyUI's rule: CLIP-G has 32 layers
    ("t5xxl", "", "encoder.block.0.layer.0.SelfAttention.q.weight"),
    ("clip_l", "text_model.", "text_model.encoder.layers.0.self_attn.q_proj.weight"),
    ("clip_l", "", "encoder.layers.0.self_attn.q_proj.weight"),
    ("qwen3_4b", "model.", "model.layers.0.self_attn.q_norm.weight"),  # ComfyUI's qwen_3_4b.safetensors
    ("qwen25_7b", "model.", "model.layers.0.self_attn.k_proj.bias"),  # ComfyUI's qwen_2.5_vl_7b.safetensors
    ("mistral3_24b", "model.", "tekken_model"),  # ComfyUI's Flux.2 Mistral-Small file (tokenizer inside)
)


def standalone_text_encoder(index: TensorIndex) -> tuple[str, str]:
    """The text encoder a standalone text-encoder file holds (``t5xxl`` | ``clip_l`` | ``qwen3_4b`` | ``qwen25_7b``) and the
    prefix of its tensors; a teaching error for anything else."""
    for name, prefix, marker in TEXT_ENCODER_FILES:
        if index.has(marker):
            return name, prefix
    for title, family in (
        ("Flux.2", Flux2),
        ("Flux", Flux),
        ("Flux", Chroma),
        ("SD3", SD3),
        ("Z-Image", ZImage),
        ("Qwen-Image", QwenImage),
    ):
        if family.detect(index):
            raise ModelLoadError(
                f"{index.path}: this is a {title} transformer, not a text encoder; put it in "
                "models/diffusion_models and load it with UNETLoader"
            )
    if wan_vae_prefix(index) is not None:
        raise ModelLoadError(
            f"{index.path}: this is a VAE (the Wan/Qwen-Image VAE), not a text encoder; put it in "
            "models/vae and load it with VAELoader"
        )
    raise ModelLoadError(
        f"{index.path}: not a text encoder Loom knows (CLIP-L, CLIP-G, T5-XXL, Qwen3, Qwen2.5-VL or "
        f"Mistral-Small): {describe_unknown(index)}"
    )


CLIP_TYPES: dict[str, type[FamilyAdapter]] = {
    "flux": Flux,
    "chroma": Chroma,
    "sd3": SD3,
    "lumina2": ZImage,
    "qwen_image": QwenImage,
    "flux2": Flux2,
}  # ComfyUI's loader types
# DualCLIPLoader's ``type`` options, as ComfyUI lists them (the supported ones are in CLIP_TYPES)
# CLIPLoader's ``type`` options, as ComfyUI lists them
SINGLE_CLIP_TYPES = (
    "stable_diffusion",
    "stable_cascade",
    "sd3",
    "stable_audio",
    "mochi",
    "ltxv",
    "pixart",
    "cosmos",
    "lumina2",
    "wan",
    "hidream",
    "chroma",
    "ace",
    "omnigen2",
    "qwen_image",
    "hunyuan_image",
    "flux2",
    "ovis",
)
DUAL_CLIP_TYPES = (
    "sdxl",
    "sd3",
    "flux",
    "hunyuan_video",
    "hidream",
    "hunyuan_image",
    "hunyuan_video_15",
    "kandinsky5",
    "kandinsky5_image",
    "ltxv",
    "newbie",
    "ace",
)


def family_for_clip_type(clip_type: str, encoders: tuple[str, ...] = ()) -> FamilyAdapter:
    """The family whose text encoders ComfyUI's loader ``type`` names. As in ComfyUI, some encoder
    files decide by themselves: a Qwen3-4B file is Z-Image's for every type but Flux's (ComfyUI routes
    it to Flux.2 Klein there), a Qwen2.5-VL-7B file is Qwen-Image's for every type but HunyuanImage's,
    and a Qwen3 or Mistral-Small file with type flux or flux2 is Flux.2's."""
    if "qwen3_4b" in encoders and clip_type not in ("flux", "flux2"):
        return ZImage()
    if "qwen25_7b" in encoders and clip_type != "hunyuan_image":
        return QwenImage()
    if {"qwen3_4b", "mistral3_24b"} & set(encoders) and clip_type in ("flux", "flux2"):
        return Flux2()  # Klein's Qwen3 or dev's Mistral-Small, for type flux as for flux2
    if clip_type not in CLIP_TYPES:
        raise ModelLoadError(
            f"text encoder type {clip_type!r} is not supported yet; supported: {sorted(CLIP_TYPES)}"
        )
    return CLIP_TYPES[clip_type]()


def describe_context_dim(width: int) -> str:
    """Which family's released models have text width ``width`` (for messages)."""
    titles = [c.title for c in FAMILIES if c.context_dim == width]
    return " or ".join(sorted(titles)) if titles else f"a model of cross-attention width {width}"
