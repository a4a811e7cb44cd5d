"""Key conversion between the original (LDM / CompVis / OpenCLIP) single-file layout and the
diffusers / transformers layout, both directions, for any block count read from the tensors.

The component kinds (``nodes/families/components/``) call these tables. One table per component,
built from the architecture (levels, layers per block, attention per
level), is used in both directions, so the two directions cannot disagree. The tables follow the
layout documented by diffusers' ``loaders/single_file_utils.py`` (``convert_ldm_unet_checkpoint``,
``convert_ldm_vae_checkpoint``, ``convert_open_clip_checkpoint``); the tests check our
LDM→diffusers result against those functions.

Layouts (inner names, after the component's file prefix is removed):

- ``unet``:      ``input_blocks.{k}.{0|1}...``  ⇄ ``down_blocks.{i}.{resnets|attentions}.{j}...``
- ``vae``:       ``encoder.down.{i}.block.{j}`` ⇄ ``encoder.down_blocks.{i}.resnets.{j}`` (decoder reversed)
- ``hf_clip``:   ``transformer.text_model.*`` files hold transformers' own names: identity
- ``open_clip``: ``transformer.resblocks.{i}.attn.in_proj_weight`` [3h, h] ⇄ q/k/v_proj [h, h] each
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    import torch

Pairs = list[tuple[str, str]]


# --- generic prefix renaming ------------------------------------------------------------------------
def rename(sd: Mapping[str, Any], table: Mapping[str, str]) -> dict[str, Any]:
    """Rename keys by their longest matching prefix in ``table`` (keys without a match stay)."""
    out: dict[str, Any] = {}
    for key, value in sd.items():
        new = key
        pos = len(key)
        while pos > 0:
            pos = key.rfind(".", 0, pos)
            if pos < 0:
                break
            head = key[: pos + 1]
            if head in table:
                new = table[head] + key[pos + 1 :]
                break
        out[new] = value
    return out


def _resnet(ldm: str, diff: str) -> Pairs:
    return [
        (ldm, diff),
        (ldm + "in_layers.0.", diff + "norm1."),
        (ldm + "in_layers.2.", diff + "conv1."),
        (ldm + "emb_layers.1.", diff + "time_emb_proj."),
        (ldm + "out_layers.0.", diff + "norm2."),
        (ldm + "out_layers.3.", diff + "conv2."),
        (ldm + "skip_connection.", diff + "conv_shortcut."),
    ]


# --- UNet ---------------------------------------------------------------------------------------
def unet_pairs(config: Mapping[str, Any]) -> Pairs:
    """(LDM prefix, diffusers prefix) for a UNet2DConditionModel config."""
    levels = len(config["block_out_channels"])
    lpb = int(config["layers_per_block"])
    attn_down = [t.startswith("CrossAttn") for t in config["down_block_types"]]
    attn_up = [t.startswith("CrossAttn") for t in config["up_block_types"]]
    pairs: Pairs = [
        ("time_embed.0.", "time_embedding.linear_1."),
        ("time_embed.2.", "time_embedding.linear_2."),
        ("input_blocks.0.0.", "conv_in."),
        ("out.0.", "conv_norm_out."),
        ("out.2.", "conv_out."),
        ("middle_block.1.", "mid_block.attentions.0."),
    ]
    label = (
        "class_embedding" if config.get("class_embed_type") == "projection" else "add_embedding"
    )  # unCLIP: class
    pairs += [("label_emb.0.0.", f"{label}.linear_1."), ("label_emb.0.2.", f"{label}.linear_2.")]
    pairs += _resnet("middle_block.0.", "mid_block.resnets.0.") + _resnet(
        "middle_block.2.", "mid_block.resnets.1."
    )
    for i in range(levels):
        for j in range(lpb):
            k = 1 + i * (lpb + 1) + j  # input block 0 is conv_in; each level adds lpb blocks + a downsample
            pairs += _resnet(f"input_blocks.{k}.0.", f"down_blocks.{i}.resnets.{j}.")
            if attn_down[i]:
                pairs.append((f"input_blocks.{k}.1.", f"down_blocks.{i}.attentions.{j}."))
        if i < levels - 1:
            pairs.append(
                (f"input_blocks.{1 + i * (lpb + 1) + lpb}.0.op.", f"down_blocks.{i}.downsamplers.0.conv.")
            )
    for i in range(levels):
        for j in range(lpb + 1):
            k = i * (lpb + 1) + j
            pairs += _resnet(f"output_blocks.{k}.0.", f"up_blocks.{i}.resnets.{j}.")
            if attn_up[i]:
                pairs.append((f"output_blocks.{k}.1.", f"up_blocks.{i}.attentions.{j}."))
        if i < levels - 1:
            k = i * (lpb + 1) + lpb
            pairs.append(
                (f"output_blocks.{k}.{2 if attn_up[i] else 1}.conv.", f"up_blocks.{i}.upsamplers.0.conv.")
            )
    return pairs


# --- VAE ----------------------------------------------------------------------------------------
_VAE_ATTN = (
    ("norm.", "group_norm."),
    ("q.", "to_q."),
    ("k.", "to_k."),
    ("v.", "to_v."),
    ("proj_out.", "to_out.0."),
)
_VAE_ATTN_LINEAR = ("to_q.weight", "to_k.weight", "to_v.weight", "to_out.0.weight")


def vae_pairs(config: Mapping[str, Any]) -> Pairs:
    levels = len(config["block_out_channels"])
    lpb = int(config["layers_per_block"])
    pairs: Pairs = [
        ("encoder.norm_out.", "encoder.conv_norm_out."),
        ("decoder.norm_out.", "decoder.conv_norm_out."),
    ]

    def res(ldm: str, diff: str) -> None:
        pairs.extend([(ldm, diff), (ldm + "nin_shortcut.", diff + "conv_shortcut.")])

    for part in ("encoder", "decoder"):
        res(f"{part}.mid.block_1.", f"{part}.mid_block.resnets.0.")
        res(f"{part}.mid.block_2.", f"{part}.mid_block.resnets.1.")
        pairs.append((f"{part}.mid.attn_1.", f"{part}.mid_block.attentions.0."))
        pairs.extend((f"{part}.mid.attn_1.{a}", f"{part}.mid_block.attentions.0.{b}") for a, b in _VAE_ATTN)
    for i in range(levels):
        for j in range(lpb):
            res(f"encoder.down.{i}.block.{j}.", f"encoder.down_blocks.{i}.resnets.{j}.")
        if i < levels - 1:
            pairs.append(
                (f"encoder.down.{i}.downsample.conv.", f"encoder.down_blocks.{i}.downsamplers.0.conv.")
            )
    for i in range(levels):
        level = levels - 1 - i  # the decoder's up blocks run from the lowest resolution
        for j in range(lpb + 1):
            res(f"decoder.up.{level}.block.{j}.", f"decoder.up_blocks.{i}.resnets.{j}.")
        if i < levels - 1:
            pairs.append((f"decoder.up.{level}.upsample.conv.", f"decoder.up_blocks.{i}.upsamplers.0.conv."))
    return pairs


def _vae_reshape(sd: dict[str, Any], to_linear: bool) -> dict[str, Any]:
    for key, value in sd.items():
        if (
            ".mid_block.attentions.0." in key
            and key.endswith(_VAE_ATTN_LINEAR)
            or (
                not to_linear
                and ".mid.attn_1." in key
                and key.endswith(("q.weight", "k.weight", "v.weight", "proj_out.weight"))
            )
        ):
            if to_linear and value.ndim == 4:
                sd[key] = value[:, :, 0, 0]  # 1×1 conv [C, C, 1, 1] → linear [C, C]
            elif not to_linear and value.ndim == 2:
                sd[key] = value[:, :, None, None]
    return sd


# --- OpenCLIP text encoder ------------------------------------------------------------------------
_OPEN_CLIP_LAYER = (
    ("ln_1.", "layer_norm1."),
    ("ln_2.", "layer_norm2."),
    ("mlp.c_fc.", "mlp.fc1."),
    ("mlp.c_proj.", "mlp.fc2."),
    ("attn.out_proj.", "self_attn.out_proj."),
)
OPEN_CLIP_IGNORED = ("logit_scale", "attn_mask")


def open_clip_to_hf(sd: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    layers = {int(k.split(".")[2]) for k in sd if k.startswith("transformer.resblocks.")}
    table = {"token_embedding.": "embeddings.token_embedding.", "ln_final.": "final_layer_norm."}
    for i in layers:
        table.update(
            {f"transformer.resblocks.{i}.{a}": f"encoder.layers.{i}.{b}" for a, b in _OPEN_CLIP_LAYER}
        )
    out: dict[str, Any] = {}
    for key, value in sd.items():
        if key in OPEN_CLIP_IGNORED:
            continue
        if key == "positional_embedding":
            out["embeddings.position_embedding.weight"] = value
        elif key == "text_projection":
            out["text_projection.weight"] = value.t().contiguous()  # [h, p] → linear [p, h]
        elif ".attn.in_proj_" in key:
            i, kind = int(key.split(".")[2]), key.rsplit("_", 1)[1]  # weight | bias
            for name, chunk in zip(("q_proj", "k_proj", "v_proj"), value.chunk(3, dim=0), strict=True):
                out[f"encoder.layers.{i}.self_attn.{name}.{kind}"] = chunk.contiguous()
        else:
            out.update(rename({key: value}, table))
    return out


def hf_to_open_clip(sd: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    layers = {int(k.split(".")[2]) for k in sd if k.startswith("encoder.layers.")}
    table = {"embeddings.token_embedding.": "token_embedding.", "final_layer_norm.": "ln_final."}
    for i in layers:
        table.update(
            {f"encoder.layers.{i}.{b}": f"transformer.resblocks.{i}.{a}" for a, b in _OPEN_CLIP_LAYER}
        )
    out: dict[str, Any] = {}
    for key, value in sd.items():
        if key == "embeddings.position_embedding.weight":
            out["positional_embedding"] = value
        elif key == "text_projection.weight":
            out["text_projection"] = value.t().contiguous()
        elif ".self_attn.q_proj." in key:
            i, kind = int(key.split(".")[2]), key.rsplit(".", 1)[1]
            parts = [sd[f"encoder.layers.{i}.self_attn.{n}_proj.{kind}"] for n in "qkv"]
            out[f"transformer.resblocks.{i}.attn.in_proj_{kind}"] = torch.cat(parts, dim=0)
        elif ".self_attn.k_proj." in key or ".self_attn.v_proj." in key or key == "embeddings.position_ids":
            continue
        else:
            out.update(rename({key: value}, table))
    return out


# --- VAE entry points (the UNet and CLIP kinds call rename / open_clip_* directly) ------------------
def vae_to_diffusers(sd: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
    """Inner LDM-layout VAE keys → diffusers keys (attention 1×1 convolutions become linear)."""
    return _vae_reshape(rename(sd, dict(vae_pairs(config))), to_linear=True)


def vae_to_ldm(sd: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
    """diffusers VAE keys → inner LDM-layout keys (the inverse of ``vae_to_diffusers``)."""
    return _vae_reshape(rename(sd, {b: a for a, b in vae_pairs(config)}), to_linear=False)


def looks_like_diffusers_vae(keys: list[str]) -> bool:
    return any(k.startswith(("encoder.down_blocks.", "decoder.up_blocks.")) for k in keys)
