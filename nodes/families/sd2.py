"""Stable Diffusion 2.x: OpenCLIP ViT-H/14 text encoder (1024, penultimate layer), 64-channel
attention heads, linear transformer projections; 512-base (epsilon) and 768-v (v-prediction)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from nodes.core.tensors import ModelLoadError, TensorIndex
from nodes.core.weights import load_tensors
from nodes.families import arch
from nodes.families.base import TextEncoderSpec
from nodes.families.components import UNetDenoiser
from nodes.families.discrete_sampling import AYS_SD1, DiscreteSampling
from nodes.families.latent_format import SD15_LATENT
from nodes.families.unet_family import UNetFamily

# ComfyUI's rule for SD2 files without a marker: v-prediction models have a wide norm bias here.
_V_PROBE = "model.diffusion_model.output_blocks.11.1.transformer_blocks.0.norm1.bias"


class SD2(UNetFamily):
    name = "sd2"
    title = "SD2.x"
    specificity = 1
    pipeline_class = "StableDiffusionPipeline"
    context_dim = 1024
    sampling = DiscreteSampling(ays_sigmas=AYS_SD1)
    heads: ClassVar[arch.HeadsRule] = staticmethod(arch.heads_of_64)
    text_encoders = (
        TextEncoderSpec(
            "clip_h",
            "cond_stage_model.model.",
            "open_clip",
            "text_encoder",
            "clip_tokenizer_2",
            default_layer=-2,
            final_norm=True,
            pooled=False,
        ),
    )

    @classmethod
    def detect(cls, index: TensorIndex) -> bool:
        return index.has(f"{cls.denoiser_prefix}input_blocks.0.0.weight") and index.any_with(
            "cond_stage_model.model."
        )

    @classmethod
    def detect_diffusers(cls, model_index: dict, unet: dict) -> bool:  # type: ignore[override]
        return model_index.get("_class_name") == cls.pipeline_class and bool(
            unet.get("use_linear_projection", False)
        )

    def prediction_type(self, index: TensorIndex) -> str:
        """``v_pred`` key (ComfyUI's marker) or metadata; else ComfyUI's norm-bias heuristic."""
        if index.has("v_pred"):
            return "v_prediction"
        meta = {k.lower(): str(v).lower() for k, v in index.metadata.items()}
        if (
            meta.get("modelspec.prediction_type", "").startswith("v")
            or meta.get("ss_v_parameterization") == "true"
        ):
            return "v_prediction"
        if meta.get("modelspec.prediction_type") == "epsilon" or not index.has(_V_PROBE) or index.pickled:
            return "epsilon"

        bias = load_tensors(index, _V_PROBE, strip=False)[_V_PROBE]
        return "v_prediction" if float(bias.float().std()) > 0.09 else "epsilon"

    def dropped_layers(self, spec: TextEncoderSpec, config: Mapping[str, Any]) -> int:
        """diffusers' SD2 folders drop ViT-H's last layer (23 of 24)."""
        return 1 if config.get("num_hidden_layers") == 23 else 0

    def default_resolution(self, prediction: str) -> int:
        return 768 if prediction == "v_prediction" else 512

    def denoiser_config(self, index: TensorIndex, prediction: str) -> dict[str, Any]:
        cfg = super().denoiser_config(index, prediction)
        cfg["upcast_attention"] = prediction == "v_prediction"  # SD2.1-v overflows in fp16 otherwise
        return cfg


class SD2Unclip(SD2):
    """SD2.1 unCLIP (ComfyUI's SD21UnclipL/H): an SD2.x checkpoint whose UNet has a class embedding
    (``label_emb``) fed with noise-augmented CLIP vision image embeds and their noise-level embedding
    (twice the image-embed width: 1536 for the ViT-L variant, 2048 for ViT-H), and its OpenCLIP image
    tower under ``embedder.model.visual.`` (unCLIPCheckpointLoader's CLIP_VISION)."""

    name = "sd2_unclip"
    title = "SD2.x unCLIP"
    specificity = 3  # an unCLIP checkpoint is an SD2.x one with a class embedding
    pipeline_class = "StableUnCLIPImg2ImgPipeline"
    denoiser = UNetDenoiser(latent_format=SD15_LATENT, image_embeds="class_labels")
    clip_vision_prefix = "embedder.model.visual."

    @classmethod
    def detect(cls, index: TensorIndex) -> bool:
        return (
            index.has(f"{cls.denoiser_prefix}label_emb.0.0.weight")
            and index.any_with("cond_stage_model.model.")
            and not index.any_with("conditioner.embedders.")
        )

    @classmethod
    def detect_diffusers(cls, model_index: dict, unet: dict) -> bool:  # type: ignore[override]
        return model_index.get("_class_name") == cls.pipeline_class

    def denoiser_config(self, index: TensorIndex, prediction: str) -> dict[str, Any]:
        cfg = super().denoiser_config(index, prediction)
        cfg.pop("addition_embed_type", None)
        cfg["class_embed_type"] = "projection"
        if cfg["projection_class_embeddings_input_dim"] % 2:
            raise ModelLoadError(
                f"{index.path}: an unCLIP class embedding takes an even width (image embeds + "
                f"noise-level embedding); found {cfg['projection_class_embeddings_input_dim']}"
            )
        return cfg
