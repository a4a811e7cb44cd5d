"""The family adapter interface: what differs between model families, in one place.

A family says how to recognise its checkpoints, where each component lives in the single file,
how to read each component's architecture from the tensors, and what sampling needs to know
(latent format, prediction type, default size, denoiser inputs, text encoders and tokenizers).
Nodes ask the family; they never branch on it. A family is a declaration: class data over one of
the two bases that write the behaviour once, :class:`~nodes.families.unet_family.UNetFamily` (SD1.x,
SD2.x, SDXL) and :class:`~nodes.families.dit_family.DiTFamily` (the diffusion transformers).
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, cast

from nodes.core.parts import Part
from nodes.core.tensors import ModelLoadError, TensorIndex
from nodes.families.components import EncoderFile, TextEncoderReader
from nodes.families.components.clip_text import ClipText
from nodes.families.latent_format import LatentFormat

if TYPE_CHECKING:
    from nodes.diffusion.model_sampling import ModelSampling

CONFIGS_DIR = Path(__file__).resolve().parents[2] / "models" / "configs"


@dataclass(frozen=True)
class TextEncoderSpec:
    """One text encoder of a family and how prompts go through it."""

    name: str  # "clip_l", "clip_h", "clip_g": the key in the CLIP module dict
    prefix: str  # key prefix in the single-file checkpoint
    layout: str  # "hf_clip" (transformers names) or "open_clip"
    subfolder: str  # in a diffusers folder
    tokenizer: str  # folder under models/configs with the tokenizer settings
    default_layer: int  # hidden state used by default: -1 last, -2 penultimate
    final_norm: bool  # apply final_layer_norm to the chosen hidden state
    pooled: bool  # its pooled (projected) output is a UNet input (SDXL's clip_g)
    kind: TextEncoderReader | None = None  # reads its parts (None: the CLIP text kind of ``layout``)
    files: tuple[EncoderFile, ...] = ()  # how a standalone file of it is recognised (CLIPLoader)

    def reader(self) -> TextEncoderReader:
        return self.kind if self.kind is not None else ClipText(self.layout)


@dataclass(frozen=True)
class EncoderClaim:
    """A text-encoder file that decides the family by itself, as ComfyUI routes it: a file of one of
    ``encoders`` makes a CLIP of the declaring family for the loader types ``clip_types`` or, when
    none are named, for every type but ``except_types``."""

    encoders: tuple[str, ...]
    clip_types: tuple[str, ...] = ()
    except_types: tuple[str, ...] = ()

    def holds(self, clip_type: str, encoders: tuple[str, ...]) -> bool:
        if not set(self.encoders) & set(encoders):
            return False
        if self.clip_types:
            return clip_type in self.clip_types
        return clip_type not in self.except_types


@dataclass(frozen=True)
class FamilyAdapter(ABC):
    """Subclasses are field-less frozen dataclasses: equal and hashable by class. Every class under
    this one that declares its own ``name`` is a family (``nodes.families.catalog.families()`` finds them;
    nothing registers them), detected in order of ``specificity``, highest first."""

    # --- what it is called ------------------------------------------------------------------------
    name: ClassVar[str]  # stored with handles and presets
    title: ClassVar[str]  # for messages
    aliases: ClassVar[tuple[str, ...]] = ()  # other words naming it in code and files (variants, encoders)
    pipeline_class: ClassVar[str]  # diffusers' pipeline class of its folders
    specificity: ClassVar[int] = 0  # a family whose files another family's detect() accepts too ranks higher

    # --- what it is made of -----------------------------------------------------------------------
    latent_format: ClassVar[LatentFormat]
    sampling: ClassVar[
        Any
    ]  # ``build(prediction)`` -> its default ModelSampling (nodes.families.discrete_sampling)
    denoiser: ClassVar[Any]  # the denoiser kind
    vae: ClassVar[Any]  # the VAE kind
    prompt: ClassVar[Any]  # the prompt recipe (nodes.families.prompt)
    text_encoders: ClassVar[tuple[TextEncoderSpec, ...]]
    context_dim: ClassVar[int]  # the denoiser's text width in released checkpoints (ComfyUI's context_dim)
    denoiser_prefix: ClassVar[str] = "model.diffusion_model."
    vae_prefix: ClassVar[str] = "first_stage_model."

    # --- what the standalone loaders route to it --------------------------------------------------
    single_clip_types: ClassVar[tuple[str, ...]] = ()  # CLIPLoader's types that load its text encoders
    dual_clip_types: ClassVar[tuple[str, ...]] = ()  # DualCLIPLoader's
    encoder_claims: ClassVar[tuple[EncoderClaim, ...]] = ()  # encoder files that pick it by themselves
    labels_vae_files: ClassVar[bool] = False  # a standalone VAE file of its kind and width is its own

    # --- recognition --------------------------------------------------------------------------
    @classmethod
    @abstractmethod
    def detect(cls, index: TensorIndex) -> bool:
        """Whether a single-file checkpoint's tensors are of this family."""

    @classmethod
    def detect_diffusers(cls, model_index: Mapping[str, Any], unet: Mapping[str, Any]) -> bool:
        return bool(model_index.get("_class_name") == cls.pipeline_class)

    # --- what sampling needs ----------------------------------------------------------------------
    @abstractmethod
    def prediction_type(self, index: TensorIndex) -> str:
        """What a checkpoint predicts (``epsilon``, ``v_prediction``, ``flow``, ``flux``)."""

    @abstractmethod
    def default_resolution(self, prediction: str) -> int:
        """The image size its checkpoints of ``prediction`` are made for."""

    def config_dir(self, prediction: str = "epsilon") -> Path:
        return CONFIGS_DIR / self.name

    def scheduler_config(self, prediction: str) -> dict[str, Any]:
        path = self.config_dir(prediction) / "scheduler" / "scheduler_config.json"
        cfg = dict(json.loads(path.read_text(encoding="utf-8")))
        cfg["prediction_type"] = prediction
        return cfg

    def model_sampling(self, prediction: str) -> ModelSampling:
        """The default ModelSampling for a checkpoint of this family with ``prediction``."""
        return cast("ModelSampling", self.sampling.build(prediction))

    # --- parts --------------------------------------------------------------------------------
    @abstractmethod
    def parts(self, index: TensorIndex) -> dict[str, tuple[Part, ...]]:
        """The parts of each handle (``unet``, ``clip``, ``vae``) of a single-file checkpoint."""

    @abstractmethod
    def denoiser_part(self, index: TensorIndex) -> Part:
        """The denoiser part of a file holding only the denoiser (UNETLoader)."""

    def diffusers_parts(
        self, config: Callable[[str], dict[str, Any]]
    ) -> tuple[dict[str, tuple[Part, ...]], tuple[tuple[str, int], ...]]:
        """The parts of each handle of a diffusers folder (``config(sub)`` reads ``sub``'s JSON),
        and the text encoders whose folder dropped final layers (name, how many)."""
        raise ModelLoadError(f"Loom reads {self.title} models from single files, not from diffusers folders")

    def text_encoder_part(self, spec: TextEncoderSpec, index: TensorIndex, prefix: str) -> Part:
        """The part of text encoder ``spec`` whose tensors start at ``prefix`` in ``index``."""
        kind, cfg = spec.reader().kind_and_config(index, prefix)
        return Part.make(spec.name, kind, prefix, spec.subfolder, cfg)

    def spec(self, name: str) -> TextEncoderSpec:
        for s in self.text_encoders:
            if s.name == name:
                return s
        raise KeyError(
            f"{self.title} has no text encoder {name!r}; it has {[s.name for s in self.text_encoders]}"
        )


def describe_unknown(index: TensorIndex) -> str:
    """A teaching message for a file that is no family's checkpoint."""
    keys = list(index.tensors)
    hints = [
        (
            ("lora_unet_", "lora_te", ".lora_down.", ".lora_A."),
            "this looks like a LoRA; put it in models/loras and use LoraLoader",
        ),
        (
            ("double_blocks.", "model.diffusion_model.double_blocks."),
            "this looks like a Flux-style model (double_blocks) of a variant Loom does not know",
        ),
        (
            ("joint_blocks.", "model.diffusion_model.joint_blocks."),
            "this looks like an SD3 model of a variant Loom does not know",
        ),
        (
            ("encoder.down.0.block.", "encoder.down_blocks.0."),
            "this looks like a VAE; put it in models/vae and use VAELoader",
        ),
        (
            ("model.layers.0.self_attn.q_norm.",),
            "this looks like a Qwen3 text encoder (an LLM); put it in "
            "models/text_encoders and load it with CLIPLoader (type lumina2 for Z-Image)",
        ),
        (
            ("model.layers.0.self_attn.k_proj.bias",),
            "this looks like a Qwen2.5-VL text encoder (an LLM); put it in "
            "models/text_encoders and load it with CLIPLoader (type qwen_image)",
        ),
        (
            ("decoder.middle.0.residual.", "decoder.up_blocks.0.upsamplers.0.time_conv."),
            "this looks like the Wan / Qwen-Image VAE; put it in models/vae and use VAELoader",
        ),
    ]
    for needles, hint in hints:
        if any(any(n in k for n in needles) for k in keys):
            return hint
    sample = ", ".join(keys[:4]) or "no tensors at all"
    return (
        f"unknown architecture: expected a checkpoint of a family Loom knows (an SD1.x, SD2.x or SDXL "
        f"one has 'model.diffusion_model.input_blocks.*' tensors), found {len(keys)} tensors like {sample}"
    )


def require(cond: bool, index: TensorIndex, what: str) -> None:
    if not cond:
        raise ModelLoadError(f"{index.path}: {what}")
