"""Architecture read from the tensors: diffusers/transformers configs for a UNet, VAE or CLIP text
encoder whose weights are in the original (LDM) layout, whatever their size.

What the shapes cannot tell (attention heads, the VAE's group count) comes from the family's
rule (``heads``): SD1.x uses 8 heads everywhere; SD2.x and SDXL use 64-channel heads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nodes.core.tensors import ModelLoadError, TensorIndex

HeadsRule = Callable[[int], int]  # channels -> number of heads


def eight_heads(channels: int) -> int:
    return 8


def heads_of_64(channels: int) -> int:
    return max(1, channels // 64)


def unet_config(index: TensorIndex, prefix: str, heads: HeadsRule, sample_size: int) -> dict[str, Any]:
    """UNet2DConditionModel config from tensors named ``{prefix}input_blocks.…``."""
    p = prefix
    c0, in_ch = index.shape(f"{p}input_blocks.0.0.weight")[:2]
    out_ch = index.shape(f"{p}out.2.weight")[0]
    channels: list[int] = []
    attention: list[bool] = []
    depth: list[int] = []
    per_level: list[int] = []
    k, count = 1, 0
    while index.any_with(f"{p}input_blocks.{k}."):
        if index.has(f"{p}input_blocks.{k}.0.op.weight"):  # a downsample closes the level
            per_level.append(count)
            count = 0
        else:
            if count == 0:
                channels.append(index.shape(f"{p}input_blocks.{k}.0.out_layers.3.weight")[0])
                has_attn = index.any_with(f"{p}input_blocks.{k}.1.")
                attention.append(has_attn)
                depth.append(index.count(f"{p}input_blocks.{k}.1.transformer_blocks.") if has_attn else 1)
            count += 1
        k += 1
    per_level.append(count)
    if not channels or len(set(per_level)) != 1:
        raise ModelLoadError(
            f"{index.path.name}: cannot read the UNet's blocks (layers per level {per_level})"
        )
    attn_key = next(
        (key for key in index.tensors if key.startswith(p) and key.endswith("attn2.to_k.weight")), None
    )
    if attn_key is None:
        raise ModelLoadError(
            f"{index.path.name}: the UNet has no cross-attention layers; not an SD1/SD2/SDXL UNet"
        )
    context_dim = index.shape(attn_key)[1]
    proj_key = next(k for k in index.tensors if k.startswith(p) and k.endswith("proj_in.weight"))
    time_dim = index.shape(f"{p}time_embed.0.weight")[0]
    cfg: dict[str, Any] = {
        "_class_name": "UNet2DConditionModel",
        "sample_size": sample_size,
        "in_channels": in_ch,
        "out_channels": out_ch,
        "block_out_channels": channels,
        "layers_per_block": per_level[0],
        "down_block_types": ["CrossAttnDownBlock2D" if a else "DownBlock2D" for a in attention],
        "up_block_types": ["CrossAttnUpBlock2D" if a else "UpBlock2D" for a in reversed(attention)],
        "mid_block_type": "UNetMidBlock2DCrossAttn",
        "cross_attention_dim": context_dim,
        "attention_head_dim": [heads(c) for c in channels],  # diffusers' name; it means heads
        "use_linear_projection": len(index.shape(proj_key)) == 2,
        "transformer_layers_per_block": depth,
        "norm_num_groups": 32 if all(c % 32 == 0 for c in channels) else channels[0],
    }
    if time_dim != 4 * c0:
        cfg["time_embedding_dim"] = time_dim
    if index.has(f"{p}label_emb.0.0.weight"):
        cfg["addition_embed_type"] = "text_time"
        cfg["projection_class_embeddings_input_dim"] = index.shape(f"{p}label_emb.0.0.weight")[1]
    return cfg


def vae_config(index: TensorIndex, prefix: str, scaling_factor: float, sample_size: int) -> dict[str, Any]:
    """AutoencoderKL config from tensors named ``{prefix}encoder.down.{i}.block.{j}.…``."""
    p = prefix
    levels = index.count(f"{p}encoder.down.")
    if levels == 0:
        raise ModelLoadError(f"{index.path.name}: no VAE encoder blocks under {prefix!r}")
    channels = [index.shape(f"{p}encoder.down.{i}.block.0.conv1.weight")[0] for i in range(levels)]
    return {
        "_class_name": "AutoencoderKL",
        "in_channels": index.shape(f"{p}encoder.conv_in.weight")[1],
        "out_channels": index.shape(f"{p}decoder.conv_out.weight")[0],
        "down_block_types": ["DownEncoderBlock2D"] * levels,
        "up_block_types": ["UpDecoderBlock2D"] * levels,
        "block_out_channels": channels,
        "layers_per_block": index.count(f"{p}encoder.down.0.block."),
        "latent_channels": index.shape(f"{p}decoder.conv_in.weight")[1],
        "norm_num_groups": 32 if all(c % 32 == 0 for c in channels) else channels[0],
        "sample_size": sample_size,
        "scaling_factor": scaling_factor,
        "use_quant_conv": index.has(f"{p}quant_conv.weight"),
        "use_post_quant_conv": index.has(f"{p}post_quant_conv.weight"),
        "mid_block_add_attention": index.any_with(f"{p}encoder.mid.attn_1."),
    }


def vae_config_diffusers_keys(index: TensorIndex, scaling_factor: float, sample_size: int) -> dict[str, Any]:
    """AutoencoderKL config for a standalone VAE file already in diffusers' key layout."""
    levels = index.count("encoder.down_blocks.")
    channels = [index.shape(f"encoder.down_blocks.{i}.resnets.0.conv1.weight")[0] for i in range(levels)]
    return {
        "_class_name": "AutoencoderKL",
        "in_channels": index.shape("encoder.conv_in.weight")[1],
        "out_channels": index.shape("decoder.conv_out.weight")[0],
        "down_block_types": ["DownEncoderBlock2D"] * levels,
        "up_block_types": ["UpDecoderBlock2D"] * levels,
        "block_out_channels": channels,
        "layers_per_block": index.count("encoder.down_blocks.0.resnets."),
        "latent_channels": index.shape("decoder.conv_in.weight")[1],
        "norm_num_groups": 32 if all(c % 32 == 0 for c in channels) else channels[0],
        "sample_size": sample_size,
        "scaling_factor": scaling_factor,
        "use_quant_conv": index.has("quant_conv.weight"),
        "use_post_quant_conv": index.has("post_quant_conv.weight"),
        "mid_block_add_attention": index.any_with("encoder.mid_block.attentions."),
    }


def clip_config(index: TensorIndex, prefix: str, layout: str) -> dict[str, Any]:
    """CLIPTextConfig kwargs for an HF-layout (``hf_clip``) or OpenCLIP-layout text encoder."""
    p = prefix
    if layout == "hf_clip":
        vocab, hidden = index.shape(f"{p}embeddings.token_embedding.weight")
        positions = index.shape(f"{p}embeddings.position_embedding.weight")[0]
        layers = index.count(f"{p}encoder.layers.")
        inner = index.shape(f"{p}encoder.layers.0.mlp.fc1.weight")[0]
        projection = (
            index.shape(f"{p}text_projection.weight")[0] if index.has(f"{p}text_projection.weight") else None
        )
        act = "quick_gelu"  # OpenAI CLIP ViT-L/14
    else:
        vocab, hidden = index.shape(f"{p}token_embedding.weight")
        positions = index.shape(f"{p}positional_embedding")[0]
        layers = index.count(f"{p}transformer.resblocks.")
        inner = index.shape(f"{p}transformer.resblocks.0.mlp.c_fc.weight")[0]
        projection = index.shape(f"{p}text_projection")[1] if index.has(f"{p}text_projection") else None
        act = "gelu"  # OpenCLIP ViT-H / ViT-bigG
    cfg: dict[str, Any] = {
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": inner,
        "num_hidden_layers": layers,
        "num_attention_heads": heads_of_64(hidden),
        "max_position_embeddings": positions,
        "hidden_act": act,
        "layer_norm_eps": 1e-5,
        "bos_token_id": 49406,
        "eos_token_id": 49407,
        "pad_token_id": 1,
    }
    if projection is not None:
        cfg["projection_dim"] = projection
    return cfg
