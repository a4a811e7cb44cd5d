"""The Flux.2 VAE kind (diffusers' ``AutoencoderKLFlux2``): a KL autoencoder with 32 latent channels
plus BatchNorm running statistics over the 2×2-patchified latent (128 channels at 1/16 of the image).
diffusers has no single-file converter for it, so the table is Loom's: the LDM names of the KL VAE
(``keys.vae_pairs``, shared with the Flux.1/SD VAEs), ``encoder.quant_conv`` / ``decoder.post_quant_conv``
(Black Forest Labs' layout) or top-level ``quant_conv`` / ``post_quant_conv`` (both read; the top-level
names are written), and ``bn.running_mean`` / ``bn.running_var`` passed through. A VAE file saved by
diffusers (``vae/diffusion_pytorch_model.safetensors`` of a Flux.2 repository) already has the module's names.

As in ComfyUI, the VAE's latent is the model's: encoding patchifies the posterior's mode 2×2 (channel,
row, col order) and normalises it with the BatchNorm statistics (eps 1e-4); decoding inverts both.
The module (:mod:`nodes.families.components.flux2_vae_module`) does this inside ``encode``/``decode``,
so VAEEncode and VAEDecode need nothing family-specific."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from nodes.core.tensors import ModelLoadError, TensorIndex
from nodes.families import arch, keys
from nodes.families.components import ShapeConfiguredVae

BN_EPS = 1e-4
_QUANT = (("encoder.quant_conv.", "quant_conv."), ("decoder.post_quant_conv.", "post_quant_conv."))
_BN = ("bn.running_mean", "bn.running_var", "bn.num_batches_tracked")


def is_flux2_vae(index: TensorIndex, prefix: str = "") -> bool:
    """Whether ``index`` holds a Flux.2 VAE under ``prefix`` (LDM layout with BatchNorm statistics)."""
    return index.has(f"{prefix}bn.running_mean") and index.has(f"{prefix}decoder.conv_in.weight")


@dataclass(frozen=True)
class Flux2Vae(ShapeConfiguredVae):
    """The Flux.2 VAE kind (see the module docstring)."""

    id: str = "flux2_vae"

    def present(self, index: TensorIndex, prefix: str) -> bool:
        return is_flux2_vae(index, prefix)

    def file_prefix(self, index: TensorIndex) -> str | None:
        return "" if is_flux2_vae(index) else None

    def latent_channels(self, config: Mapping[str, Any]) -> int | None:
        return 4 * int(config["latent_channels"])  # the 2x2 patches the model sees

    def config_from_tensors(self, index: TensorIndex, prefix: str) -> dict[str, Any]:
        if not is_flux2_vae(index, prefix):
            raise ModelLoadError(
                f"{index.path}: not a Flux.2 VAE (no bn.running_mean / decoder.conv_in under "
                f"{prefix!r}); Flux.2 needs its own 32-channel VAE (flux2-vae.safetensors)"
            )
        diffusers_keys = keys.looks_like_diffusers_vae(
            [k.removeprefix(prefix) for k in index.tensors if k.startswith(prefix)]
        )
        if diffusers_keys and prefix:
            raise ModelLoadError(
                f"{index.path}: a Flux.2 VAE in diffusers' names is read as a file of its own only"
            )
        cfg = (
            arch.vae_config_diffusers_keys(index, 1.0, 1024)
            if diffusers_keys
            else arch.vae_config(index, prefix, 1.0, 1024)
        )
        for key in ("_class_name", "scaling_factor"):
            cfg.pop(key, None)
        latent = int(cfg["latent_channels"])
        stats = index.shape(f"{prefix}bn.running_mean")[0]
        if stats != 4 * latent:
            raise ModelLoadError(
                f"{index.path}: the VAE's BatchNorm has {stats} channels, expected 4 × {latent} "
                "(its latent channels in 2×2 patches)"
            )
        return cfg | {
            "use_quant_conv": index.has(f"{prefix}quant_conv.weight")
            or index.has(f"{prefix}encoder.quant_conv.weight"),
            "use_post_quant_conv": (
                index.has(f"{prefix}post_quant_conv.weight")
                or index.has(f"{prefix}decoder.post_quant_conv.weight")
            ),
            "batch_norm_eps": BN_EPS,
            "patch_size": [2, 2],
        }

    def to_diffusers(self, sd: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
        renamed: dict[str, Any] = {}
        for name, tensor in sd.items():
            for old, new in _QUANT:
                if name.startswith(old):
                    name = new + name[len(old) :]
            renamed[name] = tensor
        bn = {k: renamed.pop(k) for k in _BN if k in renamed}
        bn.setdefault("bn.num_batches_tracked", torch.tensor(0))
        if keys.looks_like_diffusers_vae(
            list(renamed)
        ):  # a VAE file saved by diffusers (vae/ of a Flux.2 repo)
            return renamed | bn
        return keys.vae_to_diffusers(renamed, config) | bn

    def to_original(self, sd: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
        rest = {k: v for k, v in sd.items() if not k.startswith("bn.")}
        return keys.vae_to_ldm(rest, config) | {k: sd[k] for k in _BN[:2] if k in sd}

    def module_keys(self, sd: dict[str, Any]) -> dict[str, Any]:
        return sd

    def empty(self, config: Mapping[str, Any]) -> Any:
        from nodes.families.components.flux2_vae_module import Flux2LatentVAE  # lazy: diffusers (seconds)

        return Flux2LatentVAE.from_config(dict(config))

    def from_pretrained(self, path: Path, safetensors: bool) -> Any:
        from nodes.families.components.flux2_vae_module import Flux2LatentVAE  # lazy: as in empty()

        return Flux2LatentVAE.from_pretrained(path, local_files_only=True, use_safetensors=safetensors)
