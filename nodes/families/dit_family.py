"""The base of the diffusion-transformer families (Flux.1, Chroma, SD3, Flux.2, Qwen-Image, Z-Image),
written once. A DiT family is a declaration (ComfyUI's ``supported_models`` entries carry the same
facts): the tensors that mark its transformer (``markers``, looked for under each of
``diffusion_prefixes``; ``absent_markers`` must not be there), how its checkpoints sample (``sampling``,
``prediction`` and ``prediction_markers``), its default size, its component kinds (denoiser, VAE,
text encoders with their prompt recipe), its latent format, where a ComfyUI all-in-one checkpoint keeps
the parts (``checkpoint``; None: the family ships as separate files only) and how users load the
separate files (``separate_files``, for the messages).

Users mostly have the separate files: the transformer (UNETLoader: :meth:`DiTFamily.denoiser_part`),
the text encoders (CLIPLoader / DualCLIPLoader: :meth:`~FamilyAdapter.text_encoder_part`) and the VAE
(VAELoader: ``nodes.families.catalog.standalone_vae``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from nodes.core.parts import Part
from nodes.core.tensors import ModelLoadError, TensorIndex
from nodes.families.base import FamilyAdapter, require
from nodes.families.components import KLVae, TransformerKind, VaeKind

DIFFUSION_PREFIXES = ("model.diffusion_model.", "")  # ComfyUI's checkpoints, or the bare transformer


@dataclass(frozen=True)
class Checkpoint:
    """Where a ComfyUI all-in-one checkpoint of the family keeps its parts: the VAE under the first of
    ``vae_prefixes`` that holds one, each text encoder ``(name, prefix)`` of ``text_encoders`` (all of
    them, or with ``every_text_encoder`` False whichever it holds: SAI's SD3 files hold none), and the
    transformer under ``denoiser_prefix`` (None: any of the family's)."""

    vae_prefixes: tuple[str, ...]
    text_encoders: tuple[tuple[str, str], ...]
    every_text_encoder: bool = True
    denoiser_prefix: str | None = None


class DiTFamily(FamilyAdapter):
    """A diffusion-transformer family (see the module docstring)."""

    markers: ClassVar[tuple[str, ...]]
    absent_markers: ClassVar[tuple[str, ...]] = ()
    diffusion_prefixes: ClassVar[tuple[str, ...]] = DIFFUSION_PREFIXES
    resolution: ClassVar[int] = 1024
    prediction: ClassVar[str] = "flow"  # what its checkpoints predict ...
    prediction_markers: ClassVar[tuple[tuple[str, str], ...]] = ()  # ... unless one has (tensor, prediction)
    denoiser: ClassVar[TransformerKind]
    vae: ClassVar[VaeKind] = KLVae()
    vae_needed: ClassVar[str] = ""  # the VAE a KL file must be (its latent channels are checked), or ""
    checkpoint: ClassVar[Checkpoint | None] = None
    separate_files: ClassVar[str]  # "the text encoder (...) with CLIPLoader (type ...) and the VAE (...) ..."
    architecture: ClassVar[str] = ""  # what its transformer files are called in messages (default: title)

    # --- recognition --------------------------------------------------------------------------
    @classmethod
    def transformer_prefix(cls, index: TensorIndex) -> str | None:
        """Where the family's transformer tensors start in ``index`` (None: there are none)."""
        for prefix in cls.diffusion_prefixes:
            if all(index.has(f"{prefix}{marker}") for marker in cls.markers):
                return prefix
        return None

    @classmethod
    def detect(cls, index: TensorIndex) -> bool:
        prefix = cls.transformer_prefix(index)
        return prefix is not None and not any(index.has(f"{prefix}{m}") for m in cls.absent_markers)

    @classmethod
    def detect_diffusers(cls, model_index: Any, unet: Any) -> bool:
        return False  # diffusers folders of a DiT have a transformer/, not a unet/: not supported yet

    @classmethod
    def file_title(cls) -> str:
        return cls.architecture or cls.title

    # --- sampling -----------------------------------------------------------------------------
    def prediction_type(self, index: TensorIndex) -> str:
        prefix = self.transformer_prefix(index) or ""
        found = (p for marker, p in self.prediction_markers if index.has(f"{prefix}{marker}"))
        return next(found, self.prediction)

    def default_resolution(self, prediction: str) -> int:
        return self.resolution

    # --- parts --------------------------------------------------------------------------------
    def denoiser_part(self, index: TensorIndex) -> Part:
        prefix = self.transformer_prefix(index)
        require(
            prefix is not None,
            index,
            f"no {self.title} transformer tensors ({', '.join(self.markers)}) in this file",
        )
        assert prefix is not None
        return Part.make(
            "unet", self.denoiser, prefix, "transformer", self.denoiser.config_from_tensors(index, prefix)
        )

    def vae_part(self, index: TensorIndex, prefix: str) -> Part:
        cfg = self.vae.config_for(index, prefix, self.latent_format, self.resolution)
        if self.vae_needed and self.vae.latent_channels(cfg) != self.latent_format.channels:
            raise ModelLoadError(
                f"{index.path}: this VAE makes {self.vae.latent_channels(cfg)}-channel latents; "
                f"{self.file_title()} needs {self.vae_needed}"
            )
        return Part.make("vae", self.vae, prefix, "vae", cfg)

    def parts(self, index: TensorIndex) -> dict[str, tuple[Part, ...]]:
        """The parts of a ComfyUI all-in-one checkpoint (``checkpoint``)."""
        layout = self.checkpoint
        if layout is None:
            raise self.separate_files_error(index, "text encoder or VAE")
        vae = next((p for p in layout.vae_prefixes if self.vae.present(index, p)), None)
        missing = [name for name, prefix in layout.text_encoders if not index.any_with(prefix)]
        missing = missing if layout.every_text_encoder else []
        wrong_place = layout.denoiser_prefix not in (None, self.transformer_prefix(index))
        if vae is None or missing or wrong_place:
            raise self.separate_files_error(index, ", ".join([*missing, *([] if vae else ["vae"])]))
        clips = tuple(
            self.text_encoder_part(self.spec(name), index, prefix)
            for name, prefix in layout.text_encoders
            if index.any_with(prefix)
        )
        return {"unet": (self.denoiser_part(index),), "clip": clips, "vae": (self.vae_part(index, vae),)}

    def separate_files_error(self, index: TensorIndex, missing: str) -> ModelLoadError:
        return ModelLoadError(
            f"{index.path}: this {self.file_title()} file has no {missing or 'text encoder or VAE'}: it is "
            "a transformer-only file, not an all-in-one checkpoint; put it in models/diffusion_models and "
            f"load it with UNETLoader, {self.separate_files}"
        )
