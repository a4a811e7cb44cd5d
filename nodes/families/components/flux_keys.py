"""The Flux.1 transformer's key table (and Chroma's), both ways between Black Forest Labs'
single-file layout (``double_blocks.N``, ``single_blocks.N``, ``img_in``...) and diffusers' names;
:class:`~nodes.families.components.flux_dit.FluxTransformer` reads and saves its tensors with it.

The table is shape-generic (fused projections are split by the widths read from the tensors), so it
serves tiny test models and the real 3072-wide ones alike. Facts it follows:

- ``img_attn.qkv`` / ``txt_attn.qkv`` are q, k, v stacked along the output axis;
  ``single_blocks.N.linear1`` is q, k, v and the MLP input stacked (widths H, H, H, 4H).
- The final layer's modulation is (shift, scale) in the file and (scale, shift) in diffusers.
- Chroma's ``distilled_guidance_layer`` keeps its names but for the layer and norm leaves.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from nodes.core.tensors import ModelLoadError

_EMBEDDERS = {  # file name -> diffusers name (both have .weight and .bias)
    "img_in": "x_embedder",
    "txt_in": "context_embedder",
    "time_in.in_layer": "time_text_embed.timestep_embedder.linear_1",
    "time_in.out_layer": "time_text_embed.timestep_embedder.linear_2",
    "vector_in.in_layer": "time_text_embed.text_embedder.linear_1",
    "vector_in.out_layer": "time_text_embed.text_embedder.linear_2",
    "guidance_in.in_layer": "time_text_embed.guidance_embedder.linear_1",
    "guidance_in.out_layer": "time_text_embed.guidance_embedder.linear_2",
    "final_layer.linear": "proj_out",
}
_DOUBLE = {  # inside double_blocks.N -> inside transformer_blocks.N (weight and bias)
    "img_mod.lin": "norm1.linear",
    "txt_mod.lin": "norm1_context.linear",
    "img_attn.proj": "attn.to_out.0",
    "txt_attn.proj": "attn.to_add_out",
    "img_mlp.0": "ff.net.0.proj",
    "img_mlp.2": "ff.net.2",
    "txt_mlp.0": "ff_context.net.0.proj",
    "txt_mlp.2": "ff_context.net.2",
}
_DOUBLE_NORMS = {
    "img_attn.norm.query_norm.scale": "attn.norm_q.weight",
    "img_attn.norm.key_norm.scale": "attn.norm_k.weight",
    "txt_attn.norm.query_norm.scale": "attn.norm_added_q.weight",
    "txt_attn.norm.key_norm.scale": "attn.norm_added_k.weight",
}
_DOUBLE_QKV = {
    "img_attn.qkv": ("attn.to_q", "attn.to_k", "attn.to_v"),
    "txt_attn.qkv": ("attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"),
}
_SINGLE = {"linear2": "proj_out", "modulation.lin": "norm.linear"}
_SINGLE_NORMS = {"norm.query_norm.scale": "attn.norm_q.weight", "norm.key_norm.scale": "attn.norm_k.weight"}
_SINGLE_LINEAR1 = ("attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp")
_APPROXIMATOR = {
    "in_layer": "linear_1",
    "out_layer": "linear_2",
}  # Chroma's distilled_guidance_layer.layers.N


def to_diffusers(sd: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
    """Single-file tensors (inner names) → ``FluxTransformer2DModel``'s or ``ChromaTransformer2DModel``'s."""

    inner = config["num_attention_heads"] * config["attention_head_dim"]
    out: dict[str, Any] = {}
    for name, tensor in sd.items():
        head, _, leaf = name.rpartition(".")
        if head in _EMBEDDERS:
            out[f"{_EMBEDDERS[head]}.{leaf}"] = tensor
        elif head == "final_layer.adaLN_modulation.1":
            shift, scale = tensor.chunk(2, dim=0)
            out[f"norm_out.linear.{leaf}"] = torch.cat([scale, shift])
        elif name.startswith("double_blocks."):
            _, i, rest = name.split(".", 2)
            out.update(_double_to_diffusers(f"transformer_blocks.{i}.", rest, tensor))
        elif name.startswith("single_blocks."):
            _, i, rest = name.split(".", 2)
            out.update(_single_to_diffusers(f"single_transformer_blocks.{i}.", rest, tensor, inner))
        elif name.startswith("distilled_guidance_layer."):
            out[_approximator_name(name, _APPROXIMATOR, "scale", "weight")] = tensor
        else:
            raise ModelLoadError(f"unexpected tensor {name!r} in a Flux transformer")
    return out


def to_original(sd: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
    """The inverse of :func:`to_diffusers`."""

    out: dict[str, Any] = {}
    back = {v: k for k, v in _APPROXIMATOR.items()}
    for name, tensor in sd.items():
        original = _original_name(name)
        if original is not None:
            out[original] = tensor
        elif name.startswith("distilled_guidance_layer."):
            out[_approximator_name(name, back, "weight", "scale")] = tensor
        elif name.startswith("norm_out.linear."):
            scale, shift = tensor.chunk(2, dim=0)
            out[f"final_layer.adaLN_modulation.1.{name.rsplit('.', 1)[1]}"] = torch.cat([shift, scale])
    for i in range(config["num_layers"]):
        for fused, parts in _DOUBLE_QKV.items():
            _fuse(sd, out, f"transformer_blocks.{i}.", parts, f"double_blocks.{i}.{fused}")
    for i in range(config["num_single_layers"]):
        _fuse(sd, out, f"single_transformer_blocks.{i}.", _SINGLE_LINEAR1, f"single_blocks.{i}.linear1")
    return out


def original_names(names: Sequence[str]) -> dict[str, str]:
    """Module key -> the Black Forest Labs key it comes from (the fused tensor's name for split
    q/k/v and MLP parts)."""
    return {n: _original_name(n) or _fused_name(n) for n in names}


def _double_to_diffusers(head: str, rest: str, tensor: Any) -> dict[str, Any]:
    base, _, leaf = rest.rpartition(".")
    if rest in _DOUBLE_NORMS:
        return {head + _DOUBLE_NORMS[rest]: tensor}
    if base in _DOUBLE:
        return {f"{head}{_DOUBLE[base]}.{leaf}": tensor}
    if base in _DOUBLE_QKV:
        return {
            f"{head}{p}.{leaf}": t for p, t in zip(_DOUBLE_QKV[base], tensor.chunk(3, dim=0), strict=True)
        }
    raise ModelLoadError(f"unexpected tensor {rest!r} in a Flux double block")


def _single_to_diffusers(head: str, rest: str, tensor: Any, inner: int) -> dict[str, Any]:
    base, _, leaf = rest.rpartition(".")
    if rest in _SINGLE_NORMS:
        return {head + _SINGLE_NORMS[rest]: tensor}
    if base in _SINGLE:
        return {f"{head}{_SINGLE[base]}.{leaf}": tensor}
    if base == "linear1":
        widths = [inner, inner, inner, tensor.shape[0] - 3 * inner]
        return {
            f"{head}{p}.{leaf}": t for p, t in zip(_SINGLE_LINEAR1, tensor.split(widths, dim=0), strict=True)
        }
    raise ModelLoadError(f"unexpected tensor {rest!r} in a Flux single block")


def _original_name(name: str) -> str | None:
    """The file name of a one-to-one diffusers tensor (None for split/fused or swapped ones)."""
    base, _, leaf = name.rpartition(".")
    for src, dst in _EMBEDDERS.items():
        if base == dst:
            return f"{src}.{leaf}"
    for block, src_block, plain, norms in (
        ("transformer_blocks.", "double_blocks.", _DOUBLE, _DOUBLE_NORMS),
        ("single_transformer_blocks.", "single_blocks.", _SINGLE, _SINGLE_NORMS),
    ):
        if name.startswith(block):
            i, rest = name[len(block) :].split(".", 1)
            for src, dst in norms.items():
                if rest == dst:
                    return f"{src_block}{i}.{src}"
            rest_base = rest.rpartition(".")[0]
            for src, dst in plain.items():
                if rest_base == dst:
                    return f"{src_block}{i}.{src}.{leaf}"
    return None


def _fused_name(name: str) -> str:
    """The file name of a split (q/k/v, MLP input) or swapped (final modulation) diffusers tensor;
    ``name`` itself for anything else (Chroma's approximator keeps the diffusers-side name)."""
    parts = name.split(".")
    leaf = parts[-1]
    if name.startswith("norm_out.linear."):
        return f"final_layer.adaLN_modulation.1.{leaf}"
    if len(parts) >= 4:
        rest = ".".join(parts[2:-1])
        if parts[0] == "transformer_blocks":
            for fused, split in _DOUBLE_QKV.items():
                if rest in split:
                    return f"double_blocks.{parts[1]}.{fused}.{leaf}"
        if parts[0] == "single_transformer_blocks" and rest in _SINGLE_LINEAR1:
            return f"single_blocks.{parts[1]}.linear1.{leaf}"
    return name


def _approximator_name(name: str, layers: Mapping[str, str], norm_from: str, norm_to: str) -> str:
    """Chroma's approximator names: ``layers.N.in_layer`` ⇄ ``layers.N.linear_1``,
    ``norms.N.scale`` ⇄ ``norms.N.weight`` (``in_proj``/``out_proj`` keep their names)."""
    parts = name.split(".")
    if len(parts) == 5 and parts[1] == "layers" and parts[3] in layers:
        parts[3] = layers[parts[3]]
    elif len(parts) == 4 and parts[1] == "norms" and parts[3] == norm_from:
        parts[3] = norm_to
    return ".".join(parts)


def _fuse(sd: Mapping[str, Any], out: dict[str, Any], head: str, parts: Sequence[str], target: str) -> None:
    for leaf in ("weight", "bias"):
        names = [f"{head}{p}.{leaf}" for p in parts]
        if all(n in sd for n in names):
            out[f"{target}.{leaf}"] = torch.cat([sd[n] for n in names], dim=0)
