"""Flux.2 (Klein and dev): a ``Flux2Transformer2DModel`` over 128-channel latents (the 32-channel
Flux.2 VAE's latent in 2×2 patches, BatchNorm-normalised: ComfyUI's ``latent_formats.Flux2``, scale 1,
shift 0), text from stacked LLM hidden states, sampled as ComfyUI's ``supported_models.Flux2``:
``ModelSamplingFlux`` with shift (mu) 2.02, the timestep is sigma; ComfyUI's templates replace the
schedule with ``Flux2Scheduler`` (mu from the image size and step count).

Klein and dev share the key layout (diffusers cannot tell them apart); Loom tells them by tensors:
dev has the guidance embedder (``guidance_in``, FluxGuidance sets the value) and a 15360-wide text
input (Mistral-Small 3.x, layers 10/20/30); Klein has no guidance embedder and takes Qwen3's layers
9/18/27 (7680 wide for Qwen3-4B, 12288 for Qwen3-8B).

Files as users have them: the transformer alone (``flux-2-klein-4b.safetensors`` in
``models/diffusion_models``, with or without ``model.diffusion_model.``; UNETLoader), the text encoder
alone (``qwen_3_4b.safetensors`` for Klein, ``mistral_3_small_flux2_bf16.safetensors`` with its tekken
tokenizer inside for dev; CLIPLoader type ``flux2``) and ``flux2-vae.safetensors`` (VAELoader); and
ComfyUI-saved Klein checkpoints (CheckpointLoaderSimple: ``model.diffusion_model.``,
``text_encoders.qwen3_4b.transformer.model.``, ``vae.``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from nodes.core.parts import Part
from nodes.core.tensors import ModelLoadError, TensorIndex
from nodes.families.base import FamilyAdapter, TextEncoderSpec, require
from nodes.families.components.flux2_dit import Flux2Transformer
from nodes.families.components.flux2_vae import Flux2Vae, is_flux2_vae
from nodes.families.components.klein_text import KleinText
from nodes.families.components.mistral_text import MistralText
from nodes.families.latent_format import LatentFormat

if TYPE_CHECKING:
    from torch import Tensor

    from nodes.families.prompt import ReadyEncoder

_RGB32 = (  # ComfyUI's latent->RGB rows for the 32 VAE channels (comfy/latent_formats.py, Flux2)
    (0.0058, 0.0113, 0.0073),
    (0.0495, 0.0443, 0.0836),
    (-0.0099, 0.0096, 0.0644),
    (0.2144, 0.3009, 0.3652),
    (0.0166, -0.0039, -0.0054),
    (0.0157, 0.0103, -0.0160),
    (-0.0398, 0.0902, -0.0235),
    (-0.0052, 0.0095, 0.0109),
    (-0.3527, -0.2712, -0.1666),
    (-0.0301, -0.0356, -0.0180),
    (-0.0107, 0.0078, 0.0013),
    (0.0746, 0.0090, -0.0941),
    (0.0156, 0.0169, 0.0070),
    (-0.0034, -0.0040, -0.0114),
    (0.0032, 0.0181, 0.0080),
    (-0.0939, -0.0008, 0.0186),
    (0.0018, 0.0043, 0.0104),
    (0.0284, 0.0056, -0.0127),
    (-0.0024, -0.0022, -0.0030),
    (0.1207, -0.0026, 0.0065),
    (0.0128, 0.0101, 0.0142),
    (0.0137, -0.0072, -0.0007),
    (0.0095, 0.0092, -0.0059),
    (0.0000, -0.0077, -0.0049),
    (-0.0465, -0.0204, -0.0312),
    (0.0095, 0.0012, -0.0066),
    (0.0290, -0.0034, 0.0025),
    (0.0220, 0.0169, -0.0048),
    (-0.0332, -0.0457, -0.0468),
    (-0.0085, 0.0389, 0.0609),
    (-0.0076, 0.0003, -0.0043),
    (-0.0111, -0.0460, -0.0614),
)
# ComfyUI un-patchifies the 128 channels to 32 at twice the size before the map; Loom's linear preview works per
# latent pixel, so each VAE channel's row serves its 4 patch channels at a quarter weight (the 2x2 average).
FLUX2_LATENT = LatentFormat(
    channels=128,
    scale_factor=1.0,
    downscale=16,
    rgb_factors=tuple((r / 4, g / 4, b / 4) for r, g, b in _RGB32 for _ in range(4)),
    rgb_bias=(-0.0329, -0.0718, -0.0851),
    empty_node="EmptyFlux2LatentImage",
)
QWEN3 = TextEncoderSpec(
    "qwen3_4b",
    "model.",
    "qwen3",
    "text_encoder",
    "qwen_tokenizer",
    default_layer=-1,
    final_norm=False,
    pooled=False,
)
MISTRAL3 = TextEncoderSpec(
    "mistral3_24b",
    "model.",
    "mistral3",
    "text_encoder",
    "tekken",
    default_layer=-1,
    final_norm=False,
    pooled=False,
)
DIFFUSION_PREFIXES = ("model.diffusion_model.", "")
SHIFT = 2.02  # ComfyUI's supported_models.Flux2 sampling_settings
CHECKPOINT_QWEN3 = "text_encoders.qwen3_4b.transformer.model."  # where ComfyUI saves Klein's encoder
CHECKPOINT_VAE = "vae."


def transformer_prefix(index: TensorIndex) -> str | None:
    """Where a Flux.2 transformer's tensors start in ``index`` (None: there is none). Flux.2 shares one
    modulation per stream (``double_stream_modulation_img``), Flux.1 has one per block."""
    for prefix in DIFFUSION_PREFIXES:
        if index.has(f"{prefix}double_stream_modulation_img.lin.weight") and index.has(
            f"{prefix}img_in.weight"
        ):
            return prefix
    return None


def variant(index: TensorIndex) -> str:
    """``dev`` (guidance-distilled, Mistral text) or ``klein`` (Qwen3 text)."""
    prefix = transformer_prefix(index) or ""
    return "dev" if index.has(f"{prefix}guidance_in.in_layer.weight") else "klein"


@dataclass(frozen=True)
class Flux2Prompt:
    """ComfyUI's Flux.2 text encoding: the stacked hidden states of the one LLM encoder are the
    conditioning; there is no pooled vector."""

    def encode(self, text: str, encoders: Sequence[ReadyEncoder]) -> tuple[Tensor, Tensor | None]:
        for enc in encoders:
            if isinstance(enc.kind, KleinText | MistralText):
                return enc.kind.encode(enc.module, enc.tokenizer, text, enc.layer), None
        raise ModelLoadError(
            "Flux.2 needs its LLM text encoder (Qwen3 for Klein, Mistral-Small for dev); load it "
            "with CLIPLoader (type flux2)"
        )


@dataclass(frozen=True)
class Flux2(FamilyAdapter):
    name: ClassVar[str] = "flux2"
    title: ClassVar[str] = "Flux.2"
    pipeline_class: ClassVar[str] = "Flux2KleinPipeline"
    latent_format: ClassVar[LatentFormat] = FLUX2_LATENT
    denoiser: ClassVar[Flux2Transformer] = Flux2Transformer()  # type: ignore[assignment]
    vae: ClassVar[Flux2Vae] = Flux2Vae()  # type: ignore[assignment]
    prompt: ClassVar[Flux2Prompt] = Flux2Prompt()  # type: ignore[assignment]
    text_encoders: ClassVar[tuple[TextEncoderSpec, ...]] = (QWEN3, MISTRAL3)
    context_dim: ClassVar[int] = 7680  # Klein 4B: 3 × Qwen3-4B's 2560
    klein_text: ClassVar[KleinText] = KleinText()

    @classmethod
    def detect(cls, index: TensorIndex) -> bool:
        return transformer_prefix(index) is not None

    @classmethod
    def detect_diffusers(cls, model_index: Any, unet: Any) -> bool:
        return False  # diffusers Flux.2 folders have a transformer/, not a unet/: not supported yet

    # --- sampling -----------------------------------------------------------------------------
    def prediction_type(self, index: TensorIndex) -> str:
        return "flux"

    def model_sampling(self, prediction: str) -> Any:
        from nodes.diffusion import model_sampling as ms

        return ms.flux(shift=SHIFT)

    def default_resolution(self, prediction: str) -> int:
        return 1024

    # --- parts --------------------------------------------------------------------------------
    def denoiser_part(self, index: TensorIndex) -> Part:
        prefix = transformer_prefix(index)
        require(
            prefix is not None,
            index,
            "no Flux.2 transformer tensors (double_stream_modulation_img, img_in) in this file",
        )
        assert prefix is not None
        return Part.make(
            "unet", self.denoiser, prefix, "transformer", self.denoiser.config_from_tensors(index, prefix)
        )

    def vae_part(self, index: TensorIndex, prefix: str) -> Part:
        return Part.make("vae", self.vae, prefix, "vae", self.vae.config_from_tensors(index, prefix))

    def text_encoder_part(self, spec: TextEncoderSpec, index: TensorIndex, prefix: str) -> Part:
        if spec.layout == "qwen3":
            kind = self.klein_text
            return Part.make(spec.name, kind, prefix, spec.subfolder, kind.config_from_tensors(index, prefix))
        mistral = MistralText(file=str(index.path))
        return Part.make(
            spec.name, mistral, prefix, spec.subfolder, mistral.config_from_tensors(index, prefix)
        )

    def parts(self, index: TensorIndex) -> dict[str, tuple[Part, ...]]:
        """The parts of a ComfyUI-saved Flux.2 Klein checkpoint (``model.diffusion_model.``,
        ``text_encoders.qwen3_4b.transformer.model.``, ``vae.``)."""
        qwen = f"{CHECKPOINT_QWEN3}layers.0.self_attn.q_norm.weight"
        has_vae = transformer_prefix(index) == "model.diffusion_model." and is_flux2_vae(
            index, CHECKPOINT_VAE
        )
        if not (has_vae and index.has(qwen)):
            raise ModelLoadError(
                f"{index.path}: this is a Flux.2 transformer file, not an all-in-one checkpoint: put it in "
                "models/diffusion_models and load it with UNETLoader, the text encoder (qwen_3_4b.safetensors for "
                "Klein, the Mistral-Small file for dev) with CLIPLoader (type flux2) and the VAE "
                "(flux2-vae.safetensors) with VAELoader"
            )
        return {
            "unet": (self.denoiser_part(index),),
            "clip": (self.text_encoder_part(QWEN3, index, CHECKPOINT_QWEN3),),
            "vae": (self.vae_part(index, CHECKPOINT_VAE),),
        }
