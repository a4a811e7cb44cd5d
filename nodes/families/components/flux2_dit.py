"""The Flux.2 transformer kind (diffusers' ``Flux2Transformer2DModel``, Klein and dev alike): config
from the tensors, the key table both ways between Black Forest Labs' single-file layout (the layout
of ComfyUI's ``diffusion_models`` files, optionally under ``model.diffusion_model.``) and diffusers'
names, the build, and how the sampler calls it.

Layout facts the table follows (shape-generic: tiny test models and the real widths alike):

- No biases anywhere; modulation is shared per stream: ``double_stream_modulation_img.lin``,
  ``double_stream_modulation_txt.lin``, ``single_stream_modulation.lin`` (``.linear`` in diffusers).
- ``img_attn.qkv`` / ``txt_attn.qkv`` are q, k, v stacked along the output axis; the single blocks'
  ``linear1`` (fused q, k, v and SwiGLU input) and ``linear2`` stay fused in diffusers too
  (``attn.to_qkv_mlp_proj``, ``attn.to_out``).
- The final layer's modulation is (shift, scale) in the file and (scale, shift) in diffusers.

Calling convention (ComfyUI's Flux.2 model and diffusers' Flux2 pipelines agree): the 128-channel
latent (the VAE's 32 channels in 2×2 patches) is flattened to one token per latent pixel, image ids
are ``(0, row, col, 0)``, text ids ``(0, 0, 0, index)``, the timestep IS sigma (the model multiplies by
1000 inside), and dev (guidance-distilled, a ``guidance_in`` embedder) takes the guidance value too.
Text shorter than 512 tokens (Mistral prompts; Klein's are padded to 512 by the encoder) gets zero rows
in front up to 512, as ComfyUI's ``model_base.Flux2`` does; the text ids count over the padded length.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from nodes.core.sampling_hooks import BlockList, BlockStack, ConditioningError, SkipListName
from nodes.core.tensors import ModelLoadError, TensorIndex
from nodes.families.activation import heads_width, transformer_bytes
from nodes.families.components.dit_blocks import flux_block_stack, flux_skip_lists
from nodes.families.components.unet import lcm_repeat

if TYPE_CHECKING:
    from torch import Tensor

    from nodes.core.cond import CondEntry

DEFAULT_GUIDANCE = 3.5  # ComfyUI's value for a guidance-distilled Flux model when no FluxGuidance is set
MIN_TEXT_TOKENS = 512  # ComfyUI's Flux.2 model pads shorter text with zero rows in front
ROPE_THETA = 2000
EPS = 1e-6
ENCODERS_BY_WIDTH = {
    7680: "Qwen3-4B (Klein 4B)",
    12288: "Qwen3-8B (Klein 9B)",
    15360: "Mistral-Small 3.x (dev)",
}

_TOP = {  # file name (without .weight) -> diffusers name
    "img_in": "x_embedder",
    "txt_in": "context_embedder",
    "time_in.in_layer": "time_guidance_embed.timestep_embedder.linear_1",
    "time_in.out_layer": "time_guidance_embed.timestep_embedder.linear_2",
    "guidance_in.in_layer": "time_guidance_embed.guidance_embedder.linear_1",
    "guidance_in.out_layer": "time_guidance_embed.guidance_embedder.linear_2",
    "double_stream_modulation_img.lin": "double_stream_modulation_img.linear",
    "double_stream_modulation_txt.lin": "double_stream_modulation_txt.linear",
    "single_stream_modulation.lin": "single_stream_modulation.linear",
    "final_layer.linear": "proj_out",
}
_DOUBLE = {  # inside double_blocks.N -> inside transformer_blocks.N
    "img_attn.proj.weight": "attn.to_out.0.weight",
    "txt_attn.proj.weight": "attn.to_add_out.weight",
    "img_mlp.0.weight": "ff.linear_in.weight",
    "img_mlp.2.weight": "ff.linear_out.weight",
    "txt_mlp.0.weight": "ff_context.linear_in.weight",
    "txt_mlp.2.weight": "ff_context.linear_out.weight",
    "img_attn.norm.query_norm.scale": "attn.norm_q.weight",
    "img_attn.norm.key_norm.scale": "attn.norm_k.weight",
    "txt_attn.norm.query_norm.scale": "attn.norm_added_q.weight",
    "txt_attn.norm.key_norm.scale": "attn.norm_added_k.weight",
}
_DOUBLE_QKV = {
    "img_attn.qkv.weight": ("attn.to_q.weight", "attn.to_k.weight", "attn.to_v.weight"),
    "txt_attn.qkv.weight": ("attn.add_q_proj.weight", "attn.add_k_proj.weight", "attn.add_v_proj.weight"),
}
_SINGLE = {
    "linear1.weight": "attn.to_qkv_mlp_proj.weight",
    "linear2.weight": "attn.to_out.weight",
    "norm.query_norm.scale": "attn.norm_q.weight",
    "norm.key_norm.scale": "attn.norm_k.weight",
}
_FINAL_MOD = "final_layer.adaLN_modulation.1.weight"


def rope_axes(head_dim: int) -> tuple[int, int, int, int]:
    """The rotary split of a head over (time, row, col, index): Flux.2's (32, 32, 32, 32) for 128-wide
    heads, four equal even parts for other widths (test models)."""
    quarter = head_dim // 4 // 2 * 2
    return (head_dim - 3 * quarter, quarter, quarter, quarter)


@dataclass(frozen=True)
class Flux2Transformer:
    """The Flux.2 transformer kind (see the module docstring)."""

    id: str = "flux2_transformer"

    # --- reading and building -----------------------------------------------------------------
    def config_from_tensors(self, index: TensorIndex, prefix: str) -> dict[str, Any]:
        """The ``Flux2Transformer2DModel`` config from the shapes under ``prefix``."""
        inner, in_channels = index.shape(f"{prefix}img_in.weight")
        head_dim = index.shape(f"{prefix}double_blocks.0.img_attn.norm.query_norm.scale")[0]
        mlp_in = index.shape(f"{prefix}double_blocks.0.img_mlp.0.weight")[0]  # SwiGLU: 2 × hidden
        if inner % head_dim or mlp_in % 2 or int(inner * (mlp_in / 2 / inner)) != mlp_in // 2:
            raise ModelLoadError(
                f"{index.path}: a Flux.2 transformer with width {inner}, {head_dim}-wide heads and "
                f"MLP input {mlp_in} is not a variant Loom can build"
            )
        return {
            "patch_size": 1,
            "in_channels": in_channels,
            "out_channels": index.shape(f"{prefix}final_layer.linear.weight")[0],
            "num_layers": index.count(f"{prefix}double_blocks."),
            "num_single_layers": index.count(f"{prefix}single_blocks."),
            "attention_head_dim": head_dim,
            "num_attention_heads": inner // head_dim,
            "joint_attention_dim": index.shape(f"{prefix}txt_in.weight")[1],
            "timestep_guidance_channels": index.shape(f"{prefix}time_in.in_layer.weight")[1],
            "mlp_ratio": mlp_in / 2 / inner,
            "axes_dims_rope": list(rope_axes(head_dim)),
            "rope_theta": ROPE_THETA,
            "eps": EPS,
            "guidance_embeds": index.has(f"{prefix}guidance_in.in_layer.weight"),
        }

    def to_diffusers(self, sd: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, tensor in sd.items():
            head, _, leaf = name.rpartition(".")
            if head in _TOP:
                out[f"{_TOP[head]}.{leaf}"] = tensor
            elif name == _FINAL_MOD:
                shift, scale = tensor.chunk(2, dim=0)
                out["norm_out.linear.weight"] = torch.cat([scale, shift])
            elif name.startswith("double_blocks."):
                _, i, rest = name.split(".", 2)
                if rest in _DOUBLE_QKV:
                    for part, t in zip(_DOUBLE_QKV[rest], tensor.chunk(3, dim=0), strict=True):
                        out[f"transformer_blocks.{i}.{part}"] = t
                elif rest in _DOUBLE:
                    out[f"transformer_blocks.{i}.{_DOUBLE[rest]}"] = tensor
                else:
                    raise ModelLoadError(f"unexpected tensor {name!r} in a Flux.2 double block")
            elif name.startswith("single_blocks.") and name.split(".", 2)[2] in _SINGLE:
                _, i, rest = name.split(".", 2)
                out[f"single_transformer_blocks.{i}.{_SINGLE[rest]}"] = tensor
            else:
                raise ModelLoadError(f"unexpected tensor {name!r} in a Flux.2 transformer")
        return out

    def to_original(self, sd: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
        top = {f"{v}.weight": f"{k}.weight" for k, v in _TOP.items()}
        double = {v: k for k, v in _DOUBLE.items()}
        single = {v: k for k, v in _SINGLE.items()}
        out: dict[str, Any] = {}
        for name, tensor in sd.items():
            if name in top:
                out[top[name]] = tensor
            elif name == "norm_out.linear.weight":
                scale, shift = tensor.chunk(2, dim=0)
                out[_FINAL_MOD] = torch.cat([shift, scale])
            elif name.startswith("transformer_blocks.") and name.split(".", 2)[2] in double:
                _, i, rest = name.split(".", 2)
                out[f"double_blocks.{i}.{double[rest]}"] = tensor
            elif name.startswith("single_transformer_blocks.") and name.split(".", 2)[2] in single:
                _, i, rest = name.split(".", 2)
                out[f"single_blocks.{i}.{single[rest]}"] = tensor
        for block in range(config["num_layers"]):
            for fused, parts in _DOUBLE_QKV.items():
                names = [f"transformer_blocks.{block}.{p}" for p in parts]
                if all(n in sd for n in names):
                    out[f"double_blocks.{block}.{fused}"] = torch.cat([sd[n] for n in names], dim=0)
        return out

    def module_keys(self, sd: dict[str, Any]) -> dict[str, Any]:
        return sd

    def empty(self, config: Mapping[str, Any]) -> Any:
        from diffusers import Flux2Transformer2DModel  # lazy: diffusers is heavy to import

        return Flux2Transformer2DModel.from_config(dict(config))

    def from_pretrained(self, path: Path, safetensors: bool) -> Any:
        from diffusers import Flux2Transformer2DModel  # lazy: diffusers is heavy to import

        return Flux2Transformer2DModel.from_pretrained(
            path, local_files_only=True, use_safetensors=safetensors
        )

    # --- sampling -----------------------------------------------------------------------------
    def conditioning(
        self, entries: Sequence[CondEntry], batch: int, size: tuple[int, int], *, like: Tensor | None = None
    ) -> dict[str, Any]:
        """Text tokens (zero rows in front up to 512), text ids ``(0, 0, 0, index)`` and the guidance value per row."""

        def to(t: Tensor) -> Tensor:
            return t if like is None else t.to(like)

        padded = [F.pad(e.embeds, (0, 0, max(0, MIN_TEXT_TOKENS - e.embeds.shape[1]), 0)) for e in entries]
        embeds = lcm_repeat(padded)  # ComfyUI's rule for mixed lengths
        length = embeds[0].shape[1]
        hidden = torch.cat([e.expand(batch, -1, -1) for e in embeds])
        txt_ids = torch.zeros(length, 4)
        txt_ids[:, 3] = torch.arange(length)
        values = [e.extras.get("guidance", DEFAULT_GUIDANCE) for e in entries]
        out = {"encoder_hidden_states": to(hidden), "txt_ids": to(txt_ids)}
        if all(v is None for v in values):  # FluxDisableGuidance: the guidance embedder is skipped
            return out
        return out | {"guidance": to(torch.tensor([float(v or 0.0) for v in values for _ in range(batch)]))}

    def activation_bytes(self, module: Any, run: Any, element: int) -> int:
        """Activation memory of ``run`` (``engine.memory.device_budget.RunShape``) in bytes: the widest moment of
        a single-stream block over the latent's tokens (one per cell: the 128 channels are already
        2×2 patches) and the text tokens. Per token, in widths, with the SwiGLU MLP ``r`` wide
        (``mlp_ratio``): the residual and its norm (2), the fused q/k/v and gate/up projection
        (3 + 2r), the gated product (r), the attention output (1), their concatenation (1 + r)."""

        ratio = float(getattr(module.config, "mlp_ratio", 3.0))
        live = 7 + 4 * ratio
        return transformer_bytes(run, width=heads_width(module.config), patch=1, live=live, element=element)

    def forward(self, module: Any, x_in: Tensor, timestep: Tensor, cond_kwargs: dict[str, Any]) -> Tensor:
        """Flatten ``x_in`` (B, 128, H, W) to tokens, call the transformer at ``timestep`` (= sigma),
        fold the output back to the latent's shape."""
        kwargs = dict(cond_kwargs)
        options = kwargs.pop("transformer_options", None)
        if options and options.get("patches"):
            raise ConditioningError(
                f"the Flux.2 transformer cannot run block patches {sorted(options['patches'])}; "
                "remove the patch node from the workflow"
            )
        if not getattr(module.config, "guidance_embeds", False):
            kwargs.pop("guidance", None)
        b, c, h, w = x_in.shape
        tokens = x_in.reshape(b, c, h * w).permute(0, 2, 1).contiguous()  # see nodes.core.linear_inputs
        t = timestep.to(x_in.dtype).reshape(-1).expand(b)
        out = module(
            hidden_states=tokens, timestep=t, img_ids=image_ids(h, w).to(x_in), return_dict=False, **kwargs
        )[0]
        return out.permute(0, 2, 1).reshape(b, -1, h, w)

    @property
    def skip_lists(self) -> Mapping[SkipListName, BlockList]:
        """The double and single blocks, for skip-layer guidance (as ComfyUI's Flux.2 model)."""
        return flux_skip_lists(joined_single=True)

    def block_stack(self, module: Any) -> BlockStack:
        """The double then the single blocks (one text+image sequence), for block-level step caches."""

        return flux_block_stack(module, joined_single=True)

    def check_conditioning(self, module: Any, entries: Sequence[CondEntry], name: str) -> None:
        if not entries:
            raise ConditioningError(f"{name} conditioning is empty; connect a CLIPTextEncode output")
        width = module.config.joint_attention_dim
        for e in entries:
            if e.embeds.shape[-1] != width:
                wants = ENCODERS_BY_WIDTH.get(width, f"{width}-wide stacked hidden states")
                raise ConditioningError(
                    f"{name} conditioning has {e.embeds.shape[-1]}-wide embeddings but this Flux.2 model expects "
                    f"{width} ({wants}); encode the prompt with the CLIP of CLIPLoader (type flux2) holding the "
                    "text encoder that belongs to this model"
                )


def image_ids(h: int, w: int) -> Tensor:
    """Position ids (H·W, 4) of a latent of ``h`` × ``w`` pixels: ``(0, row, col, 0)``."""

    ids = torch.zeros(h, w, 4)
    ids[..., 1] = torch.arange(h)[:, None]
    ids[..., 2] = torch.arange(w)[None, :]
    return ids.reshape(-1, 4)
