"""Z-Image (Turbo): a ``ZImageTransformer2DModel`` over 16-channel latents in 2×2 patches, text from
Qwen3-4B (the chat template, the second-to-last layer's hidden states, every token, no padding), the
Flux VAE and latent space (scale 0.3611, shift 0.1159: ComfyUI's Z-Image uses ``latent_formats.Flux``).

Sampling: discrete flow matching with shift 3 and multiplier 1 (ComfyUI's ``supported_models.ZImage``:
``ModelSamplingDiscreteFlow``, the model's timestep is sigma itself); the transformer kind turns it
into t = 1 − sigma and negates the output. ComfyUI's Z-Image Turbo template sets the same shift with
``ModelSamplingAuraFlow`` and samples 8 steps of ``res_multistep`` / ``simple`` at cfg 1, with the
negative prompt zeroed (``ConditioningZeroOut``).

Files as users have them: the transformer alone (``z_image_turbo_bf16.safetensors`` in
``models/diffusion_models``, keys with or without ``model.diffusion_model.``; UNETLoader), the text
encoder alone (``qwen_3_4b.safetensors`` in ``models/text_encoders``; CLIPLoader with type
``lumina2``, as ComfyUI's template) and the Flux ``ae.safetensors`` (VAELoader).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from nodes.core.parts import Part
from nodes.core.tensors import ModelLoadError, TensorIndex
from nodes.families.base import FamilyAdapter, TextEncoderSpec, require
from nodes.families.components.qwen_text import QwenText
from nodes.families.components.zimage_dit import ZImageTransformer
from nodes.families.flux import FLUX_LATENT
from nodes.families.latent_format import LatentFormat

if TYPE_CHECKING:
    from torch import Tensor

    from nodes.families.prompt import ReadyEncoder

QWEN3_4B = TextEncoderSpec(
    "qwen3_4b",
    "model.",
    "qwen3",
    "text_encoder",
    "qwen_tokenizer",
    default_layer=-2,
    final_norm=False,
    pooled=False,
)
DIFFUSION_PREFIXES = ("model.diffusion_model.", "")
SHIFT = 3.0


def transformer_prefix(index: TensorIndex) -> str | None:
    """Where a Z-Image transformer's tensors start in ``index`` (None: there is none). Z-Image's
    blocks take their modulation from ``adaLN_modulation.0`` (Lumina 2's from ``.1``)."""
    for prefix in DIFFUSION_PREFIXES:
        if all(
            index.has(f"{prefix}{k}")
            for k in ("x_embedder.weight", "cap_embedder.1.weight", "layers.0.adaLN_modulation.0.weight")
        ):
            return prefix
    return None


@dataclass(frozen=True)
class ZImagePrompt:
    """ComfyUI's Z-Image text encoding: the Qwen3 encoder's hidden state (the handle's layer, -2 by
    default) of the templated prompt is the conditioning; there is no pooled vector."""

    def encode(self, text: str, encoders: Sequence[ReadyEncoder]) -> tuple[Tensor, Tensor | None]:
        for enc in encoders:
            if isinstance(enc.kind, QwenText):
                return enc.kind.encode(enc.module, enc.tokenizer, text, enc.layer), None
        raise ModelLoadError(
            "Z-Image needs the Qwen3-4B text encoder; load qwen_3_4b.safetensors with "
            "CLIPLoader (type lumina2)"
        )


@dataclass(frozen=True)
class ZImage(FamilyAdapter):
    name: ClassVar[str] = "z_image"  # as in the presets table (nodes/load/presets.py)
    title: ClassVar[str] = "Z-Image"
    pipeline_class: ClassVar[str] = "ZImagePipeline"
    latent_format: ClassVar[LatentFormat] = FLUX_LATENT
    denoiser: ClassVar[ZImageTransformer] = ZImageTransformer()  # type: ignore[assignment]
    prompt: ClassVar[ZImagePrompt] = ZImagePrompt()  # type: ignore[assignment]
    text_encoders: ClassVar[tuple[TextEncoderSpec, ...]] = (QWEN3_4B,)
    context_dim: ClassVar[int] = 2560  # Qwen3-4B
    qwen: ClassVar[QwenText] = QwenText()

    @classmethod
    def detect(cls, index: TensorIndex) -> bool:
        return transformer_prefix(index) is not None

    @classmethod
    def detect_diffusers(cls, model_index: Any, unet: Any) -> bool:
        return False  # diffusers Z-Image folders have a transformer/, not a unet/: not supported yet

    # --- sampling -----------------------------------------------------------------------------
    def prediction_type(self, index: TensorIndex) -> str:
        return "flow"

    def model_sampling(self, prediction: str) -> Any:
        from nodes.diffusion.model_sampling import flow

        return flow(shift=SHIFT, multiplier=1.0)

    def default_resolution(self, prediction: str) -> int:
        return 1024

    # --- parts --------------------------------------------------------------------------------
    def denoiser_part(self, index: TensorIndex) -> Part:
        prefix = transformer_prefix(index)
        require(
            prefix is not None,
            index,
            "no Z-Image transformer tensors (x_embedder, cap_embedder, layers.N) in this file",
        )
        assert prefix is not None
        return Part.make(
            "unet", self.denoiser, prefix, "transformer", self.denoiser.config_from_tensors(index, prefix)
        )

    def text_encoder_part(self, spec: TextEncoderSpec, index: TensorIndex, prefix: str) -> Part:
        return Part.make(
            spec.name, self.qwen, prefix, spec.subfolder, self.qwen.config_from_tensors(index, prefix)
        )

    def parts(self, index: TensorIndex) -> dict[str, tuple[Part, ...]]:
        raise ModelLoadError(
            f"{index.path}: this is a Z-Image transformer file, not an all-in-one checkpoint: put it in "
            "models/diffusion_models and load it with UNETLoader, the text encoder (qwen_3_4b.safetensors) with "
            "CLIPLoader (type lumina2) and the VAE (ae.safetensors) with VAELoader"
        )
