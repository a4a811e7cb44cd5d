"""The catalog of model families (declarations over ``nodes.families.base``), found, not listed: :func:`families` is
every class under ``FamilyAdapter`` that declares a ``name`` (this package's modules imported first),
most specific first, and every list below is derived from them. Adding a family is a module in this
package (+ its component kinds); nothing here names one.

``detect_family`` picks a family from a file's tensor names and shapes, ``diffusers_family`` from a
diffusers folder's configs, ``family_by_name`` from a stored name; ``standalone_vae`` and
``standalone_text_encoder`` read the separate files users have, and ``family_for_clip_type`` routes
ComfyUI's CLIPLoader / DualCLIPLoader types. ``FAMILIES``, ``CLIP_TYPES``, ``SINGLE_CLIP_TYPES``,
``DUAL_CLIP_TYPES``, ``TEXT_ENCODER_FILES`` and the family classes by name (``nodes.families.catalog.SD15``)
are read through the module's ``__getattr__``, so they are computed when asked, from the classes."""

from __future__ import annotations

import importlib
import json
import pkgutil
from functools import cache
from pathlib import Path
from typing import Any

from nodes.core.parts import Part
from nodes.core.tensors import ModelLoadError, TensorIndex
from nodes.core.weights import read_index
from nodes.families.base import FamilyAdapter, TextEncoderSpec, describe_unknown
from nodes.families.components import EncoderFile
from nodes.families.dit_family import DiTFamily

CLIP_TYPES_FILE = Path(__file__).with_name("data") / "comfyui_clip_types.json"

__all__ = [
    "FamilyAdapter",
    "ModelLoadError",
    "Part",
    "TensorIndex",
    "TextEncoderSpec",
    "clip_types",
    "describe_context_dim",
    "detect_family",
    "diffusers_family",
    "dual_clip_types",
    "families",
    "family_by_name",
    "family_for_clip_type",
    "read_index",
    "single_clip_types",
    "standalone_text_encoder",
    "standalone_vae",
    "text_encoder_files",
]


# --- the families ---------------------------------------------------------------------------------
@cache
def import_family_modules() -> tuple[str, ...]:
    """Import every module of this package (not the ``components`` subpackage), so each family
    class is defined; the names imported. Once per process: importing is idempotent."""
    package = Path(__file__).parent
    names = tuple(info.name for info in pkgutil.iter_modules([str(package)]) if not info.ispkg)
    for name in names:
        importlib.import_module(f"nodes.families.{name}")
    return names


def families() -> tuple[type[FamilyAdapter], ...]:
    """Every family class, most specific first (``specificity``, then name): each class under
    ``FamilyAdapter`` that declares its own ``name``, wherever it is defined."""
    import_family_modules()
    found: dict[str, type[FamilyAdapter]] = {}
    pending = [FamilyAdapter]
    while pending:
        for sub in pending.pop().__subclasses__():
            pending.append(sub)
            if "name" in vars(sub) and found.setdefault(sub.name, sub) is not sub:
                raise TypeError(
                    f"two model families are named {sub.name!r}: {found[sub.name].__qualname__} "
                    f"({found[sub.name].__module__}) and {sub.__qualname__} ({sub.__module__}); "
                    "give each family its own name"
                )
    return tuple(sorted(found.values(), key=lambda cls: (-cls.specificity, cls.name)))


def __getattr__(name: str) -> Any:
    """The derived lists and the family classes by class name (``from nodes.families import SD15``)."""
    derived = {
        "FAMILIES": families,
        "CLIP_TYPES": clip_types,
        "SINGLE_CLIP_TYPES": single_clip_types,
        "DUAL_CLIP_TYPES": dual_clip_types,
        "TEXT_ENCODER_FILES": text_encoder_files,
    }
    if name in derived:
        return derived[name]()
    for cls in families():
        if cls.__name__ == name:
            return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def detect_family(index: TensorIndex) -> FamilyAdapter:
    for cls in families():
        if cls.detect(index):
            return cls()
    raise ModelLoadError(f"{index.path}: {describe_unknown(index)}")


def family_by_name(name: str) -> FamilyAdapter:
    known = families()
    for cls in known:
        if cls.name == name:
            return cls()
    raise ModelLoadError(f"unknown model family {name!r}; known: {[c.name for c in known]}")


def diffusers_family(folder: Path, model_index: dict[str, Any], unet: dict[str, Any]) -> FamilyAdapter:
    known = families()
    for cls in known:
        if cls.detect_diffusers(model_index, unet):
            return cls()
    pipeline = model_index.get("_class_name")
    for cls in known:
        if cls.pipeline_class == pipeline:  # a known family whose diffusers folders Loom does not read (yet)
            raise ModelLoadError(
                f"{folder}: a diffusers {pipeline} folder ({cls.title}); Loom reads {cls.title} models from single "
                "files, not from diffusers folders: put the checkpoint .safetensors in models/checkpoints and load "
                "it with CheckpointLoaderSimple, or the transformer in models/diffusion_models (UNETLoader) with its "
                "text encoders in models/text_encoders and its VAE in models/vae"
            )
    names = ", ".join(c.title for c in known)
    raise ModelLoadError(f"{folder}: pipeline {pipeline!r} is not one Loom knows ({names})")


def describe_context_dim(width: int) -> str:
    """Which family's released models have text width ``width`` (for messages)."""
    titles = [c.title for c in families() if c.context_dim == width]
    return " or ".join(sorted(titles)) if titles else f"a model of cross-attention width {width}"


# --- standalone files -----------------------------------------------------------------------------
def standalone_vae(index: TensorIndex) -> tuple[FamilyAdapter, Part]:
    """The family whose VAE a standalone VAE file is, and its part. The VAE kinds of the families that
    label VAE files (``labels_vae_files``) are asked in turn, those with tensors of their own (the Wan
    VAE, Flux.2's with BatchNorm statistics) before the generic KL VAE; of the families of the kind
    that answers, the first whose latent width the file has, else the least specific one. The latent
    scale belongs to the MODEL (VAE nodes never scale), so the part's config is the file's own."""
    owners = [cls for cls in families() if cls.labels_vae_files]
    kinds = sorted(dict.fromkeys(cls.vae for cls in owners), key=lambda kind: kind.generic)
    for kind in kinds:
        prefix = kind.file_prefix(index)
        if prefix is None:
            continue
        config = kind.file_config(index, prefix)
        mine = [cls for cls in owners if cls.vae == kind]
        width = kind.latent_channels(config)
        family = next((cls for cls in mine if cls.latent_format.channels == width), mine[-1])
        return family(), Part.make("vae", kind, prefix, "vae", config)
    raise ModelLoadError(f"{index.path}: not a VAE (no encoder/decoder tensors): {describe_unknown(index)}")


def text_encoder_files() -> tuple[tuple[str, EncoderFile], ...]:
    """(encoder name, how its standalone file is recognised) of every family's text encoders."""
    found = ((spec.name, file) for cls in families() for spec in cls.text_encoders for file in spec.files)
    return tuple(dict.fromkeys(found))


def standalone_text_encoder(index: TensorIndex) -> tuple[str, str]:
    """The text encoder a standalone text-encoder file holds (``t5xxl``, ``clip_l``, ``qwen3_4b``...)
    and the prefix of its tensors; a teaching error for anything else (a transformer, a VAE)."""
    files = text_encoder_files()
    for name, file in files:
        if file.matches(index):
            return name, file.prefix
    for cls in families():
        if issubclass(cls, DiTFamily) and cls.detect(index):
            raise ModelLoadError(
                f"{index.path}: this is a {cls.file_title()} transformer, not a text encoder; put it in "
                "models/diffusion_models and load it with UNETLoader"
            )
    for cls in families():
        if cls.labels_vae_files and not cls.vae.generic and cls.vae.file_prefix(index) is not None:
            raise ModelLoadError(
                f"{index.path}: this is a VAE (the {cls.title} VAE), not a text encoder; put it in "
                "models/vae and load it with VAELoader"
            )
    titles = list(dict.fromkeys(file.title for _, file in files))
    known = ", ".join(titles[:-1]) + f" or {titles[-1]}" if len(titles) > 1 else "".join(titles)
    raise ModelLoadError(f"{index.path}: not a text encoder Loom knows ({known}): {describe_unknown(index)}")


# --- ComfyUI's loader types -------------------------------------------------------------------------
@cache
def comfyui_clip_types() -> dict[str, tuple[str, ...]]:
    """ComfyUI's CLIPLoader (``single``) and DualCLIPLoader (``dual``) type options, in its order."""
    data = json.loads(CLIP_TYPES_FILE.read_text(encoding="utf-8"))
    return {"single": tuple(data["single"]), "dual": tuple(data["dual"])}


def single_clip_types() -> tuple[str, ...]:
    """CLIPLoader's ``type`` options: ComfyUI's, then any type a family declares that it lacks."""
    declared = (t for cls in families() for t in cls.single_clip_types)
    return tuple(dict.fromkeys((*comfyui_clip_types()["single"], *declared)))


def dual_clip_types() -> tuple[str, ...]:
    """DualCLIPLoader's ``type`` options: ComfyUI's, then any type a family declares that it lacks."""
    declared = (t for cls in families() for t in cls.dual_clip_types)
    return tuple(dict.fromkeys((*comfyui_clip_types()["dual"], *declared)))


def clip_types() -> dict[str, type[FamilyAdapter]]:
    """The loader types Loom supports, each with the family whose text encoders it loads."""
    out: dict[str, type[FamilyAdapter]] = {}
    for cls in families():
        for clip_type in (*cls.single_clip_types, *cls.dual_clip_types):
            out.setdefault(clip_type, cls)
    return out


def family_for_clip_type(clip_type: str, encoders: tuple[str, ...] = ()) -> FamilyAdapter:
    """The family whose text encoders ComfyUI's loader ``type`` names. As in ComfyUI, some encoder
    files decide by themselves (the families' ``encoder_claims``): a claim for every type but a few
    is asked before a claim for named types (a Qwen3-4B file is Z-Image's for every type but flux and
    flux2, where it is Flux.2 Klein's)."""
    claims = [(cls, claim) for cls in families() for claim in cls.encoder_claims]
    for named_types in (False, True):
        for cls, claim in claims:
            if bool(claim.clip_types) == named_types and claim.holds(clip_type, encoders):
                return cls()
    supported = clip_types()
    if clip_type not in supported:
        raise ModelLoadError(
            f"text encoder type {clip_type!r} is not supported yet; supported: {sorted(supported)}"
        )
    return supported[clip_type]()
