"""The Wan 2.2 VAE kind (``wan2.2_vae.safetensors``, the TI2V-5B model's): 48-channel latents, 1/16 in
space (2×2 patches, then three 2× stages), 1/4 in time; diffusers' ``AutoencoderKLWan`` with
``is_residual=True`` and ``patch_size=2``. Config from the tensors, the key table both ways between
the original layout (Wan's and ComfyUI's ``comfy/ldm/wan/vae2_2.py``) and diffusers' names, and the
build (:class:`nodes.families.components.wan_vae_module.Wan22Vae3D`).

Layouts (original ⇄ diffusers), besides the names the Wan 2.1 kind shares
(:data:`~nodes.families.components.wan_vae.FIXED_NAMES`: ``conv1``/``head``/``middle``/latent convs):

- ``encoder.downsamples.S.downsamples.R`` (a stage's residual blocks, then its resample) ⇄
  ``encoder.down_blocks.S.resnets.R`` / ``encoder.down_blocks.S.downsampler``;
- ``decoder.upsamples.S.upsamples.R`` (``num_res_blocks + 1`` residual blocks, then a resample) ⇄
  ``decoder.up_blocks.S.resnets.R`` / ``decoder.up_blocks.S.upsampler``.

The stages' average/duplicate shortcuts have no weights. The per-channel latent mean and std are the
model's constants (ComfyUI's ``latent_formats.Wan22``, :data:`nodes.families.latent_format.WAN22_LATENT`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nodes.core.tensors import ModelLoadError, TensorIndex
from nodes.families.components import ShapeConfiguredVae
from nodes.families.components.wan_vae import FIXED_NAMES, WAN22_MARKER, residual_name
from nodes.families.latent_format import WAN22_LATENT

DIFFUSERS_MARKER = "encoder.down_blocks.0.resnets.0.norm1.gamma"  # residual stages, diffusers' names
FILE_PREFIXES = ("", "first_stage_model.", "vae.")


def is_wan22_vae(index: TensorIndex, prefix: str = "") -> bool:
    """Whether ``index`` holds a Wan 2.2 VAE under ``prefix`` (original or diffusers names)."""
    return index.has(f"{prefix}{WAN22_MARKER}") or (
        index.has(f"{prefix}{DIFFUSERS_MARKER}")
        and index.has(f"{prefix}decoder.mid_block.resnets.0.norm1.gamma")
    )


@dataclass(frozen=True)
class Wan22Vae(ShapeConfiguredVae):
    """The Wan 2.2 VAE kind (see the module docstring)."""

    id: str = "wan22_vae"

    def present(self, index: TensorIndex, prefix: str) -> bool:
        return is_wan22_vae(index, prefix)

    def file_prefix(self, index: TensorIndex) -> str | None:
        return next((p for p in FILE_PREFIXES if is_wan22_vae(index, p)), None)

    def latent_channels(self, config: Mapping[str, Any]) -> int | None:
        return int(config["z_dim"])

    def config_from_tensors(self, index: TensorIndex, prefix: str) -> dict[str, Any]:
        """The ``AutoencoderKLWan`` config from the shapes under ``prefix`` (either layout)."""
        names = [k.removeprefix(prefix) for k in index.tensors if k.startswith(prefix)]
        resnets = {n.split(".")[4] for n in names if n.startswith("encoder.down_blocks.0.resnets.")}
        blocks = {int(n.split(".")[4]) for n in names if n.startswith("encoder.downsamples.0.downsamples.")}
        res_blocks = len(resnets) if resnets else max(blocks, default=0)  # (the last original is a resample)
        sd = {to_original(n, res_blocks): index.shape(prefix + n) for n in names}
        base, patched = sd["encoder.conv1.weight"][:2]
        patch = round((patched // 3) ** 0.5)
        stages = len({n.split(".")[2] for n in sd if n.startswith("encoder.downsamples.")})
        if stages < 2 or patch * patch * 3 != patched:
            raise ModelLoadError(
                f"{index.path}: not a Wan 2.2 VAE ({stages} stages, {patched} input channels)"
            )
        mult = [
            sd[f"encoder.downsamples.{s}.downsamples.0.residual.2.weight"][0] // base for s in range(stages)
        ]
        z_dim = sd["conv1.weight"][0] // 2
        if z_dim != WAN22_LATENT.channels:
            raise ModelLoadError(
                f"{index.path}: this Wan 2.2-style VAE makes {z_dim}-channel latents; Loom builds the "
                f"{WAN22_LATENT.channels}-channel Wan 2.2 VAE"
            )
        temporal = [
            f"encoder.downsamples.{s}.downsamples.{res_blocks}.time_conv.weight" in sd
            for s in range(stages - 1)
        ]
        return {
            "base_dim": base,
            "decoder_base_dim": sd["decoder.conv1.weight"][0] // mult[-1],
            "z_dim": z_dim,
            "dim_mult": mult,
            "num_res_blocks": res_blocks,
            "attn_scales": [],
            "temperal_downsample": temporal,
            "is_residual": True,
            "in_channels": patched,
            "out_channels": patched,
            "patch_size": patch,
            "scale_factor_temporal": 2 ** sum(temporal),
            "scale_factor_spatial": patch * 2 ** (stages - 1),
            "latents_mean": list(WAN22_LATENT.mean),
            "latents_std": list(WAN22_LATENT.std),
        }

    def to_diffusers(self, sd: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
        return {to_diffusers(name): tensor for name, tensor in sd.items()}

    def to_original(self, sd: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
        blocks = int(config["num_res_blocks"])
        return {to_original(name, blocks): tensor for name, tensor in sd.items()}

    def module_keys(self, sd: dict[str, Any]) -> dict[str, Any]:
        return sd

    def empty(self, config: Mapping[str, Any]) -> Any:
        from nodes.families.components.wan_vae_module import Wan22Vae3D  # lazy: diffusers (seconds)

        return Wan22Vae3D.from_config(dict(config))

    def from_pretrained(self, path: Path, safetensors: bool) -> Any:
        from nodes.families.components.wan_vae_module import Wan22Vae3D  # lazy: as in empty()

        return Wan22Vae3D.from_pretrained(path, local_files_only=True, use_safetensors=safetensors)


def _stage(name: str, side: str) -> tuple[int, int, str] | None:
    """(stage, block, rest) of an original stage name of ``side`` (encoder/decoder), else None."""
    head = f"{side}.{'downsamples' if side == 'encoder' else 'upsamples'}."
    if not name.startswith(head):
        return None
    stage, kind, block, rest = name.removeprefix(head).split(".", 3)
    return int(stage), int(block), rest


def _is_resample(rest: str) -> bool:
    return rest.startswith(("resample.", "time_conv."))


def to_diffusers(name: str) -> str:
    """One original Wan 2.2 VAE name in diffusers' layout (names already in it pass through)."""
    for old, new in FIXED_NAMES:
        if name.startswith(old):
            rest = name[len(old) :]
            return new + (residual_name(rest, True) if ".resnets." in new else rest)
    for side, blocks, sampler in (
        ("encoder", "down_blocks", "downsampler"),
        ("decoder", "up_blocks", "upsampler"),
    ):
        found = _stage(name, side)
        if found is not None:
            stage, block, rest = found
            if _is_resample(rest):
                return f"{side}.{blocks}.{stage}.{sampler}.{rest}"
            return f"{side}.{blocks}.{stage}.resnets.{block}.{residual_name(rest, True)}"
    return name


def to_original(name: str, res_blocks: int) -> str:
    """One diffusers Wan 2.2 VAE name in the original layout (original names pass through); a stage's
    resample follows its residual blocks (``res_blocks`` in the encoder, one more in the decoder)."""
    for old, new in FIXED_NAMES:
        if name.startswith(new):
            rest = name[len(new) :]
            return old + (residual_name(rest, False) if ".resnets." in new else rest)
    for side, blocks, sampler, original, count in (
        ("encoder", "down_blocks", "downsampler", "downsamples", res_blocks),
        ("decoder", "up_blocks", "upsampler", "upsamples", res_blocks + 1),
    ):
        head = f"{side}.{blocks}."
        if name.startswith(head):
            stage, kind, rest = name.removeprefix(head).split(".", 2)
            if kind == sampler:
                return f"{side}.{original}.{stage}.{original}.{count}.{rest}"
            block, rest = rest.split(".", 1)
            return f"{side}.{original}.{stage}.{original}.{block}.{residual_name(rest, False)}"
    return name
