"""SD3 medium, SD3.5 large and SD3.5 medium: an ``SD3Transformer2DModel`` (MMDiT; MMDiT-X for 3.5
medium) on the 16-channel SD3 latent (ComfyUI's ``latent_formats.SD3``: scale 1.5305, shift
0.0609), text from CLIP-L, CLIP-G and T5-XXL, flow matching with ComfyUI's
``ModelSamplingDiscreteFlow`` (shift 3.0, timestep = 1000·sigma), real CFG.

Text, as ComfyUI's ``sd3_clip.py`` builds it: CLIP-L and CLIP-G take their penultimate hidden
states (no final norm), side by side (768 + 1280 = 2048 wide), zero-padded to T5's width (4096), and
T5-XXL's last hidden state (tokens padded to 77, not diffusers' 256) follows them along the token
axis; the pooled vector is CLIP-L's pooled output (final-normed end token, *not* projected — the
SAI reference and ComfyUI both skip CLIP-L's projection) ‖ CLIP-G's projected one. An encoder that
is not loaded contributes zeros of its real width (T5 absent: the CLIP tokens alone; everything
absent: 77 zero tokens).

Files: SAI/ComfyUI all-in-one checkpoints (``model.diffusion_model.*``,
``text_encoders.{clip_l,clip_g,t5xxl}.transformer.*`` — any subset —, ``first_stage_model.*``), the
transformer alone (``models/diffusion_models``) and the text encoders alone (``clip_l``, ``clip_g``
with ``text_model.*`` + ``text_projection.weight``, ``t5xxl``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar

from nodes.core.parts import Part
from nodes.core.tensors import ModelLoadError, TensorIndex
from nodes.families import arch
from nodes.families.base import FamilyAdapter, TextEncoderSpec, require
from nodes.families.components.clip_text import ClipText
from nodes.families.components.sd3_dit import SD3Transformer
from nodes.families.components.t5_text import T5Text
from nodes.families.latent_format import LatentFormat

if TYPE_CHECKING:
    from torch import Tensor

    from nodes.families.prompt import ReadyEncoder

SD3_LATENT = LatentFormat(
    channels=16,
    scale_factor=1.5305,
    shift=0.0609,
    rgb_factors=(
        (-0.0922, -0.0175, 0.0749),
        (0.0311, 0.0633, 0.0954),
        (0.1994, 0.0927, 0.0458),
        (0.0856, 0.0339, 0.0902),
        (0.0587, 0.0272, -0.0496),
        (-0.0006, 0.1104, 0.0309),
        (0.0978, 0.0306, 0.0427),
        (-0.0042, 0.1038, 0.1358),
        (-0.0194, 0.0020, 0.0669),
        (-0.0488, 0.0130, -0.0268),
        (0.0922, 0.0988, 0.0951),
        (-0.0278, 0.0524, -0.0542),
        (0.0332, 0.0456, 0.0895),
        (-0.0069, -0.0030, -0.0810),
        (-0.0596, -0.0465, -0.0293),
        (-0.1448, -0.1463, -0.1189),
    ),
    rgb_bias=(0.2394, 0.2135, 0.1925),
    taesd_decoder="taesd3_decoder",
)

CLIP_L = TextEncoderSpec(
    "clip_l",
    "text_encoders.clip_l.transformer.text_model.",
    "hf_clip",
    "text_encoder",
    "clip_tokenizer",
    default_layer=-2,
    final_norm=False,
    pooled=True,
)
CLIP_G = TextEncoderSpec(
    "clip_g",
    "text_encoders.clip_g.transformer.",
    "hf_clip",
    "text_encoder_2",
    "clip_tokenizer_2",
    default_layer=-2,
    final_norm=False,
    pooled=True,
)
T5XXL = TextEncoderSpec(
    "t5xxl",
    "text_encoders.t5xxl.transformer.",
    "t5",
    "text_encoder_3",
    "t5_tokenizer",
    default_layer=-1,
    final_norm=True,
    pooled=False,
)
DIFFUSION_PREFIXES = ("model.diffusion_model.", "")
WIDTHS = {"clip_l": 768, "clip_g": 1280, "t5xxl": 4096}  # of the real encoders: the zeros of a missing one
CLIP_TOKENS = 77


def transformer_prefix(index: TensorIndex) -> str | None:
    """Where an SD3 transformer's tensors start in ``index`` (None: there is none)."""
    for prefix in DIFFUSION_PREFIXES:
        if index.has(f"{prefix}joint_blocks.0.x_block.attn.qkv.weight") and index.has(
            f"{prefix}x_embedder.proj.weight"
        ):
            return prefix
    return None


@dataclass(frozen=True)
class NestedClipText(ClipText):
    """CLIP-G as SD3 files store it: transformers' ``CLIPTextModelWithProjection`` names
    (``text_model.*`` and ``text_projection.weight``) under one prefix."""

    layout: str = "hf_clip"
    projection: bool = True

    @property
    def id(self) -> str:
        return "clip_text/hf_clip+projection+nested"

    def to_diffusers(self, sd: Any, config: Any) -> dict[str, Any]:
        return {k.removeprefix("text_model."): v for k, v in sd.items() if not k.endswith("position_ids")}

    def to_original(self, sd: Any, config: Any) -> dict[str, Any]:
        return {
            k if k.startswith("text_projection.") else f"text_model.{k.removeprefix('text_model.')}": v
            for k, v in sd.items()
            if not k.endswith("position_ids")
        }


def clip_g_config(index: TensorIndex, prefix: str) -> dict[str, Any]:
    """CLIP-G's ``CLIPTextConfig`` kwargs from an SD3-layout file (OpenCLIP's GELU, the projection)."""
    if not index.has(f"{prefix}text_projection.weight"):
        raise ModelLoadError(
            f"{index.path}: the CLIP-G text encoder has no text_projection.weight, which SD3's "
            "pooled vector needs; use the clip_g.safetensors of the SD3/SD3.5 release"
        )
    cfg = arch.clip_config(index, f"{prefix}text_model.", "hf_clip")
    return cfg | {"hidden_act": "gelu", "projection_dim": index.shape(f"{prefix}text_projection.weight")[0]}


@dataclass(frozen=True)
class SD3Prompt:
    """ComfyUI's SD3 text encoding (see the module docstring). ``CLIPTextEncode`` sends the same text
    to the three encoders; ``CLIPTextEncodeSD3`` may send different ones and, with empty_padding
    "none", leaves an empty prompt out instead of encoding it."""

    def encode(self, text: str, encoders: Sequence[ReadyEncoder]) -> tuple[Tensor, Tensor | None]:
        return self.encode_triple(text, text, text, encoders, drop_empty=False)

    def encode_triple(
        self, clip_l: str, clip_g: str, t5xxl: str, encoders: Sequence[ReadyEncoder], *, drop_empty: bool
    ) -> tuple[Tensor, Tensor | None]:
        import torch

        by_name = {enc.spec.name: enc for enc in encoders}
        if not by_name:
            raise ModelLoadError(
                "this CLIP holds no text encoder: the SD3 checkpoint it came from has none; load "
                "clip_l, clip_g and t5xxl with TripleCLIPLoader and encode with its CLIP"
            )
        t5 = by_name.get("t5xxl")
        width = int(t5.module.config.d_model) if t5 is not None else WIDTHS["t5xxl"]
        texts = {"clip_l": clip_l, "clip_g": clip_g}
        if drop_empty and not clip_l and not clip_g:  # both CLIP prompts left out: pooled zeros
            out = None
            pooled = torch.zeros(1, sum(_pooled_width(by_name.get(n), n) for n in texts))
        else:
            # one empty CLIP prompt is encoded as the empty prompt either way (ComfyUI pads its tokens so)
            out, pooled = _encode_clips(by_name, texts, width)
        if t5 is not None:
            kind = replace(t5.kind, min_length=1) if drop_empty and not t5xxl else t5.kind  # [</s>] alone
            t5_out = kind.encode(t5.module, t5.tokenizer, t5xxl)
            out = t5_out if out is None else torch.cat([out.to(t5_out), t5_out], dim=-2)
        if out is None:
            out = torch.zeros(1, CLIP_TOKENS, width)
        return out, pooled


def _encode_clips(
    by_name: dict[str, ReadyEncoder], texts: dict[str, str], width: int
) -> tuple[Tensor | None, Tensor]:
    """CLIP-L's and CLIP-G's tokens side by side (CLIP-L's columns zeros without it; no CLIP-G
    columns without it), zero-padded to ``width``; and their pooled vectors, concatenated (zeros of
    the real width for an encoder not loaded)."""
    import torch
    import torch.nn.functional as F

    hidden, pools = {}, {}
    for name, text in texts.items():
        enc = by_name.get(name)
        if enc is not None:
            hidden[name], pools[name] = _clip(enc, text)
    _pad_chunks(hidden, by_name)
    out = None
    if hidden:
        g = hidden.get("clip_g")
        lg = hidden.get("clip_l")
        if lg is None:
            assert g is not None
            lg = g.new_zeros(1, g.shape[1], WIDTHS["clip_l"])
        lg = lg if g is None else torch.cat([lg, g], dim=-1)
        out = F.pad(lg, (0, max(0, width - lg.shape[-1])))
    pooled = [
        pools[n].float().cpu() if n in pools else torch.zeros(1, WIDTHS[n]) for n in ("clip_l", "clip_g")
    ]
    return out, torch.cat(pooled, dim=-1)


def _clip(enc: ReadyEncoder, text: str) -> tuple[Tensor, Tensor]:
    z, pooled = enc.kind.encode(
        enc.module, enc.tokenizer, text, enc.layer, final_norm=enc.spec.final_norm, pooled=True
    )
    assert pooled is not None
    return z, pooled


def _pooled_width(enc: ReadyEncoder | None, name: str) -> int:
    """The width of an encoder's pooled output (CLIP-L: unprojected; CLIP-G: projected)."""
    if enc is None:
        return WIDTHS[name]
    config = enc.module.config
    return int(getattr(config, "projection_dim", 0) if name == "clip_g" else config.hidden_size)


def _pad_chunks(hidden: dict[str, Tensor], by_name: dict[str, ReadyEncoder]) -> None:
    """CLIP-L and CLIP-G as many 77-token chunks as each other: the shorter one gets the empty
    prompt's chunk repeated (ComfyUI's CLIPTextEncodeSD3 rule)."""
    import torch

    if len(hidden) < 2:
        return
    chunks = {name: z.shape[1] // CLIP_TOKENS for name, z in hidden.items()}
    most = max(chunks.values())
    for name, n in chunks.items():
        if n < most:
            empty, _ = _clip(by_name[name], "")
            hidden[name] = torch.cat([hidden[name], *([empty] * (most - n))], dim=1)


@dataclass(frozen=True)
class SD3(FamilyAdapter):
    name: ClassVar[str] = "sd3"
    title: ClassVar[str] = "SD3"
    pipeline_class: ClassVar[str] = "StableDiffusion3Pipeline"
    latent_format: ClassVar[LatentFormat] = SD3_LATENT
    denoiser: ClassVar[SD3Transformer] = SD3Transformer()  # type: ignore[assignment]
    prompt: ClassVar[SD3Prompt] = SD3Prompt()  # type: ignore[assignment]
    text_encoders: ClassVar[tuple[TextEncoderSpec, ...]] = (CLIP_L, CLIP_G, T5XXL)
    context_dim: ClassVar[int] = 4096  # T5-XXL
    t5: ClassVar[T5Text] = T5Text(min_length=77)
    shift: ClassVar[float] = 3.0

    @classmethod
    def detect(cls, index: TensorIndex) -> bool:
        return transformer_prefix(index) is not None

    @classmethod
    def detect_diffusers(cls, model_index: Any, unet: Any) -> bool:
        return False  # diffusers SD3 folders have a transformer/, not a unet/: not supported yet

    # --- sampling -----------------------------------------------------------------------------
    def prediction_type(self, index: TensorIndex) -> str:
        return "flow"

    def model_sampling(self, prediction: str) -> Any:
        from nodes.diffusion import model_sampling as ms

        if prediction != "flow":
            raise ValueError(f"SD3 samples as 'flow', not {prediction!r}")
        return ms.flow(shift=self.shift, multiplier=1000.0)

    def default_resolution(self, prediction: str) -> int:
        return 1024

    # --- parts --------------------------------------------------------------------------------
    def denoiser_part(self, index: TensorIndex) -> Part:
        prefix = transformer_prefix(index)
        require(
            prefix is not None,
            index,
            "no SD3 transformer tensors (joint_blocks.*, x_embedder.*) in this file",
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
                "SD3 needs its 16-channel VAE"
            )
        return Part.make("vae", self.vae, prefix, "vae", cfg)

    def text_encoder_part(self, spec: TextEncoderSpec, index: TensorIndex, prefix: str) -> Part:
        if spec.layout == "t5":
            return Part.make(
                spec.name, self.t5, prefix, spec.subfolder, self.t5.config_from_tensors(index, prefix)
            )
        if spec.name == "clip_g":
            return Part.make(
                spec.name, NestedClipText(), prefix, spec.subfolder, clip_g_config(index, prefix)
            )
        return super().text_encoder_part(spec, index, prefix)

    def parts(self, index: TensorIndex) -> dict[str, tuple[Part, ...]]:
        """The parts of an SAI/ComfyUI SD3 checkpoint: the transformer, the VAE and whichever text
        encoders it holds (SAI's ``sd3.5_*.safetensors`` hold none: their CLIP output is empty and
        the workflow loads the encoders with TripleCLIPLoader, as in ComfyUI)."""
        if not index.has(f"{self.vae_prefix}decoder.conv_out.weight"):
            raise ModelLoadError(
                f"{index.path}: this SD3 file has no VAE; it is a transformer-only file: put it in "
                "models/diffusion_models and load it with UNETLoader, the text encoders with TripleCLIPLoader "
                "(clip_l, clip_g, t5xxl) and the VAE with VAELoader"
            )
        clips = tuple(
            self.text_encoder_part(s, index, s.prefix) for s in self.text_encoders if index.any_with(s.prefix)
        )
        return {
            "unet": (self.denoiser_part(index),),
            "clip": clips,
            "vae": (self.vae_part(index, self.vae_prefix),),
        }
