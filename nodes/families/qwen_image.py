"""Qwen-Image (and Qwen-Image-Edit): a ``QwenImageTransformer2DModel`` over 2×2-packed 16-channel latents,
text from Qwen2.5-VL-7B's language model (ComfyUI's system-prompted template, the last hidden state,
the template's head dropped), the Wan 2.1 VAE, and the Wan 2.1 latent space: per-channel mean and std,
``(latent − mean) / std`` (ComfyUI's ``latent_formats.Wan21``).

Sampling: discrete flow matching with shift 1.15 and multiplier 1 (ComfyUI's
``supported_models.QwenImage``; the model's timestep is sigma), real CFG with a negative prompt (plain
CFG as ComfyUI; diffusers' pipeline also rescales to the conditional norm, ComfyUI only with its
CFGNorm node). ComfyUI's Qwen-Image template sets shift 3.1 with ``ModelSamplingAuraFlow``.

Files as users have them: the transformer alone (``qwen_image_fp8_e4m3fn.safetensors`` /
``qwen_image_bf16.safetensors`` in ``models/diffusion_models``, diffusers' names, bare or under
``model.diffusion_model.``; UNETLoader), the text encoder alone (``qwen_2.5_vl_7b.safetensors`` in
``models/text_encoders``; CLIPLoader type ``qwen_image``; its ``visual.`` tensors, Qwen2.5-VL's vision
tower, are read only when Qwen-Image-Edit's nodes get a picture: :meth:`QwenImage.vision_part`) and
``qwen_image_vae.safetensors`` (the Wan layout; VAELoader).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from nodes.core.parts import Part
from nodes.core.tensors import ModelLoadError, TensorIndex
from nodes.families.base import FamilyAdapter, TextEncoderSpec, require
from nodes.families.components.qwen25_text import Qwen25VLText
from nodes.families.components.qwen25_vision import VISION_PREFIX, ImageEmbeds, Qwen25Vision
from nodes.families.components.qwen_image_dit import QwenImageTransformer
from nodes.families.components.wan_vae import LATENTS_MEAN, LATENTS_STD, WanVae, is_wan_vae
from nodes.families.latent_format import LatentFormat

if TYPE_CHECKING:
    from torch import Tensor

    from nodes.families.prompt import ReadyEncoder


@dataclass(frozen=True)
class ChannelLatentFormat(LatentFormat):
    """A latent space normalised per channel: model space = (latent − mean) · scale_factor / std."""

    mean: tuple[float, ...] = field(default=())
    std: tuple[float, ...] = field(default=())

    def _stats(self, latent: Tensor) -> tuple[Tensor, Tensor]:
        import torch

        view = (1, self.channels, *([1] * (latent.ndim - 2)))
        mean = torch.tensor(self.mean, dtype=latent.dtype, device=latent.device).view(view)
        std = torch.tensor(self.std, dtype=latent.dtype, device=latent.device).view(view)
        return mean, std

    def process_in(self, latent: Tensor) -> Tensor:
        mean, std = self._stats(latent)
        return (latent - mean) * self.scale_factor / std

    def process_out(self, latent: Tensor) -> Tensor:
        mean, std = self._stats(latent)
        return latent * std / self.scale_factor + mean

    @property
    def tag(self) -> str:
        return f"{self.channels}x{self.scale_factor}/wan21"


WAN21_LATENT = ChannelLatentFormat(
    channels=16,
    scale_factor=1.0,
    rgb_factors=(
        (-0.1299, -0.1692, 0.2932),
        (0.0671, 0.0406, 0.0442),
        (0.3568, 0.2548, 0.1747),
        (0.0372, 0.2344, 0.1420),
        (0.0313, 0.0189, -0.0328),
        (0.0296, -0.0956, -0.0665),
        (-0.3477, -0.4059, -0.2925),
        (0.0166, 0.1902, 0.1975),
        (-0.0412, 0.0267, -0.1364),
        (-0.1293, 0.0740, 0.1636),
        (0.0680, 0.3019, 0.1128),
        (0.0032, 0.0581, 0.0639),
        (-0.1251, 0.0927, 0.1699),
        (0.0060, -0.0633, 0.0005),
        (0.3477, 0.2275, 0.2950),
        (0.1984, 0.0913, 0.1861),
    ),
    rgb_bias=(-0.1835, -0.0868, -0.3360),
    mean=LATENTS_MEAN,
    std=LATENTS_STD,
)
QWEN25_7B = TextEncoderSpec(
    "qwen25_7b",
    "model.",
    "qwen25vl",
    "text_encoder",
    "qwen_tokenizer",
    default_layer=-1,
    final_norm=True,
    pooled=False,
)
DIFFUSION_PREFIXES = ("model.diffusion_model.", "")
VAE_PREFIXES = ("", "first_stage_model.", "vae.")
SHIFT = 1.15


def transformer_prefix(index: TensorIndex) -> str | None:
    """Where a Qwen-Image transformer's tensors start in ``index`` (None: there is none)."""
    for prefix in DIFFUSION_PREFIXES:
        if all(
            index.has(f"{prefix}{k}")
            for k in ("img_in.weight", "txt_norm.weight", "transformer_blocks.0.img_mod.1.weight")
        ):
            return prefix
    return None


@dataclass(frozen=True)
class QwenImagePrompt:
    """ComfyUI's Qwen-Image text encoding: the Qwen2.5-VL encoder's hidden state of the templated
    prompt, the template's head dropped; no pooled vector. ``template`` replaces the default one and
    ``images`` (the vision tower's tokens of the edit nodes' pictures) go in at the prompt's
    ``<|image_pad|>`` tokens (TextEncodeQwenImageEdit / Plus)."""

    def encode(
        self,
        text: str,
        encoders: Sequence[ReadyEncoder],
        template: str | None = None,
        images: Sequence[ImageEmbeds] = (),
    ) -> tuple[Tensor, Tensor | None]:
        for enc in encoders:
            if isinstance(enc.kind, Qwen25VLText):
                return enc.kind.encode(enc.module, enc.tokenizer, text, enc.layer, template, images), None
        raise ModelLoadError(
            "Qwen-Image needs the Qwen2.5-VL-7B text encoder; load qwen_2.5_vl_7b.safetensors "
            "with CLIPLoader (type qwen_image)"
        )


@dataclass(frozen=True)
class QwenImage(FamilyAdapter):
    name: ClassVar[str] = "qwen_image"
    title: ClassVar[str] = "Qwen-Image"
    pipeline_class: ClassVar[str] = "QwenImagePipeline"
    latent_format: ClassVar[LatentFormat] = WAN21_LATENT
    denoiser: ClassVar[QwenImageTransformer] = QwenImageTransformer(WAN21_LATENT)  # type: ignore[assignment]
    vae: ClassVar[WanVae] = WanVae()  # type: ignore[assignment]
    prompt: ClassVar[QwenImagePrompt] = QwenImagePrompt()  # type: ignore[assignment]
    text_encoders: ClassVar[tuple[TextEncoderSpec, ...]] = (QWEN25_7B,)
    context_dim: ClassVar[int] = 3584  # Qwen2.5-VL-7B
    qwen: ClassVar[Qwen25VLText] = Qwen25VLText()
    vision: ClassVar[Qwen25Vision] = Qwen25Vision()

    @classmethod
    def detect(cls, index: TensorIndex) -> bool:
        return transformer_prefix(index) is not None

    @classmethod
    def detect_diffusers(cls, model_index: Any, unet: Any) -> bool:
        return False  # diffusers Qwen-Image folders have a transformer/, not a unet/: not supported yet

    # --- sampling -----------------------------------------------------------------------------
    def prediction_type(self, index: TensorIndex) -> str:
        return "flow"

    def model_sampling(self, prediction: str) -> Any:
        from nodes.diffusion.model_sampling import flow

        return flow(shift=SHIFT, multiplier=1.0)

    def default_resolution(self, prediction: str) -> int:
        return 1328

    # --- parts --------------------------------------------------------------------------------
    def denoiser_part(self, index: TensorIndex) -> Part:
        prefix = transformer_prefix(index)
        require(
            prefix is not None,
            index,
            "no Qwen-Image transformer tensors (img_in, txt_norm, transformer_blocks.N.img_mod) in this file",
        )
        assert prefix is not None
        return Part.make(
            "unet", self.denoiser, prefix, "transformer", self.denoiser.config_from_tensors(index, prefix)
        )

    def vae_part(self, index: TensorIndex, prefix: str) -> Part:
        return Part.make("vae", self.vae, prefix, "vae", self.vae.config_from_tensors(index, prefix))

    def text_encoder_part(self, spec: TextEncoderSpec, index: TensorIndex, prefix: str) -> Part:
        return Part.make(
            spec.name, self.qwen, prefix, spec.subfolder, self.qwen.config_from_tensors(index, prefix)
        )

    def vision_part(self, index: TensorIndex) -> Part | None:
        """The Qwen2.5-VL vision tower stored beside the text encoder (``visual.``), or None when the
        file holds none (or only part of one)."""
        if not self.vision.present(index, VISION_PREFIX):
            return None
        return Part.make(
            "visual",
            self.vision,
            VISION_PREFIX,
            "visual",
            self.vision.config_from_tensors(index, VISION_PREFIX),
        )

    def parts(self, index: TensorIndex) -> dict[str, tuple[Part, ...]]:
        raise ModelLoadError(
            f"{index.path}: this is a Qwen-Image transformer file, not an all-in-one checkpoint: put it in "
            "models/diffusion_models and load it with UNETLoader, the text encoder (qwen_2.5_vl_7b.safetensors) "
            "with CLIPLoader (type qwen_image) and the VAE (qwen_image_vae.safetensors) with VAELoader"
        )


def wan_vae_prefix(index: TensorIndex) -> str | None:
    """Where a Wan/Qwen-Image VAE's tensors start in ``index`` (None: it holds none)."""
    return next((p for p in VAE_PREFIXES if is_wan_vae(index, p)), None)
