"""XLabs' Flux ControlNet files (Black Forest Labs' names: ``double_blocks.N``, ``pos_embed_input``,
``input_hint_block``, ``controlnet_blocks.N``) renamed to diffusers' ``FluxControlNetModel`` and back.
The Flux trunk goes through the Flux transformer's own key table; only the ControlNet's tensors are
renamed here."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nodes.families.components.flux_dit import FluxTransformer

XLABS_HINT = ("conv_in", *(f"blocks.{i}" for i in range(6)), "conv_out")  # input_hint_block.0, 2, ..., 14


def _own_key(key: str, to_file: bool) -> str | None:
    """A ControlNet-only tensor's name in the other layout (XLabs file ⇄ diffusers); None for the
    Flux transformer's own tensors."""
    head, _, rest = key.partition(".")
    ours, theirs = (
        ("controlnet_x_embedder", "pos_embed_input")
        if to_file
        else ("pos_embed_input", "controlnet_x_embedder")
    )
    if head == ours:
        return f"{theirs}.{rest}"
    if head == "input_hint_block":
        name, _, leaf = rest.rpartition(".")
        index = str(2 * XLABS_HINT.index(name)) if to_file else XLABS_HINT[int(name) // 2]
        return f"input_hint_block.{index}.{leaf}"
    return key if head == "controlnet_blocks" else None


def xlabs_to_diffusers(sd: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
    """An XLabs file (Black Forest Labs' names) renamed to ``FluxControlNetModel``'s."""

    own = {new: tensor for key, tensor in sd.items() if (new := _own_key(key, to_file=False)) is not None}
    flux = {key: tensor for key, tensor in sd.items() if _own_key(key, to_file=False) is None}
    cfg = {**config, "num_single_layers": config.get("num_single_layers", 0)}
    return FluxTransformer().to_diffusers(flux, cfg) | own


def diffusers_to_xlabs(module: Any) -> dict[str, Any]:
    """A ``FluxControlNetModel`` with a hint encoder as XLabs' files hold it (the inverse)."""

    sd = module.state_dict()
    own = {new: tensor for key, tensor in sd.items() if (new := _own_key(key, to_file=True)) is not None}
    return FluxTransformer().to_original(sd, module.config) | own
