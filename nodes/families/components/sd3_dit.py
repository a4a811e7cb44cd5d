"""The SD3 / SD3.5 transformer kind (diffusers' ``SD3Transformer2DModel``, MMDiT; with MMDiT-X's
second image self-attention for SD3.5 medium): config from the tensors, the key table both ways
between Stability AI's single-file layout (``joint_blocks.N.{x,context}_block.*``, ``x_embedder``,
``t_embedder``, ``y_embedder``, ``final_layer``; ComfyUI's checkpoints nest it under
``model.diffusion_model.``) and diffusers' names, the build, and how the sampler calls it.

The table is shape-generic (fused q/k/v are split in thirds), so it serves tiny test models and the
real ones alike. Facts it follows:

- ``attn.qkv`` of both streams is q, k, v stacked along the output axis; ``x_block.attn2`` is the
  MMDiT-X second self-attention (SD3.5 medium: blocks 0–12); ``ln_q`` / ``ln_k`` are the RMS q/k
  norms of SD3.5.
- The last block's context stream stops after its attention input ("pre-only"): no ``attn.proj``,
  no MLP, and its modulation is (shift, scale) in the file and (scale, shift) in diffusers, as is
  the final layer's.
- Heads are 64 wide in every released model (ComfyUI builds ``width / 64`` heads); with q/k norms the
  width is read from them.
- Calling convention (ComfyUI's ``comfy/ldm/modules/diffusionmodules/mmdit.py``): the latent goes in
  as is (the model patchifies it, 2×2), padded circularly to a multiple of the patch size and the
  output cropped back; the timestep is 1000·sigma; the pooled vector is CLIP-L ‖ CLIP-G.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from nodes.core.control_base import bind_controls
from nodes.core.linear_inputs import copy_sliced_inputs
from nodes.core.sampling_hooks import BlockList, BlockStack, ConditioningError, SkipListName
from nodes.core.tensors import ModelLoadError, TensorIndex
from nodes.families.activation import heads_width, transformer_bytes
from nodes.families.components.dit_blocks import DUAL_STREAM_SKIP, dual_stream_stack
from nodes.families.components.unet import lcm_repeat

if TYPE_CHECKING:
    from torch import Tensor

    from nodes.core.cond import CondEntry

_GLOBAL = {  # file name (without .weight/.bias) -> diffusers name
    "x_embedder.proj": "pos_embed.proj",
    "t_embedder.mlp.0": "time_text_embed.timestep_embedder.linear_1",
    "t_embedder.mlp.2": "time_text_embed.timestep_embedder.linear_2",
    "y_embedder.mlp.0": "time_text_embed.text_embedder.linear_1",
    "y_embedder.mlp.2": "time_text_embed.text_embedder.linear_2",
    "context_embedder": "context_embedder",
    "final_layer.linear": "proj_out",
}
_BLOCK = {  # inside joint_blocks.N -> inside transformer_blocks.N (every leaf: weight, bias)
    "x_block.attn.proj": "attn.to_out.0",
    "x_block.attn.ln_q": "attn.norm_q",
    "x_block.attn.ln_k": "attn.norm_k",
    "x_block.attn2.proj": "attn2.to_out.0",
    "x_block.attn2.ln_q": "attn2.norm_q",
    "x_block.attn2.ln_k": "attn2.norm_k",
    "x_block.adaLN_modulation.1": "norm1.linear",
    "x_block.mlp.fc1": "ff.net.0.proj",
    "x_block.mlp.fc2": "ff.net.2",
    "context_block.attn.proj": "attn.to_add_out",
    "context_block.attn.ln_q": "attn.norm_added_q",
    "context_block.attn.ln_k": "attn.norm_added_k",
    "context_block.adaLN_modulation.1": "norm1_context.linear",
    "context_block.mlp.fc1": "ff_context.net.0.proj",
    "context_block.mlp.fc2": "ff_context.net.2",
}
_QKV = {
    "x_block.attn.qkv": ("attn.to_q", "attn.to_k", "attn.to_v"),
    "x_block.attn2.qkv": ("attn2.to_q", "attn2.to_k", "attn2.to_v"),
    "context_block.attn.qkv": ("attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"),
}
_SWAPPED = "context_block.adaLN_modulation.1"  # (shift, scale) ⇄ (scale, shift) in the last block
_FINAL_MOD = "final_layer.adaLN_modulation.1"
HEAD_WIDTH = 64
# the joint attention's output projections: they get the image and text slices of one attention
# output (strided views under a CFG batch; see nodes.core.linear_inputs)
SLICED_INPUTS = ("attn.to_out.0", "attn.to_add_out")


def _swap(tensor: Any) -> Any:
    first, second = tensor.chunk(2, dim=0)
    return torch.cat([second, first])


@dataclass(frozen=True)
class SD3Transformer:
    """The SD3 transformer kind (see the module docstring)."""

    id: str = "sd3_transformer"

    @property
    def model_class(self) -> Any:
        import diffusers  # lazy: diffusers is heavy to import

        return diffusers.SD3Transformer2DModel

    # --- reading and building -----------------------------------------------------------------
    def config_from_tensors(self, index: TensorIndex, prefix: str) -> dict[str, Any]:
        """The ``SD3Transformer2DModel`` config from the shapes under ``prefix``."""
        inner, in_channels, patch, _ = index.shape(f"{prefix}x_embedder.proj.weight")
        layers = index.count(f"{prefix}joint_blocks.")
        norm = f"{prefix}joint_blocks.0.x_block.attn.ln_q.weight"
        head = index.shape(norm)[0] if index.has(norm) else (HEAD_WIDTH if inner % HEAD_WIDTH == 0 else inner)
        positions = index.shape(f"{prefix}pos_embed")[1]
        side = math.isqrt(positions)
        if inner % head or side * side != positions or layers == 0:
            raise ModelLoadError(
                f"{index.path}: an SD3 transformer of width {inner} with {head}-wide heads, "
                f"{layers} blocks and {positions} positions is not a variant Loom can build"
            )
        return {
            "sample_size": 128,
            "patch_size": patch,
            "in_channels": in_channels,
            "out_channels": index.shape(f"{prefix}final_layer.linear.weight")[0] // (patch * patch),
            "num_layers": layers,
            "attention_head_dim": head,
            "num_attention_heads": inner // head,
            "joint_attention_dim": index.shape(f"{prefix}context_embedder.weight")[1],
            "caption_projection_dim": index.shape(f"{prefix}context_embedder.weight")[0],
            "pooled_projection_dim": index.shape(f"{prefix}y_embedder.mlp.0.weight")[1],
            "pos_embed_max_size": side,
            "dual_attention_layers": [
                i for i in range(layers) if index.has(f"{prefix}joint_blocks.{i}.x_block.attn2.qkv.weight")
            ],
            "qk_norm": "rms_norm" if index.has(norm) else None,
        }

    def to_diffusers(self, sd: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
        last = int(config["num_layers"]) - 1
        out: dict[str, Any] = {}
        for name, tensor in sd.items():
            base, _, leaf = name.rpartition(".")
            if name == "pos_embed":
                out["pos_embed.pos_embed"] = tensor
            elif base in _GLOBAL:
                out[f"{_GLOBAL[base]}.{leaf}"] = tensor
            elif base == _FINAL_MOD:
                out[f"norm_out.linear.{leaf}"] = _swap(tensor)
            elif name.startswith("joint_blocks."):
                _, i, rest = name.split(".", 2)
                out.update(_block_to_diffusers(int(i), rest, tensor, last))
            else:
                raise ModelLoadError(f"unexpected tensor {name!r} in an SD3 transformer")
        return out

    def to_original(self, sd: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
        last = int(config["num_layers"]) - 1
        out: dict[str, Any] = {}
        for name, tensor in sd.items():
            original = original_key(name)
            if original is None:
                continue  # a q/k/v piece: fused below
            swapped = original.startswith(_FINAL_MOD) or original.startswith(
                f"joint_blocks.{last}.{_SWAPPED}."
            )
            out[original] = _swap(tensor) if swapped else tensor
        for i in range(last + 1):
            for fused, parts in _QKV.items():
                for leaf in ("weight", "bias"):
                    names = [f"transformer_blocks.{i}.{p}.{leaf}" for p in parts]
                    if all(n in sd for n in names):
                        out[f"joint_blocks.{i}.{fused}.{leaf}"] = torch.cat([sd[n] for n in names], dim=0)
        return out

    def original_names(self, names: Sequence[str], config: Mapping[str, Any]) -> dict[str, str]:
        """Module key -> the file key it comes from (a q/k/v piece: its fused tensor), for block-wise
        merges."""
        return {name: original_key(name, fused=True) or name for name in names}

    def module_keys(self, sd: dict[str, Any]) -> dict[str, Any]:
        return sd

    def empty(self, config: Mapping[str, Any]) -> Any:
        """The module with meta parameters and a meta ``pos_embed`` buffer: the file holds the
        position table, and computing diffusers' initial one costs ~25 s at SD3.5 medium's 384²
        positions (measured on this project's CPU machines)."""
        from accelerate import init_empty_weights  # lazy: accelerate is heavy to import

        cfg = dict(config)
        cfg["dual_attention_layers"] = tuple(cfg.get("dual_attention_layers", ()))
        with init_empty_weights(include_buffers=True):
            return copy_sliced_inputs(self.model_class.from_config(cfg), SLICED_INPUTS)

    def from_pretrained(self, path: Path, safetensors: bool) -> Any:
        module = self.model_class.from_pretrained(path, local_files_only=True, use_safetensors=safetensors)
        return copy_sliced_inputs(module, SLICED_INPUTS)

    # --- sampling -----------------------------------------------------------------------------
    def conditioning(
        self, entries: Sequence[CondEntry], batch: int, size: tuple[int, int], *, like: Tensor | None = None
    ) -> dict[str, Any]:
        """Text tokens and the pooled CLIP-L ‖ CLIP-G vector per row."""

        def to(t: Tensor) -> Tensor:
            return t if like is None else t.to(like)

        embeds = lcm_repeat([e.embeds for e in entries])  # ComfyUI's rule for mixed lengths
        hidden = torch.cat([e.expand(batch, -1, -1) for e in embeds])
        pooled = torch.cat([_pooled(e).expand(batch, -1) for e in entries])
        kwargs: dict[str, Any] = {"encoder_hidden_states": to(hidden), "pooled_projections": to(pooled)}
        if any(e.extras.get("control") is not None for e in entries):  # ControlNets (dit_control)
            kwargs["control"] = bind_controls(entries, batch)
        return kwargs

    def activation_bytes(self, module: Any, run: Any, element: int) -> int:
        """Activation memory of ``run`` (``engine.memory.device_budget.RunShape``) in bytes: the widest moment of
        a joint block over the patched image tokens and the text tokens. Per token, in widths: the
        residual and its norm (2), the MLP's hidden states before and after GELU (4 + 4): 10."""

        patch = int(module.config.patch_size)
        return transformer_bytes(run, width=heads_width(module.config), patch=patch, live=10, element=element)

    def forward(self, module: Any, x_in: Tensor, timestep: Tensor, cond_kwargs: dict[str, Any]) -> Tensor:
        """Call the transformer on ``x_in`` (B, 16, H, W) at ``timestep`` (= 1000·sigma)."""

        kwargs = dict(cond_kwargs)
        options = kwargs.pop("transformer_options", None) or {}
        if options.get("patches"):
            raise ConditioningError(
                f"the SD3 transformer cannot run block patches {sorted(options['patches'])}; "
                "remove the patch node from the workflow"
            )
        control, last = kwargs.pop("control", None), None
        if control is not None:  # one residual per joint block, added after it
            depth = int(module.config.num_layers)
            inputs = {**kwargs, "patch_embed": module.pos_embed.proj}  # SD3.5 ControlNets embed with it
            blocks = control.residuals(x_in, timestep, inputs, (depth, 0)).blocks
            if blocks is not None:
                kwargs["block_controlnet_hidden_states"] = blocks
                last = blocks[-1] if len(blocks) == depth else None  # diffusers skips the last block
        patch = module.config.patch_size
        height, width = x_in.shape[-2:]
        pad_h, pad_w = (-height) % patch, (-width) % patch
        x = F.pad(x_in, (0, pad_w, 0, pad_h), mode="circular") if pad_h or pad_w else x_in
        t = timestep.to(x.dtype).reshape(-1).expand(x.shape[0])
        hook = None
        if (
            last is not None
        ):  # ComfyUI adds the last block's share too: on the final norm's input, for this call
            share = last
            hook = module.norm_out.register_forward_pre_hook(lambda _m, args: (args[0] + share, *args[1:]))
        try:
            out = module(hidden_states=x, timestep=t, return_dict=False, **kwargs)[0]
        finally:
            if hook is not None:
                hook.remove()
        return out[..., :height, :width]

    @property
    def skip_lists(self) -> Mapping[SkipListName, BlockList]:
        """The joint blocks, for skip-layer guidance (ComfyUI's MMDiT reads ``double_block`` patches
        only)."""

        return DUAL_STREAM_SKIP

    def block_stack(self, module: Any) -> BlockStack:
        """The joint blocks, for block-level step caches."""

        return dual_stream_stack(module.transformer_blocks)

    def check_conditioning(self, module: Any, entries: Sequence[CondEntry], name: str) -> None:
        if not entries:
            raise ConditioningError(f"{name} conditioning is empty; connect a CLIPTextEncode output")
        width, pooled = module.config.joint_attention_dim, module.config.pooled_projection_dim
        for e in entries:
            if e.embeds.shape[-1] != width:
                raise ConditioningError(
                    f"{name} conditioning has {e.embeds.shape[-1]}-wide embeddings but this SD3 model expects "
                    f"{width}; load its text encoders with TripleCLIPLoader (clip_l, clip_g, t5xxl) or "
                    "DualCLIPLoader (type sd3)"
                )
            if e.pooled is None or e.pooled.shape[-1] != pooled:
                raise ConditioningError(
                    f"{name} conditioning has no {pooled}-wide pooled vector (CLIP-L + CLIP-G), which SD3 needs; "
                    "encode the prompt with the CLIP of TripleCLIPLoader or of the SD3 checkpoint"
                )


def _pooled(entry: CondEntry) -> Tensor:
    if entry.pooled is None:
        raise ConditioningError(
            "an SD3 conditioning entry has no pooled CLIP vector; encode the prompt with "
            "the CLIP of TripleCLIPLoader (clip_l, clip_g, t5xxl)"
        )
    return entry.pooled


_BACK_GLOBAL = {v: k for k, v in _GLOBAL.items()}
_BACK_BLOCK = {v: k for k, v in _BLOCK.items()}
_BACK_QKV = {piece: fused for fused, pieces in _QKV.items() for piece in pieces}


def original_key(name: str, *, fused: bool = False) -> str | None:
    """The file key of module key ``name``; a q/k/v piece has none (None) unless ``fused``: then
    the fused tensor's key."""
    base, _, leaf = name.rpartition(".")
    if name == "pos_embed.pos_embed":
        return "pos_embed"
    if base in _BACK_GLOBAL:
        return f"{_BACK_GLOBAL[base]}.{leaf}"
    if base == "norm_out.linear":
        return f"{_FINAL_MOD}.{leaf}"
    if name.startswith("transformer_blocks."):
        _, i, rest = name.split(".", 2)
        rest_base = rest.rpartition(".")[0]
        if rest_base in _BACK_BLOCK:
            return f"joint_blocks.{i}.{_BACK_BLOCK[rest_base]}.{leaf}"
        if fused and rest_base in _BACK_QKV:
            return f"joint_blocks.{i}.{_BACK_QKV[rest_base]}.{leaf}"
    return None


def _block_to_diffusers(i: int, rest: str, tensor: Any, last: int) -> dict[str, Any]:
    base, _, leaf = rest.rpartition(".")
    head = f"transformer_blocks.{i}."
    if base in _QKV:
        return {f"{head}{p}.{leaf}": t for p, t in zip(_QKV[base], tensor.chunk(3, dim=0), strict=True)}
    if base in _BLOCK:
        return {f"{head}{_BLOCK[base]}.{leaf}": _swap(tensor) if base == _SWAPPED and i == last else tensor}
    raise ModelLoadError(f"unexpected tensor {rest!r} in SD3 joint block {i}")
