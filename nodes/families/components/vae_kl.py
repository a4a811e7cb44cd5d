"""The KL autoencoder kind (diffusers' ``AutoencoderKL``) of SD1.x, SD2.x and SDXL: config from the
tensors, the key table both ways (LDM ``encoder.down.{i}.block.{j}`` ⇄ diffusers'
``encoder.down_blocks.{i}.resnets.{j}``, the decoder reversed; attention 1x1 convolutions ⇄
linear layers), and the build. Files saved by diffusers already have the module's names."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from nodes.core.tensors import TensorIndex
from nodes.families import arch, keys
from nodes.families.latent_format import SD15_LATENT, LatentFormat

CHECKPOINT_PREFIX = "first_stage_model."  # where an SD checkpoint keeps it; standalone files may too


@dataclass(frozen=True)
class KLVae:
    """The VAE kind (see the module docstring)."""

    id: str = "vae"
    generic: ClassVar[bool] = True  # any encoder/decoder pair reads as a KL VAE

    def present(self, index: TensorIndex, prefix: str) -> bool:
        return index.has(f"{prefix}decoder.conv_out.weight")

    def file_prefix(self, index: TensorIndex) -> str | None:
        """``first_stage_model.`` when the file has it, else the root; None without an encoder and a
        decoder (original layout) or diffusers' VAE names."""
        prefix = CHECKPOINT_PREFIX if index.any_with(CHECKPOINT_PREFIX) else ""
        if keys.looks_like_diffusers_vae(list(index.tensors)):
            return prefix
        found = index.has(f"{prefix}encoder.conv_in.weight") and index.has(f"{prefix}decoder.conv_out.weight")
        return prefix if found else None

    def file_config(self, index: TensorIndex, prefix: str) -> dict[str, Any]:
        """A standalone file does not say which model's latent scale it serves; the VAE nodes never
        scale, so its config carries SD1's (diffusers' AutoencoderKL default) and 512 px."""
        return self.config_from_tensors(index, prefix, SD15_LATENT.scale_factor, 512)

    def config_for(
        self, index: TensorIndex, prefix: str, latent: LatentFormat, sample_size: int
    ) -> dict[str, Any]:
        return self.config_from_tensors(index, prefix, latent.scale_factor, sample_size)

    def latent_channels(self, config: Mapping[str, Any]) -> int | None:
        return config.get("latent_channels")

    def config_from_tensors(
        self, index: TensorIndex, prefix: str, scaling_factor: float, sample_size: int
    ) -> dict[str, Any]:
        if keys.looks_like_diffusers_vae(
            [k.removeprefix(prefix) for k in index.tensors if k.startswith(prefix)]
        ):
            return arch.vae_config_diffusers_keys(index, scaling_factor, sample_size)
        return arch.vae_config(index, prefix, scaling_factor, sample_size)

    def to_diffusers(self, sd: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
        if keys.looks_like_diffusers_vae(list(sd)):
            return dict(sd)  # a standalone VAE file saved by diffusers
        return keys.vae_to_diffusers(sd, config)

    def to_original(self, sd: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
        return keys.vae_to_ldm(sd, config)

    def module_keys(self, sd: dict[str, Any]) -> dict[str, Any]:
        return sd

    def empty(self, config: Mapping[str, Any]) -> Any:
        from diffusers import AutoencoderKL  # lazy: diffusers is heavy to import

        return AutoencoderKL.from_config(dict(config))

    def from_pretrained(self, path: Path, safetensors: bool) -> Any:
        from diffusers import AutoencoderKL  # lazy: diffusers is heavy to import

        return AutoencoderKL.from_pretrained(path, local_files_only=True, use_safetensors=safetensors)
