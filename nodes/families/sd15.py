"""Stable Diffusion 1.x: CLIP ViT-L/14 text encoder (768), 8-head UNet, epsilon, 512 px."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from nodes.core.tensors import TensorIndex
from nodes.families import arch
from nodes.families.base import FamilyAdapter, TextEncoderSpec
from nodes.families.discrete_sampling import AYS_SD1, DiscreteSampling


@dataclass(frozen=True)
class SD15(FamilyAdapter):
    name: ClassVar[str] = "sd15"
    title: ClassVar[str] = "SD1.x"
    pipeline_class: ClassVar[str] = "StableDiffusionPipeline"
    context_dim: ClassVar[int] = 768
    sampling: ClassVar[DiscreteSampling] = DiscreteSampling(ays_sigmas=AYS_SD1)
    heads: ClassVar[arch.HeadsRule] = staticmethod(arch.eight_heads)
    text_encoders: ClassVar[tuple[TextEncoderSpec, ...]] = (
        TextEncoderSpec(
            "clip_l",
            "cond_stage_model.transformer.text_model.",
            "hf_clip",
            "text_encoder",
            "clip_tokenizer",
            default_layer=-1,
            final_norm=True,
            pooled=False,
        ),
    )

    @classmethod
    def detect(cls, index: TensorIndex) -> bool:
        return index.has(f"{cls.denoiser_prefix}input_blocks.0.0.weight") and index.any_with(
            "cond_stage_model.transformer."
        )

    @classmethod
    def detect_diffusers(cls, model_index: dict, unet: dict) -> bool:  # type: ignore[override]
        return model_index.get("_class_name") == cls.pipeline_class and not unet.get(
            "use_linear_projection", False
        )
