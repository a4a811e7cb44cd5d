"""The base of the UNet families (SD1.x, SD2.x, SDXL), written once: a ``UNet2DConditionModel`` under
``model.diffusion_model.``, the KL VAE under ``first_stage_model.``, CLIP text encoders whose outputs
are concatenated (ComfyUI's ``CLIPTextEncode``), the discrete-time VP schedule; single-file
checkpoints hold all three, diffusers folders a subfolder each. A UNet family declares its
detection, text encoders, head rule, latent format and what its checkpoints differ in."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from nodes.core.parts import Part
from nodes.core.tensors import ModelLoadError, TensorIndex
from nodes.families import arch
from nodes.families.base import FamilyAdapter, TextEncoderSpec
from nodes.families.components import KLVae, UNetDenoiser
from nodes.families.components.clip_text import ClipText
from nodes.families.discrete_sampling import DiscreteSampling
from nodes.families.latent_format import SD15_LATENT, LatentFormat
from nodes.families.prompt import ConcatPrompt


class UNetFamily(FamilyAdapter):
    """A UNet family (see the module docstring)."""

    latent_format: ClassVar[LatentFormat] = SD15_LATENT
    sampling: ClassVar[DiscreteSampling] = DiscreteSampling()
    denoiser: ClassVar[UNetDenoiser] = UNetDenoiser(latent_format=SD15_LATENT)
    vae: ClassVar[KLVae] = KLVae()
    prompt: ClassVar[ConcatPrompt] = ConcatPrompt()
    heads: ClassVar[arch.HeadsRule]
    resolution: ClassVar[int] = 512

    def prediction_type(self, index: TensorIndex) -> str:
        return "epsilon"

    def default_resolution(self, prediction: str) -> int:
        return self.resolution

    def denoiser_config(self, index: TensorIndex, prediction: str) -> dict[str, Any]:
        size = self.default_resolution(prediction) // 8
        return self.denoiser.config_from_tensors(index, self.denoiser_prefix, type(self).heads, size)

    def parts(self, index: TensorIndex) -> dict[str, tuple[Part, ...]]:
        prediction = self.prediction_type(index)
        unet = Part.make(
            "unet", self.denoiser, self.denoiser_prefix, "unet", self.denoiser_config(index, prediction)
        )
        vae_cfg = self.vae.config_from_tensors(
            index, self.vae_prefix, self.latent_format.scale_factor, self.default_resolution(prediction)
        )
        vae = Part.make("vae", self.vae, self.vae_prefix, "vae", vae_cfg)
        clips = tuple(self.text_encoder_part(spec, index, spec.prefix) for spec in self.text_encoders)
        return {"unet": (unet,), "clip": clips, "vae": (vae,)}

    def diffusers_parts(
        self, config: Callable[[str], dict[str, Any]]
    ) -> tuple[dict[str, tuple[Part, ...]], tuple[tuple[str, int], ...]]:
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
        raise ModelLoadError(
            f"{index.path}: a {self.title} denoiser-only file cannot be loaded by itself; "
            "use the full checkpoint with CheckpointLoaderSimple"
        )
