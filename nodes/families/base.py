"""The family adapter interface: what differs between SD1.x, SD2.x and SDXL, in one place.

A family says how to recognise its checkpoints, where each component lives in the single file,
how to read each component's architecture from the tensors, and what sampling needs to know
(latent scale, prediction type, default size, extra UNet inputs, text encoders and tokenizers).
Nodes ask the family; they never branch on it.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from nodes.core.parts import Part
from nodes.core.tensors import ModelLoadError, TensorIndex
from nodes.families import arch
from nodes.families.components import KLVae, UNetDenoiser
from nodes.families.components.clip_text import ClipText
from nodes.families.discrete_sampling import DiscreteSampling
from nodes.families.latent_format import SD15_LATENT, LatentFormat
from nodes.families.prompt import ConcatPrompt

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


@dataclass(frozen=True)
class FamilyAdapter(ABC):
    """Subclasses are field-less frozen dataclasses: equal and hashable by class."""

    name: ClassVar[str]
    title: ClassVar[str]
    denoiser_prefix: ClassVar[str] = "model.diffusion_model."
    vae_prefix: ClassVar[str] = "first_stage_model."
    latent_format: ClassVar[LatentFormat] = SD15_LATENT
    sampling: ClassVar[DiscreteSampling] = DiscreteSampling()
    denoiser: ClassVar[UNetDenoiser] = UNetDenoiser(latent_format=SD15_LATENT)
    vae: ClassVar[KLVae] = KLVae()
    prompt: ClassVar[ConcatPrompt] = ConcatPrompt()
    text_encoders: ClassVar[tuple[TextEncoderSpec, ...]]
    context_dim: ClassVar[int]  # the denoiser's text width in released checkpoints (ComfyUI's context_dim)
    heads: ClassVar[arch.HeadsRule]
    pipeline_class: ClassVar[str]

    # --- recognition --------------------------------------------------------------------------
    @classmethod
    @abstractmethod
    def detect(cls, index: TensorIndex) -> bool:
        """Whether a single-file checkpoint's tensors are of this family."""

    @classmethod
    def detect_diffusers(cls, model_index: Mapping[str, Any], unet: Mapping[str, Any]) -> bool:
        return bool(model_index.get("_class_name") == cls.pipeline_class)

    # --- what sampling needs ----------------------------------------------------------------------
    def prediction_type(self, index: TensorIndex) -> str:
        return "epsilon"

    def default_resolution(self, prediction: str) -> int:
        return 512

    def config_dir(self, prediction: str = "epsilon") -> Path:
        return CONFIGS_DIR / self.name

    def scheduler_config(self, prediction: str) -> dict[str, Any]:
        path = self.config_dir(prediction) / "scheduler" / "scheduler_config.json"
        cfg = dict(json.loads(path.read_text(encoding="utf-8")))
        cfg["prediction_type"] = prediction
        return cfg

    def model_sampling(self, prediction: str) -> ModelSampling:
        """The default ModelSampling for a checkpoint of this family with ``prediction``."""
        return self.sampling.build(prediction)

    # --- architecture ---------------------------------------------------------------------------
    def denoiser_config(self, index: TensorIndex, prediction: str) -> dict[str, Any]:
        size = self.default_resolution(prediction) // 8
        return self.denoiser.config_from_tensors(index, self.denoiser_prefix, type(self).heads, size)

    def parts(self, index: TensorIndex) -> dict[str, tuple[Part, ...]]:
        """The parts of each handle (``unet``, ``clip``, ``vae``) of a single-file checkpoint."""
        prediction = self.prediction_type(index)
        unet = Part.make(
            "unet", self.denoiser, self.denoiser_prefix, "unet", self.denoiser_config(index, prediction)
        )
        vae_cfg = self.vae.config_from_tensors(
            index, self.vae_prefix, self.latent_format.scale_factor, self.default_resolution(prediction)
        )
        vae = Part.make("vae", self.vae, self.vae_prefix, "vae", vae_cfg)
        clips = []
        for spec in self.text_encoders:
            kind, cfg = ClipText.from_tensors(index, spec.prefix, spec.layout)
            clips.append(Part.make(spec.name, kind, spec.prefix, spec.subfolder, cfg))
        return {"unet": (unet,), "clip": tuple(clips), "vae": (vae,)}

    def diffusers_parts(
        self, config: Callable[[str], dict[str, Any]]
    ) -> tuple[dict[str, tuple[Part, ...]], tuple[tuple[str, int], ...]]:
        """The parts of each handle of a diffusers folder (``config(sub)`` reads ``sub``'s JSON),
        and the text encoders whose folder dropped final layers (name, how many)."""
        unet = Part.make("unet", self.denoiser, self.denoiser_prefix, "unet", config("unet/config.json"))
        vae = Part.make("vae", self.vae, self.vae_prefix, "vae", config("vae/config.json"))
        clips, dropped = [], []
        for spec in self.text_encoders:
            cfg = config(f"{spec.subfolder}/config.json")
            clips.append(
                Part.make(
                    spec.name, ClipText.from_diffusers(spec.layout, cfg), spec.prefix, spec.subfolder, cfg
                )
            )
            if drop := self.dropped_layers(spec, cfg):
                dropped.append((spec.name, drop))
        return {"unet": (unet,), "clip": tuple(clips), "vae": (vae,)}, tuple(dropped)

    def dropped_layers(self, spec: TextEncoderSpec, config: Mapping[str, Any]) -> int:
        """How many final layers a diffusers folder's text encoder lacks (its hidden states shift)."""
        return 0

    def denoiser_part(self, index: TensorIndex) -> Part:
        """The denoiser part of a file holding only the denoiser (UNETLoader)."""
        raise ModelLoadError(
            f"{index.path}: a {self.title} denoiser-only file cannot be loaded by itself; "
            "use the full checkpoint with CheckpointLoaderSimple"
        )

    def text_encoder_part(self, spec: TextEncoderSpec, index: TensorIndex, prefix: str) -> Part:
        """The part of text encoder ``spec`` whose tensors start at ``prefix`` in ``index``."""
        kind, cfg = ClipText.from_tensors(index, prefix, spec.layout)
        return Part.make(spec.name, kind, prefix, spec.subfolder, cfg)

    def spec(self, name: str) -> TextEncoderSpec:
        for s in self.text_encoders:
            if s.name == name:
                return s
        raise KeyError(
            f"{self.title} has no text encoder {name!r}; it has {[s.name for s in self.text_encoders]}"
        )


def describe_unknown(index: TensorIndex) -> str:
    """A teaching message for a file that is not an SD1.x/SD2.x/SDXL checkpoint."""
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
        f"unknown architecture: expected an SD1.x, SD2.x or SDXL checkpoint with "
        f"'model.diffusion_model.input_blocks.*' tensors, found {len(keys)} tensors like {sample}"
    )


def require(cond: bool, index: TensorIndex, what: str) -> None:
    if not cond:
        raise ModelLoadError(f"{index.path}: {what}")
