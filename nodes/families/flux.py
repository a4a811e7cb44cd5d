"""Flux.1 dev and schnell: a ``FluxTransformer2DModel`` over 2×2-packed 16-channel latents, text
from T5-XXL (tokens, padded to 256 as ComfyUI does) and CLIP-L (its pooled vector only), the
16-channel KL VAE with scale 0.3611 and shift 0.1159 (ComfyUI's ``latent_formats.Flux``).

dev is guidance-distilled (a ``guidance_in`` embedder; FluxGuidance sets the value, 3.5 when
unset) and samples with ComfyUI's ``ModelSamplingFlux`` (Flux's exponential time shift, mu 1.15 by
default, set from the image size by the ModelSamplingFlux node); schnell has no guidance embedder
and samples with plain flow matching (ComfyUI's ``ModelSamplingDiscreteFlow``, shift 1, timestep =
sigma). Both take the timestep as sigma (see the transformer kind).

Files: ComfyUI's all-in-one checkpoints (``model.diffusion_model.*``, ``text_encoders.clip_l.*``,
``text_encoders.t5xxl.*``, the VAE under ``first_stage_model.`` or ``vae.``), and the separate files
users have: the transformer (BFL ``flux1-dev.safetensors``, with or without the prefix), the text
encoders (``clip_l.safetensors``, ``t5xxl_*.safetensors``) and ``ae.safetensors``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from nodes.core.parts import Part
from nodes.core.tensors import ModelLoadError, TensorIndex
from nodes.families.base import FamilyAdapter, TextEncoderSpec, require
from nodes.families.components.flux_dit import FluxTransformer
from nodes.families.components.t5_text import T5Text
from nodes.families.latent_format import LatentFormat

if TYPE_CHECKING:
    from torch import Tensor

    from nodes.families.prompt import ReadyEncoder

FLUX_LATENT = LatentFormat(
    channels=16,
    scale_factor=0.3611,
    shift=0.1159,
    rgb_factors=(
        (-0.0346, 0.0244, 0.0681),
        (0.0034, 0.0210, 0.0687),
        (0.0275, -0.0668, -0.0433),
        (-0.0174, 0.0160, 0.0617),
        (0.0859, 0.0721, 0.0329),
        (0.0004, 0.0383, 0.0115),
        (0.0405, 0.0861, 0.0915),
        (-0.0236, -0.0185, -0.0259),
        (-0.0245, 0.0250, 0.1180),
        (0.1008, 0.0755, -0.0421),
        (-0.0515, 0.0201, 0.0011),
        (0.0428, -0.0012, -0.0036),
        (0.0817, 0.0765, 0.0749),
        (-0.1264, -0.0522, -0.1103),
        (-0.0280, -0.0881, -0.0499),
        (-0.1262, -0.0982, -0.0778),
    ),
    rgb_bias=(-0.0329, -0.0718, -0.0851),
    taesd_decoder="taef1_decoder",
    empty_node="EmptySD3LatentImage",
)

CLIP_L = TextEncoderSpec(
    "clip_l",
    "text_encoders.clip_l.transformer.text_model.",
    "hf_clip",
    "text_encoder",
    "clip_tokenizer",
    default_layer=-1,
    final_norm=True,
    pooled=True,
)
T5XXL = TextEncoderSpec(
    "t5xxl",
    "text_encoders.t5xxl.transformer.",
    "t5",
    "text_encoder_2",
    "t5_tokenizer",
    default_layer=-1,
    final_norm=True,
    pooled=False,
)
DIFFUSION_PREFIXES = ("model.diffusion_model.", "")
VAE_PREFIXES = ("first_stage_model.", "vae.")


def transformer_prefix(index: TensorIndex) -> str | None:
    """Where a Flux.1 transformer's tensors start in ``index`` (None: there is none)."""
    for prefix in DIFFUSION_PREFIXES:
        if index.has(f"{prefix}double_blocks.0.img_attn.qkv.weight") and index.has(f"{prefix}img_in.weight"):
            return prefix
    return None


@dataclass(frozen=True)
class FluxPrompt:
    """ComfyUI's Flux text encoding: T5-XXL's last hidden state is the conditioning, CLIP-L's
    pooled output (first 77-token window) the pooled vector. ``clip_l`` and ``t5xxl`` may differ
    (CLIPTextEncodeFlux); CLIPTextEncode uses the same text for both."""

    def encode(self, text: str, encoders: Sequence[ReadyEncoder]) -> tuple[Tensor, Tensor | None]:
        return self.encode_pair(text, text, encoders)

    def encode_pair(
        self, clip_l: str, t5xxl: str, encoders: Sequence[ReadyEncoder]
    ) -> tuple[Tensor, Tensor | None]:
        embeds, pooled = None, None
        for enc in encoders:
            if isinstance(enc.kind, T5Text):
                embeds = enc.kind.encode(enc.module, enc.tokenizer, t5xxl, enc.options)
            else:
                _, pooled = enc.kind.encode(
                    enc.module, enc.tokenizer, clip_l, -1, final_norm=True, pooled=True
                )
        if embeds is None:
            raise ModelLoadError(
                "this model needs the T5-XXL text encoder; load it with DualCLIPLoader (type flux) "
                "or CLIPLoader (type chroma)"
            )
        return embeds, pooled


@dataclass(frozen=True)
class Flux(FamilyAdapter):
    name: ClassVar[str] = "flux"
    title: ClassVar[str] = "Flux.1"
    pipeline_class: ClassVar[str] = "FluxPipeline"
    latent_format: ClassVar[LatentFormat] = FLUX_LATENT
    denoiser: ClassVar[FluxTransformer] = FluxTransformer(latent_format=FLUX_LATENT)  # type: ignore[assignment]
    prompt: ClassVar[FluxPrompt] = FluxPrompt()  # type: ignore[assignment]
    text_encoders: ClassVar[tuple[TextEncoderSpec, ...]] = (CLIP_L, T5XXL)
    context_dim: ClassVar[int] = 4096  # T5-XXL
    t5: ClassVar[T5Text] = T5Text(min_length=256)

    @classmethod
    def detect(cls, index: TensorIndex) -> bool:
        prefix = transformer_prefix(index)
        return prefix is not None and not index.has(f"{prefix}distilled_guidance_layer.in_proj.weight")

    @classmethod
    def detect_diffusers(cls, model_index: Any, unet: Any) -> bool:
        return False  # diffusers Flux folders have a transformer/, not a unet/: not supported yet

    # --- sampling -----------------------------------------------------------------------------
    def prediction_type(self, index: TensorIndex) -> str:
        """``flux`` (dev: guidance-distilled, ModelSamplingFlux) or ``flow`` (schnell)."""
        prefix = transformer_prefix(index) or ""
        return "flux" if index.has(f"{prefix}guidance_in.in_layer.weight") else "flow"

    def model_sampling(self, prediction: str) -> Any:
        from nodes.diffusion import model_sampling as ms

        if prediction == "flux":
            return ms.flux(shift=1.15)
        if prediction == "flow":
            return ms.flow(shift=1.0, multiplier=1.0)
        raise ValueError(f"Flux samples as 'flux' (dev) or 'flow' (schnell), not {prediction!r}")

    def default_resolution(self, prediction: str) -> int:
        return 1024

    # --- parts --------------------------------------------------------------------------------
    def denoiser_part(self, index: TensorIndex) -> Part:
        prefix = transformer_prefix(index)
        require(
            prefix is not None,
            index,
            "no Flux.1 transformer tensors (double_blocks.*, img_in.*) in this file",
        )
        assert prefix is not None
        return Part.make(
            "unet", self.denoiser, prefix, "transformer", self.denoiser.config_from_tensors(index, prefix)
        )

    def vae_part(self, index: TensorIndex, prefix: str) -> Part:
        cfg = self.vae.config_from_tensors(index, prefix, self.latent_format.scale_factor, 1024)
        if cfg.get("latent_channels") != self.latent_format.channels:
            raise ModelLoadError(
                f"{index.path}: this VAE makes {cfg.get('latent_channels')}-channel latents; "
                f"Flux needs the 16-channel Flux VAE (ae.safetensors)"
            )
        return Part.make("vae", self.vae, prefix, "vae", cfg)

    def text_encoder_part(self, spec: TextEncoderSpec, index: TensorIndex, prefix: str) -> Part:
        if spec.layout == "t5":
            return Part.make(
                spec.name, self.t5, prefix, spec.subfolder, self.t5.config_from_tensors(index, prefix)
            )
        return super().text_encoder_part(spec, index, prefix)

    def parts(self, index: TensorIndex) -> dict[str, tuple[Part, ...]]:
        """The parts of a ComfyUI all-in-one Flux checkpoint."""
        vae_prefix = next((p for p in VAE_PREFIXES if index.has(f"{p}decoder.conv_out.weight")), None)
        missing = [s.name for s in self.text_encoders if not index.any_with(s.prefix)]
        if vae_prefix is None or missing:
            what = ", ".join([*missing, *([] if vae_prefix else ["vae"])])
            raise ModelLoadError(
                f"{index.path}: this Flux file has no {what}; it is a transformer-only file: put it in "
                "models/diffusion_models and load it with UNETLoader, the text encoders with DualCLIPLoader "
                "(type flux) and the VAE (ae.safetensors) with VAELoader"
            )
        clips = tuple(self.text_encoder_part(s, index, s.prefix) for s in self.text_encoders)
        return {
            "unet": (self.denoiser_part(index),),
            "clip": clips,
            "vae": (self.vae_part(index, vae_prefix),),
        }


@dataclass(frozen=True)
class Chroma(Flux):
    """Chroma (Flux.1-schnell derived): the Flux blocks with one modulation approximator
    (``distilled_guidance_layer``) instead of per-block modulation, T5-XXL only (no CLIP-L, no
    pooled vector; ComfyUI does not pad its T5 tokens: min_length 1), real CFG with a negative
    prompt, ModelSamplingFlux with mu 1.15, the Flux VAE.

    Test-size note: ComfyUI always builds 344 modulation rows and takes the final layer's from the
    last two; diffusers (and so Loom) builds 3·single + 12·double + 2. They agree at the real depth
    (19 + 38 blocks), not for reduced-depth test models."""

    name: ClassVar[str] = "chroma"
    title: ClassVar[str] = "Chroma"
    pipeline_class: ClassVar[str] = "ChromaPipeline"
    denoiser: ClassVar[FluxTransformer] = FluxTransformer(approximator=True, latent_format=FLUX_LATENT)  # type: ignore[assignment]
    text_encoders: ClassVar[tuple[TextEncoderSpec, ...]] = (T5XXL,)
    t5: ClassVar[T5Text] = T5Text(min_length=1)

    @classmethod
    def detect(cls, index: TensorIndex) -> bool:
        prefix = transformer_prefix(index)
        return prefix is not None and index.has(f"{prefix}distilled_guidance_layer.in_proj.weight")

    def prediction_type(self, index: TensorIndex) -> str:
        return "flux"
