"""The Wan VAE kind: the causal 3-D VAE of Wan 2.1 that Qwen-Image uses (diffusers'
``AutoencoderKLQwenImage``), on single images. Config from the tensors, the key table both ways
between the original layout (Wan's and ComfyUI's ``qwen_image_vae.safetensors``) and diffusers'
names, and the build (:mod:`nodes.families.components.wan_vae_module` adapts it to 4-D images).

Layouts (original ⇄ diffusers; the table is written from the block structure, so any depth and
width map, not only the released one):

- ``encoder.conv1`` / ``decoder.conv1`` ⇄ ``conv_in``; ``head.0`` (RMS norm) ⇄ ``norm_out``,
  ``head.2`` ⇄ ``conv_out``; the latent convolutions ``conv1`` / ``conv2`` ⇄ ``quant_conv`` /
  ``post_quant_conv``;
- ``middle.0`` / ``middle.2`` (residual blocks) ⇄ ``mid_block.resnets.0`` / ``.1``, ``middle.1``
  (attention) ⇄ ``mid_block.attentions.0``;
- a residual block's ``residual.0`` / ``.2`` / ``.3`` / ``.6`` ⇄ ``norm1`` / ``conv1`` / ``norm2`` /
  ``conv2``, ``shortcut`` ⇄ ``conv_shortcut``;
- ``encoder.downsamples.N`` ⇄ ``encoder.down_blocks.N`` (one flat list in both: per stage its
  residual blocks, then a resample except after the last);
- ``decoder.upsamples.N`` (flat: per stage ``num_res_blocks + 1`` residual blocks, then a resample
  except after the last) ⇄ ``decoder.up_blocks.S.resnets.R`` / ``decoder.up_blocks.S.upsamplers.0``.

The per-channel latent mean and std are not in the file: they are the model's constants (the same
for Wan 2.1 and Qwen-Image; ComfyUI's ``latent_formats.Wan21``, ``nodes.families.latent_format``),
kept in the config as diffusers does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nodes.core.tensors import ModelLoadError, TensorIndex
from nodes.families.components import ShapeConfiguredVae
from nodes.families.latent_format import WAN21_LATENTS_MEAN, WAN21_LATENTS_STD

RESIDUAL_NAMES = (
    ("residual.0.", "norm1."),
    ("residual.2.", "conv1."),
    ("residual.3.", "norm2."),
    ("residual.6.", "conv2."),
    ("shortcut.", "conv_shortcut."),
)
FIXED_NAMES = (  # whole-name prefixes, original -> diffusers
    ("encoder.conv1.", "encoder.conv_in."),
    ("decoder.conv1.", "decoder.conv_in."),
    ("encoder.head.0.", "encoder.norm_out."),
    ("encoder.head.2.", "encoder.conv_out."),
    ("decoder.head.0.", "decoder.norm_out."),
    ("decoder.head.2.", "decoder.conv_out."),
    ("conv1.", "quant_conv."),
    ("conv2.", "post_quant_conv."),
    ("encoder.middle.1.", "encoder.mid_block.attentions.0."),
    ("decoder.middle.1.", "decoder.mid_block.attentions.0."),
    ("encoder.middle.0.", "encoder.mid_block.resnets.0."),
    ("encoder.middle.2.", "encoder.mid_block.resnets.1."),
    ("decoder.middle.0.", "decoder.mid_block.resnets.0."),
    ("decoder.middle.2.", "decoder.mid_block.resnets.1."),
)
MARKER = "decoder.middle.0.residual.0.gamma"  # a tensor only the original Wan layout has
WAN22_MARKER = "decoder.upsamples.0.upsamples.0.residual.2.weight"  # Wan 2.2's stages (ComfyUI's test)
DIFFUSERS_MARKER = "decoder.mid_block.resnets.0.norm1.gamma"
FILE_PREFIXES = ("", "first_stage_model.", "vae.")  # where standalone Wan VAE files keep their tensors


def is_wan_vae(index: TensorIndex, prefix: str = "") -> bool:
    """Whether ``index`` holds a Wan VAE under ``prefix`` (original or diffusers names)."""
    if index.has(f"{prefix}{WAN22_MARKER}"):
        return False  # the Wan 2.2 VAE (nodes.families.components.wan22_vae)
    return index.has(f"{prefix}{MARKER}") or (
        index.has(f"{prefix}{DIFFUSERS_MARKER}") and index.has(f"{prefix}encoder.down_blocks.0.norm1.gamma")
    )


@dataclass(frozen=True)
class WanVae(ShapeConfiguredVae):
    """The Wan VAE kind (see the module docstring)."""

    id: str = "wan_vae"

    def present(self, index: TensorIndex, prefix: str) -> bool:
        return is_wan_vae(index, prefix)

    def file_prefix(self, index: TensorIndex) -> str | None:
        return next((p for p in FILE_PREFIXES if is_wan_vae(index, p)), None)

    def latent_channels(self, config: Mapping[str, Any]) -> int | None:
        return int(config["z_dim"])

    # --- reading and building -----------------------------------------------------------------
    def config_from_tensors(self, index: TensorIndex, prefix: str) -> dict[str, Any]:
        """The ``AutoencoderKLQwenImage`` config from the shapes under ``prefix`` (either layout)."""
        diffusers = not index.has(f"{prefix}{MARKER}")
        names = [k.removeprefix(prefix) for k in index.tensors if k.startswith(prefix)]
        sd = {n: index.shape(prefix + n) for n in names}
        if diffusers:  # read the shapes under their original names
            per_stage = (
                len({n.split(".")[4] for n in names if n.startswith("decoder.up_blocks.0.resnets.")}) + 1
            )
            sd = {_diffusers_to_original(n, per_stage): shape for n, shape in sd.items()}
        base = sd["encoder.conv1.weight"][0]
        down = sorted({int(n.split(".")[2]) for n in sd if n.startswith("encoder.downsamples.")})
        resamples = [i for i in down if f"encoder.downsamples.{i}.resample.1.weight" in sd]
        if not resamples:
            raise ModelLoadError(f"{index.path}: a Wan VAE encoder without downsampling stages")
        res_blocks = resamples[0]
        stages = len(resamples) + 1
        if any(n.startswith("encoder.downsamples.") and ".norm.gamma" in n for n in sd):
            raise ModelLoadError(
                f"{index.path}: a Wan VAE with attention inside its stages is not a variant Loom builds"
            )
        mult = [
            sd[f"encoder.downsamples.{s * (res_blocks + 1)}.residual.2.weight"][0] // base
            for s in range(stages)
        ]
        z_dim = sd["conv1.weight"][0] // 2
        if z_dim != len(WAN21_LATENTS_MEAN):
            raise ModelLoadError(
                f"{index.path}: this Wan VAE makes {z_dim}-channel latents (Wan 2.2's is 48); Loom "
                f"builds the {len(WAN21_LATENTS_MEAN)}-channel Wan 2.1 / Qwen-Image VAE"
            )
        return {
            "base_dim": base,
            "z_dim": z_dim,
            "dim_mult": mult,
            "num_res_blocks": res_blocks,
            "attn_scales": [],
            "temperal_downsample": [f"encoder.downsamples.{i}.time_conv.weight" in sd for i in resamples],
            "latents_mean": list(WAN21_LATENTS_MEAN),
            "latents_std": list(WAN21_LATENTS_STD),
        }

    def to_diffusers(self, sd: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
        if any(k.startswith("decoder.up_blocks.") for k in sd):
            return dict(sd)  # a file saved by diffusers
        per_stage = int(config["num_res_blocks"]) + 2  # residual blocks + one resample
        out: dict[str, Any] = {}
        for name, tensor in sd.items():
            out[_original_to_diffusers(name, per_stage)] = tensor
        return out

    def to_original(self, sd: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
        per_stage = int(config["num_res_blocks"]) + 2
        return {_diffusers_to_original(name, per_stage): tensor for name, tensor in sd.items()}

    def module_keys(self, sd: dict[str, Any]) -> dict[str, Any]:
        return sd

    def empty(self, config: Mapping[str, Any]) -> Any:
        from nodes.families.components.wan_vae_module import QwenImageVae2D  # lazy: diffusers (seconds)

        return QwenImageVae2D.from_config(dict(config))

    def from_pretrained(self, path: Path, safetensors: bool) -> Any:
        from nodes.families.components.wan_vae_module import QwenImageVae2D  # lazy: as in empty()

        return QwenImageVae2D.from_pretrained(path, local_files_only=True, use_safetensors=safetensors)


def residual_name(rest: str, forward: bool) -> str:
    for old, new in RESIDUAL_NAMES:
        a, b = (old, new) if forward else (new, old)
        if rest.startswith(a):
            return b + rest[len(a) :]
    return rest


def _original_to_diffusers(name: str, per_stage: int) -> str:
    for old, new in FIXED_NAMES:
        if name.startswith(old):
            rest = name[len(old) :]
            return new + (residual_name(rest, True) if ".resnets." in new else rest)
    if name.startswith("encoder.downsamples."):
        index, rest = name.removeprefix("encoder.downsamples.").split(".", 1)
        return f"encoder.down_blocks.{index}.{residual_name(rest, True)}"
    if name.startswith("decoder.upsamples."):
        index, rest = name.removeprefix("decoder.upsamples.").split(".", 1)
        stage, pos = divmod(int(index), per_stage)
        if pos == per_stage - 1:
            return f"decoder.up_blocks.{stage}.upsamplers.0.{rest}"
        return f"decoder.up_blocks.{stage}.resnets.{pos}.{residual_name(rest, True)}"
    return name


def _diffusers_to_original(name: str, per_stage: int) -> str:
    for old, new in FIXED_NAMES:
        if name.startswith(new):
            rest = name[len(new) :]
            return old + (residual_name(rest, False) if ".resnets." in new else rest)
    if name.startswith("encoder.down_blocks."):
        index, rest = name.removeprefix("encoder.down_blocks.").split(".", 1)
        return f"encoder.downsamples.{index}.{residual_name(rest, False)}"
    if name.startswith("decoder.up_blocks."):
        stage, kind, rest = name.removeprefix("decoder.up_blocks.").split(".", 2)
        if kind == "upsamplers":
            return f"decoder.upsamples.{int(stage) * per_stage + per_stage - 1}.{rest.removeprefix('0.')}"
        pos, rest = rest.split(".", 1)
        return f"decoder.upsamples.{int(stage) * per_stage + int(pos)}.{residual_name(rest, False)}"
    return name
