"""Model families as compositions (SD1.x, SD2.x, SDXL): ``detect_family`` picks one from a file's
tensor names and shapes, ``diffusers_family`` from a diffusers folder's configs,
``family_by_name`` from a stored name; ``standalone_vae`` reads a VAE file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nodes.families.base import FamilyAdapter, Part, TextEncoderSpec, describe_unknown
from nodes.families.keys import looks_like_diffusers_vae
from nodes.families.sd2 import SD2
from nodes.families.sd15 import SD15
from nodes.families.sdxl import SDXL
from nodes.weights import ModelLoadError, TensorIndex, read_index

FAMILIES: tuple[type[FamilyAdapter], ...] = (SDXL, SD2, SD15)  # most specific first

__all__ = ["FAMILIES", "SD15", "SD2", "SDXL", "FamilyAdapter", "ModelLoadError", "Part", "TensorIndex",
           "TextEncoderSpec", "detect_family", "describe_context_dim", "diffusers_family", "family_by_name", "read_index", "standalone_vae"]


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
    known = ", ".join(c.title for c in FAMILIES)
    raise ModelLoadError(f"{folder}: pipeline {model_index.get('_class_name')!r} is not one Loom knows ({known})")


def standalone_vae(index: TensorIndex) -> tuple[FamilyAdapter, Part]:
    """The family whose VAE architecture a standalone VAE file has, and its part. The KL VAE of
    SD1.x, SD2.x and SDXL is one architecture; the latent scale belongs to the MODEL, so the
    first family's is used for the config (VAE nodes never scale)."""
    family = SD15()
    prefix = family.vae_prefix if index.any_with(family.vae_prefix) else ""
    diffusers_keys = looks_like_diffusers_vae(list(index.tensors))
    if not diffusers_keys and not (index.has(f"{prefix}encoder.conv_in.weight")
                                   and index.has(f"{prefix}decoder.conv_out.weight")):
        raise ModelLoadError(f"{index.path}: not a VAE (no encoder/decoder tensors): {describe_unknown(index)}")
    cfg = family.vae.config_from_tensors(index, prefix, family.latent_format.scale_factor, 512)
    return family, Part.make("vae", family.vae, prefix, "vae", cfg)


def describe_context_dim(width: int) -> str:
    """Which family's released models have text width ``width`` (for messages)."""
    titles = [c.title for c in FAMILIES if c.context_dim == width]
    return " or ".join(sorted(titles)) if titles else f"a model of cross-attention width {width}"
