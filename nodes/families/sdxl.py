"""SDXL base: CLIP ViT-L + OpenCLIP ViT-bigG (penultimate layers, concatenated to 2048), pooled
bigG output and size/crop ids as extra UNet inputs, latent scale 0.13025, 1024 px."""

from __future__ import annotations

from typing import Any, ClassVar

from nodes.core.tensors import ModelLoadError, TensorIndex
from nodes.families import arch
from nodes.families.base import TextEncoderSpec
from nodes.families.components import UNetDenoiser
from nodes.families.discrete_sampling import DiscreteSampling
from nodes.families.latent_format import SDXL_LATENT
from nodes.families.unet_family import UNetFamily


class SDXL(UNetFamily):
    name = "sdxl"
    title = "SDXL"
    specificity = 2
    resolution = 1024
    pipeline_class = "StableDiffusionXLPipeline"
    context_dim = 2048
    latent_format = SDXL_LATENT
    sampling = DiscreteSampling(
        ays_sigmas=(14.615, 6.315, 3.771, 2.181, 1.342, 0.862, 0.555, 0.380, 0.234, 0.113, 0.029)
    )
    denoiser = UNetDenoiser(size_ids=True, latent_format=SDXL_LATENT, image_embeds="pooled")
    heads: ClassVar[arch.HeadsRule] = staticmethod(arch.heads_of_64)
    text_encoders = (
        TextEncoderSpec(
            "clip_l",
            "conditioner.embedders.0.transformer.text_model.",
            "hf_clip",
            "text_encoder",
            "clip_tokenizer",
            default_layer=-2,
            final_norm=False,
            pooled=False,
        ),
        TextEncoderSpec(
            "clip_g",
            "conditioner.embedders.1.model.",
            "open_clip",
            "text_encoder_2",
            "clip_tokenizer_2",
            default_layer=-2,
            final_norm=False,
            pooled=True,
        ),
    )

    @classmethod
    def detect(cls, index: TensorIndex) -> bool:
        if not index.has(f"{cls.denoiser_prefix}label_emb.0.0.weight"):
            return False
        if not index.any_with("conditioner.embedders.1.model."):
            raise ModelLoadError(
                f"{index.path}: this looks like the SDXL refiner (one OpenCLIP text encoder), "
                "which Loom does not support yet; use an SDXL base checkpoint"
            )
        return True

    def denoiser_config(self, index: TensorIndex, prediction: str) -> dict[str, Any]:
        cfg = super().denoiser_config(index, prediction)
        pooled = arch.clip_config(index, "conditioner.embedders.1.model.", "open_clip").get(
            "projection_dim", 1280
        )
        extra = int(cfg["projection_class_embeddings_input_dim"]) - int(pooled)
        if extra <= 0 or extra % 6:
            raise ModelLoadError(
                f"{index.path}: SDXL label embedding takes {cfg['projection_class_embeddings_input_dim']} "
                f"inputs; expected the pooled text size {pooled} + 6 size/crop embeddings"
            )
        cfg["addition_time_embed_dim"] = extra // 6
        return cfg
