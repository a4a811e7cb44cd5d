"""Union ("ControlNet++" / ProMax) SDXL ControlNets (xinsir's controlnet-union-sdxl-1.0 layout:
``task_embedding``, ``transformer_layes.*``, ``spatial_ch_projs``, ``control_add_embedding``), held
in diffusers' ``ControlNetUnionModel`` and run with ComfyUI's semantics, and ``SetUnionControlNetType``.

ComfyUI's forward differs from diffusers' ``ControlNetUnionModel.forward``, so the call is written
here over the diffusers module's layers: the control type (one index, or none for "auto") becomes
a one-hot vector whose sinusoidal embedding, through ``control_add_embedding``, is added to the
time embedding; with a type set, the hint's features are averaged to one token, the type's task
embedding is added, the token goes through the transformer layers (attention over the tokens of
each batch row: here the one token), and ``spatial_ch_projs`` of the result is added to the hint's
features everywhere; with "auto" the hint's features are used as they are. The rest is the plain
ControlNet: the features are added after ``conv_in``, the down and middle blocks run, the zero
convolutions give the residuals, scaled by the strength.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch

from engine.context import NodeContext
from engine.node import Node
from engine.schema import COMBO, Input, NodeSchema, Output
from nodes.core.control_base import CONTROL_NET, file_label

# ComfyUI's UNION_CONTROLNET_TYPES: the task index of each control type (ProMax adds "repaint")
UNION_TYPES: dict[str, int] = {
    "openpose": 0,
    "depth": 1,
    "hed/pidi/scribble/ted": 2,
    "canny/lineart/anime_lineart/mlsd": 3,
    "normal": 4,
    "segment": 5,
    "tile": 6,
    "repaint": 7,
}


def union_config(shapes: Mapping[str, Sequence[int]]) -> dict[str, Any]:
    """The union fields of a ``ControlNetUnionModel`` config, read from the tensors."""
    types, width = (int(s) for s in shapes["task_embedding"])
    layers = 1 + max(int(k.split(".")[1]) for k in shapes if k.startswith("transformer_layes."))
    embed = int(shapes["control_add_embedding.linear_1.weight"][1]) // types
    return {
        "num_control_type": types,
        "num_trans_channel": width,
        "num_trans_head": 8,
        "num_trans_layer": layers,
        "num_proj_channel": int(shapes["spatial_ch_projs.weight"][0]),
        "addition_time_embed_dim": embed,
    }


def _transformer(module: Any, x: torch.Tensor) -> torch.Tensor:
    """The union transformer over (B, tokens, C), attending over each row's tokens."""
    for layer in module.transformer_layes:
        h = layer.ln_1(x).transpose(0, 1)  # nn.MultiheadAttention takes (tokens, B, C)
        x = x + layer.attn(h, h, h, need_weights=False)[0].transpose(0, 1)
        x = x + layer.mlp(layer.ln_2(x))
    return x


def union_forward(
    module: Any,
    x: torch.Tensor,
    timestep: torch.Tensor,
    hint: torch.Tensor,
    control_type: Sequence[int],
    strength: float,
    encoder_hidden_states: torch.Tensor,
    added_cond_kwargs: Mapping[str, torch.Tensor] | None = None,
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """(down, mid) residuals of a union ControlNet for one call, ComfyUI's way (module docstring)."""
    cfg = module.config
    t = timestep.reshape(-1).to(x.device)
    t = t.expand(x.shape[0]) if t.numel() == 1 else t
    emb = module.time_embedding(module.time_proj(t).to(x.dtype))
    one_hot = torch.zeros(cfg.num_control_type, device=x.device)
    if control_type:
        one_hot[list(control_type)] = 1.0
    emb = emb + module.control_add_embedding(module.control_type_proj(one_hot).to(x.dtype).reshape(1, -1))
    if cfg.addition_embed_type == "text_time":
        if added_cond_kwargs is None:
            raise ValueError(
                "this union ControlNet (with size embeddings) needs the pooled output and size ids of the conditioning"
            )
        time_ids = module.add_time_proj(added_cond_kwargs["time_ids"].flatten()).reshape(x.shape[0], -1)
        emb = emb + module.add_embedding(
            torch.cat([added_cond_kwargs["text_embeds"], time_ids], dim=-1).to(emb.dtype)
        )
    sample = module.conv_in(x)
    cond = module.controlnet_cond_embedding(hint.to(x.dtype))
    if control_type:
        seq = cond.mean(dim=(2, 3)) + module.task_embedding[control_type[0]].to(cond.dtype)
        alpha = module.spatial_ch_projs(_transformer(module, seq.unsqueeze(1))[:, 0])
        cond = cond + alpha[:, :, None, None]
    sample = sample + cond
    skips: tuple[torch.Tensor, ...] = (sample,)
    for block in module.down_blocks:
        if getattr(block, "has_cross_attention", False):
            sample, res = block(hidden_states=sample, temb=emb, encoder_hidden_states=encoder_hidden_states)
        else:
            sample, res = block(hidden_states=sample, temb=emb)
        skips += res
    sample = module.mid_block(sample, emb, encoder_hidden_states=encoder_hidden_states)
    down = [zero(s) * strength for s, zero in zip(skips, module.controlnet_down_blocks, strict=True)]
    mid = module.controlnet_mid_block(sample) * strength
    if cfg.global_pool_conditions:
        return [d.mean(dim=(2, 3), keepdim=True) for d in down], mid.mean(dim=(2, 3), keepdim=True)
    return down, mid


class SetUnionControlNetType(Node):
    SCHEMA = NodeSchema(
        node_id="SetUnionControlNetType",
        display_name="SetUnionControlNetType",
        category="conditioning/controlnet",
        description="Tells a union ControlNet which kind of control image it gets ('auto': none).",
        inputs=(
            Input(
                "control_net",
                CONTROL_NET,
                "The ControlNet (a union ControlNet uses the type; others ignore it).",
            ),
            Input(
                "type", COMBO, "The kind of control image.", default="auto", options=("auto", *UNION_TYPES)
            ),
        ),
        outputs=(Output("CONTROL_NET", CONTROL_NET, "The ControlNet with the type set."),),
    )

    def run(self, ctx: NodeContext, *, control_net: Any, type: str) -> tuple[Any]:  # noqa: A002 - ComfyUI's name
        index = UNION_TYPES.get(type, -1)
        types = getattr(control_net, "union_types", None)
        if index >= 0 and types is not None and index >= types:
            raise ValueError(
                f"the union ControlNet {file_label(control_net.path)!r} knows {types} control types and "
                f"{type!r} is number {index}; pick another type (only ProMax files know 'repaint')"
            )
        if not hasattr(control_net, "control_type"):
            return (control_net,)

        return (replace(control_net, control_type=(index,) if index >= 0 else ()),)


NODES: list[type[Node]] = [SetUnionControlNetType]
