"""The Flux.1 transformer kind (diffusers' ``FluxTransformer2DModel``): config from the tensors, the
build, and how the sampler calls it. Its files use Black Forest Labs' single-file layout
(``double_blocks.N``, ``single_blocks.N``, ``img_in``...; the layout of ComfyUI's
``diffusion_models`` files, which ComfyUI's all-in-one checkpoints nest under
``model.diffusion_model.``); the key table between it and diffusers' names is ``flux_keys``.

- Calling convention (ComfyUI's ``comfy/ldm/flux``): the 16-channel latent is packed into 2×2
  patches (64 channels per token, channel-major), image token ids are ``(0, row, col)``, text ids
  zeros, the timestep IS sigma (the model multiplies by 1000 inside, as does diffusers), and
  guidance-distilled models (dev) take the guidance value as a second embedding; a conditioning
  whose guidance is None (FluxDisableGuidance) gets no guidance embedding at all, as in ComfyUI.
- Reference latents (ReferenceLatent, Flux Kontext) become extra image tokens after the sampled
  latent's (``flux_kontext``); Chroma's transformer ignores them, as ComfyUI's does.
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
from nodes.core.sampling_hooks import BlockList, BlockStack, ConditioningError, SkipListName
from nodes.core.tensors import ModelLoadError, TensorIndex
from nodes.families.activation import heads_width, transformer_bytes
from nodes.families.components import flux_keys
from nodes.families.components.dit_blocks import flux_block_stack, flux_skip_lists
from nodes.families.components.flux_kontext import reference_tokens
from nodes.families.components.latent_patches import pack, pad_to_even, unpack
from nodes.families.components.unet import lcm_repeat
from nodes.families.latent_format import LatentFormat

if TYPE_CHECKING:
    from torch import Tensor

    from nodes.core.cond import CondEntry

DEFAULT_GUIDANCE = 3.5  # ComfyUI's value for a guidance-distilled Flux when no FluxGuidance is set


def rope_axes(head_dim: int) -> tuple[int, int, int]:
    """The rotary split of a head over (index, row, col): Flux's (16, 56, 56) for 128-wide heads,
    the same proportions (even widths) for other widths (test models)."""
    if head_dim == 128:
        return (16, 56, 56)
    first = max(2, head_dim // 8 // 2 * 2)
    second = (head_dim - first) // 2 // 2 * 2
    return (first, second, head_dim - first - second)


@dataclass(frozen=True)
class FluxTransformer:
    """The Flux.1 transformer kind (see the module docstring). ``approximator``: Chroma's variant
    (diffusers' ``ChromaTransformer2DModel``): the same blocks without per-block modulation
    layers, whose modulation comes from one ``distilled_guidance_layer``; no pooled vector, no
    guidance input. ``latent_format``: the family's, for reference latents (``process_in``)."""

    approximator: bool = False
    latent_format: LatentFormat | None = None

    @property
    def id(self) -> str:
        return "chroma_transformer" if self.approximator else "flux_transformer"

    @property
    def model_class(self) -> Any:
        import diffusers  # lazy: diffusers is heavy to import

        return diffusers.ChromaTransformer2DModel if self.approximator else diffusers.FluxTransformer2DModel

    # --- reading and building -----------------------------------------------------------------
    def config_from_tensors(self, index: TensorIndex, prefix: str) -> dict[str, Any]:
        """The ``FluxTransformer2DModel`` config from the shapes under ``prefix``."""
        inner, in_channels = index.shape(f"{prefix}img_in.weight")
        head_dim = index.shape(f"{prefix}double_blocks.0.img_attn.norm.query_norm.scale")[0]
        mlp = index.shape(f"{prefix}double_blocks.0.img_mlp.0.weight")[0]
        if mlp != 4 * inner or inner % head_dim:
            raise ModelLoadError(
                f"{index.path}: a Flux transformer with width {inner}, MLP width {mlp} and "
                f"{head_dim}-wide heads is not a variant Loom can build (it needs MLP = 4 × width)"
            )
        config = {
            "patch_size": 1,
            "in_channels": in_channels,
            "out_channels": index.shape(f"{prefix}final_layer.linear.weight")[0],
            "num_layers": index.count(f"{prefix}double_blocks."),
            "num_single_layers": index.count(f"{prefix}single_blocks."),
            "attention_head_dim": head_dim,
            "num_attention_heads": inner // head_dim,
            "joint_attention_dim": index.shape(f"{prefix}txt_in.weight")[1],
            "axes_dims_rope": list(rope_axes(head_dim)),
        }
        if self.approximator:
            hidden, channels = index.shape(f"{prefix}distilled_guidance_layer.in_proj.weight")
            return config | {
                "approximator_num_channels": channels,
                "approximator_hidden_dim": hidden,
                "approximator_layers": index.count(f"{prefix}distilled_guidance_layer.layers."),
            }
        return config | {
            "pooled_projection_dim": index.shape(f"{prefix}vector_in.in_layer.weight")[1],
            "guidance_embeds": index.has(f"{prefix}guidance_in.in_layer.weight"),
        }

    def to_diffusers(self, sd: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
        return flux_keys.to_diffusers(sd, config)

    def to_original(self, sd: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
        return flux_keys.to_original(sd, config)

    def module_keys(self, sd: dict[str, Any]) -> dict[str, Any]:
        return sd

    def empty(self, config: Mapping[str, Any]) -> Any:
        return self.model_class.from_config(dict(config))

    def from_pretrained(self, path: Path, safetensors: bool) -> Any:
        return self.model_class.from_pretrained(path, local_files_only=True, use_safetensors=safetensors)

    # --- sampling -----------------------------------------------------------------------------
    def conditioning(
        self, entries: Sequence[CondEntry], batch: int, size: tuple[int, int], *, like: Tensor | None = None
    ) -> dict[str, Any]:
        """Text tokens, pooled CLIP-L vector, text ids, the guidance value per row and the
        reference latents (Flux Kontext)."""

        def to(t: Tensor) -> Tensor:
            return t if like is None else t.to(like)

        embeds = lcm_repeat([e.embeds for e in entries])  # ComfyUI's rule for mixed lengths, as for UNets
        length = embeds[0].shape[1]
        hidden = torch.cat([e.expand(batch, -1, -1) for e in embeds])
        kwargs: dict[str, Any] = {"encoder_hidden_states": to(hidden), "txt_ids": to(torch.zeros(length, 3))}
        if any(e.extras.get("attention_mask") is not None for e in entries):
            grid = (math.ceil(size[0] / 16), math.ceil(size[1] / 16))  # 8 px per latent cell, 2x2 patches
            mask = torch.cat([attention_mask(e, batch, length, grid) for e in entries]).unsqueeze(1)
            kwargs["joint_attention_kwargs"] = {"attention_mask": to(mask)}
        if self.approximator:
            return kwargs
        pooled = torch.cat([_pooled(e).expand(batch, -1) for e in entries])
        values = [e.extras.get("guidance", DEFAULT_GUIDANCE) for e in entries for _ in range(batch)]
        out = {
            **kwargs,
            "pooled_projections": to(pooled),
            "guidance": to(torch.tensor([0.0 if v is None else float(v) for v in values])),
        }
        if any(v is None for v in values):
            out["guidance_off"] = torch.tensor([v is None for v in values])
        if any(e.extras.get("control") is not None for e in entries):  # ControlNets (dit_control)
            out["control"] = bind_controls(entries, batch)
        return out | self._references(entries, batch, to)

    def _references(self, entries: Sequence[CondEntry], batch: int, to: Any) -> dict[str, Any]:
        """``ref_latents`` (each reference for every row, through ``process_in``) and the method."""

        lists = [list(e.extras.get("reference_latents") or ()) for e in entries]
        if not any(lists):
            return {}
        if any(len(r) != len(lists[0]) for r in lists):
            raise ConditioningError(
                "conditioning entries with different numbers of reference latents were batched "
                "together; give every entry the same ReferenceLatent chain"
            )
        fmt = self.latent_format
        refs = []
        for i in range(len(lists[0])):
            rows = [_repeat_rows(r[i], batch) for r in lists]
            ref = torch.cat(rows)
            refs.append(to(fmt.process_in(ref) if fmt is not None else ref))
        method = entries[0].extras.get("reference_latents_method") or "offset"
        return {"ref_latents": refs, "ref_latents_method": str(method)}

    def activation_bytes(self, module: Any, run: Any, element: int) -> int:
        """Activation memory of ``run`` (``engine.memory.device_budget.RunShape``) in bytes: the widest moment of
        a single-stream block over the 2×2-packed image tokens and the text tokens. Per token, in
        widths: the residual and its norm (2), the fused q/k/v and MLP projection (3 + 4), the
        activated MLP (4), the attention output (1) and their concatenation (5): 19."""

        return transformer_bytes(run, width=heads_width(module.config), patch=2, live=19, element=element)

    def forward(self, module: Any, x_in: Tensor, timestep: Tensor, cond_kwargs: dict[str, Any]) -> Tensor:
        """Pack ``x_in`` (B, 16, H, W) into 2×2 patches (then the reference latents' tokens, if
        any), call the transformer at ``timestep`` (= sigma), unpack the image tokens of the output
        to the latent's shape."""

        kwargs = dict(cond_kwargs)
        options = kwargs.pop("transformer_options", None)
        if options and options.get("patches"):
            raise ConditioningError(
                f"the Flux transformer cannot run block patches {sorted(options['patches'])}; "
                "remove the patch node from the workflow"
            )
        refs, method = kwargs.pop("ref_latents", None), kwargs.pop("ref_latents_method", "offset")
        guidance_off = kwargs.pop("guidance_off", None)
        control = kwargs.pop("control", None)
        if control is not None:
            blocks = (int(module.config.num_layers), int(module.config.num_single_layers))
            kwargs |= control_kwargs(control.residuals(x_in, timestep, kwargs, blocks))
        if not getattr(module.config, "guidance_embeds", False):
            kwargs.pop("guidance", None)
            guidance_off = None
        height, width = x_in.shape[-2:]
        x = pad_to_even(x_in)
        tokens, img_ids = pack(x)
        image_tokens = tokens.shape[1]
        if refs and not self.approximator:
            ref_tokens, ref_ids = reference_tokens(
                [r.to(x) for r in refs], method, x.shape[-2] // 2, x.shape[-1] // 2
            )
            tokens, img_ids = torch.cat([tokens, ref_tokens], dim=1), torch.cat([img_ids, ref_ids])
        t = timestep.to(x.dtype).reshape(-1).expand(x.shape[0])
        if tokens.shape[1] > image_tokens:  # reference tokens get no control (ComfyUI adds to the first ones)
            for name in ("controlnet_block_samples", "controlnet_single_block_samples"):
                if name in kwargs:
                    kwargs[name] = [F.pad(r, (0, 0, 0, tokens.shape[1] - r.shape[1])) for r in kwargs[name]]
        hook = None
        if guidance_off is not None:  # ComfyUI adds no guidance embedding for these rows
            keep = (~guidance_off.to(x.device)).to(x.dtype)[:, None]
            hook = module.time_text_embed.guidance_embedder.register_forward_hook(lambda m, i, o: o * keep)
        try:
            out = module(
                hidden_states=tokens, timestep=t, img_ids=img_ids.to(x), return_dict=False, **kwargs
            )[0]
        finally:
            if hook is not None:
                hook.remove()
        return unpack(out[:, :image_tokens], x.shape[-2], x.shape[-1])[..., :height, :width]

    @property
    def skip_lists(self) -> Mapping[SkipListName, BlockList]:
        """The double and single blocks, for skip-layer guidance (ComfyUI's Flux and Chroma models
        read both ``dit`` replace lists)."""
        return flux_skip_lists(joined_single=self.approximator)

    def block_stack(self, module: Any) -> BlockStack:
        """The double then single blocks, for block-level step caches."""

        return flux_block_stack(module, joined_single=self.approximator)

    def original_names(self, names: Sequence[str], config: Any = None) -> dict[str, str]:
        """Module key -> the Black Forest Labs key it comes from (the fused tensor's name for
        split q/k/v and MLP parts), for block-wise merges (ModelMergeFlux1)."""
        return flux_keys.original_names(names)

    def check_conditioning(self, module: Any, entries: Sequence[CondEntry], name: str) -> None:
        if not entries:
            raise ConditioningError(f"{name} conditioning is empty; connect a CLIPTextEncode output")
        width = module.config.joint_attention_dim
        for e in entries:
            if e.embeds.shape[-1] != width:
                raise ConditioningError(
                    f"{name} conditioning has {e.embeds.shape[-1]}-wide embeddings but this Flux model expects "
                    f"{width} (T5-XXL); load the text encoders with DualCLIPLoader (type flux)"
                )
            if self.approximator:
                continue
            if e.pooled is None or e.pooled.shape[-1] != module.config.pooled_projection_dim:
                raise ConditioningError(
                    f"{name} conditioning has no {module.config.pooled_projection_dim}-wide pooled CLIP-L "
                    "vector, which Flux needs; encode with the CLIP of DualCLIPLoader (clip_l + t5xxl, type flux)"
                )


def control_kwargs(residuals: Any) -> dict[str, Any]:
    """``FluxTransformer2DModel``'s inputs for ControlNet residuals given per block (one each, so
    block ``i`` gets entry ``i``)."""
    out: dict[str, Any] = {}
    if residuals.blocks is not None:
        out["controlnet_block_samples"] = residuals.blocks
    if residuals.single is not None:
        out["controlnet_single_block_samples"] = residuals.single
    return out


def attention_mask(entry: CondEntry, batch: int, length: int, grid: tuple[int, int]) -> Tensor:
    """An entry's additive attention mask over [text, image] tokens for an image of ``grid`` patches:
    its ``attention_mask`` (made for ``attention_mask_img_shape``) resized as ComfyUI's
    ``upscale_dit_mask`` does, or zeros; ``batch`` rows."""

    mask = entry.extras.get("attention_mask")
    if mask is None:
        side = length + grid[0] * grid[1]
        return torch.zeros(batch, side, side)
    ref = tuple(entry.extras.get("attention_mask_img_shape", (1, 1)))
    mask = mask.float().reshape(-1, *mask.shape[-2:])
    if mask.shape[-1] - ref[0] * ref[1] != length:
        raise ConditioningError(
            f"a conditioning's attention mask covers {mask.shape[-1] - ref[0] * ref[1]} text tokens "
            f"but it has {length} (prompts of different lengths combined with a masked one); "
            "give the prompts equal lengths or apply the style model to each"
        )
    mask = upscale_dit_mask(mask, ref, grid)
    return mask.expand(batch, -1, -1) if mask.shape[0] == 1 else mask


def upscale_dit_mask(mask: Tensor, size_in: tuple[int, ...], size_out: tuple[int, int]) -> Tensor:
    """ComfyUI's ``upscale_dit_mask``: a (B, T + hi·wi, same) mask → (B, T + ho·wo, same), each
    quadrant touching image tokens resized bilinearly over the image grid (both sides for image-image)."""

    (hi, wi), (ho, wo) = (int(size_in[0]), int(size_in[1])), size_out
    if (hi, wi) == (ho, wo):
        return mask
    b, t = mask.shape[0], mask.shape[1] - hi * wi

    def grid(x: Tensor) -> Tensor:  # (b, n, hi*wi) -> (b, n, ho*wo)
        n = x.shape[1]
        return F.interpolate(x.reshape(b, n, hi, wi), size=(ho, wo), mode="bilinear").reshape(b, n, ho * wo)

    txt_txt, txt_img = mask[:, :t, :t], grid(mask[:, :t, t:])
    img_txt = grid(mask[:, t:, :t].transpose(1, 2)).transpose(1, 2)
    img_img = grid(mask[:, t:, t:])  # keys resized; then queries
    img_img = grid(img_img.transpose(1, 2)).transpose(1, 2)

    return torch.cat([torch.cat([txt_txt, txt_img], 2), torch.cat([img_txt, img_img], 2)], 1)


def _repeat_rows(t: Tensor, batch: int) -> Tensor:
    """ComfyUI's ``repeat_to_batch_size``: ``t`` cut or tiled to ``batch`` rows."""
    if t.shape[0] >= batch:
        return t[:batch]
    return t.repeat(-(-batch // t.shape[0]), *([1] * (t.ndim - 1)))[:batch]


def _pooled(entry: CondEntry) -> Tensor:
    if entry.pooled is None:
        raise ConditioningError(
            "a Flux conditioning entry has no pooled CLIP-L vector; encode the prompt "
            "with the CLIP of DualCLIPLoader (type flux)"
        )
    return entry.pooled
