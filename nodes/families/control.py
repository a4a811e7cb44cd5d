"""Which UNet family a ControlNet was trained for, read from its diffusers config: SDXL's have the
``text_time`` added embedding, SD2.x's 1024-wide text embeddings, SD1.x's 768 (the tiny demo
models, narrower still, count as SD1.x). The names are the families' ``name``s."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nodes.families.keys import rename, unet_pairs

# What ControlNetLoader reads, for its teaching error on a transformer ControlNet of another layout.
READABLE_CONTROLNET_LAYOUTS = (
    "SD3 ControlNets (diffusers layout), Flux ControlNets (InstantX, Shakker-Labs, XLabs, MistoLine) "
    "and the UNet families' ControlNets and T2I-Adapters"
)


def family_label(config: Mapping[str, Any]) -> str:
    if config.get("addition_embed_type") == "text_time":
        return "sdxl"
    return "sd2" if int(config.get("cross_attention_dim", 768)) == 1024 else "sd15"


def adapter_families(xl: bool) -> tuple[str, ...]:
    """The families a T2I-Adapter fits: SDXL's (the ``full_adapter_xl`` type), else SD1.x and SD2.x
    (the same down-block widths)."""
    return ("sdxl",) if xl else ("sd15", "sd2")


def ldm_controlnet_to_diffusers(sd: Mapping[str, Any]) -> dict[str, Any]:
    """The original ControlNet layout (``control_model.`` removed: ``input_blocks.*``,
    ``middle_block.*``, ``input_hint_block.*``, ``zero_convs.*``, ``middle_block_out.*``) renamed to
    diffusers' ``ControlNetModel``: the encoder half through the UNet key table, the hint encoder
    and the zero convolutions by their positions."""

    attention: list[bool] = []
    per_level, count, k = 0, 0, 1
    while any(key.startswith(f"input_blocks.{k}.") for key in sd):
        if f"input_blocks.{k}.0.op.weight" in sd:
            per_level, count = count, 0
        else:
            if count == 0:
                attention.append(any(key.startswith(f"input_blocks.{k}.1.") for key in sd))
            count += 1
        k += 1
    per_level = per_level or count
    kinds = ["CrossAttnDownBlock2D" if a else "DownBlock2D" for a in attention]
    config = {
        "block_out_channels": attention,
        "layers_per_block": per_level,
        "down_block_types": kinds,
        "up_block_types": [t.replace("Down", "Up") for t in reversed(kinds)],
    }
    table = dict(unet_pairs(config))
    hint = sorted({int(key.split(".")[1]) for key in sd if key.startswith("input_hint_block.")})
    for n, i in enumerate(hint):
        name = "conv_in" if n == 0 else "conv_out" if n == len(hint) - 1 else f"blocks.{n - 1}"
        table[f"input_hint_block.{i}."] = f"controlnet_cond_embedding.{name}."
    for i in {int(key.split(".")[1]) for key in sd if key.startswith("zero_convs.")}:
        table[f"zero_convs.{i}.0."] = f"controlnet_down_blocks.{i}."
    table["middle_block_out.0."] = "controlnet_mid_block."
    return rename(sd, table)


def diffusers_controlnet_to_ldm(sd: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
    """The inverse of :func:`ldm_controlnet_to_diffusers` for a ``ControlNetModel`` state dict and its
    config (``control_model.`` not added): what original-layout files (and diff ControlNets) hold."""

    kinds = list(config["down_block_types"])
    table = {
        new: old
        for old, new in unet_pairs(
            {**config, "up_block_types": [t.replace("Down", "Up") for t in reversed(kinds)]}
        )
        if not new.startswith(("up_blocks.", "conv_norm_out.", "conv_out."))
    }
    blocks = sorted({int(k.split(".")[2]) for k in sd if k.startswith("controlnet_cond_embedding.blocks.")})
    table["controlnet_cond_embedding.conv_in."] = "input_hint_block.0."
    for n, i in enumerate(blocks):
        table[f"controlnet_cond_embedding.blocks.{i}."] = f"input_hint_block.{2 * (n + 1)}."
    table["controlnet_cond_embedding.conv_out."] = f"input_hint_block.{2 * (len(blocks) + 1)}."
    for i in {int(k.split(".")[1]) for k in sd if k.startswith("controlnet_down_blocks.")}:
        table[f"controlnet_down_blocks.{i}."] = f"zero_convs.{i}.0."
    table["controlnet_mid_block."] = "middle_block_out.0."
    return rename(sd, table)
