"""ControlNets for the transformer (DiT) families: SD3 / SD3.5 and Flux.1, held in diffusers'
``SD3ControlNetModel`` and ``FluxControlNetModel`` and run with ComfyUI's semantics.

The layouts ``ControlNetLoader`` finds (:func:`dit_layout`, from the tensor names, as ComfyUI tells
them apart):

- ``sd3``: diffusers' SD3 ControlNets (InstantX's SD3 canny/pose/tile): ``pos_embed_input.proj``,
  ``transformer_blocks.N``, ``controlnet_blocks.N``. The control image is VAE-encoded and brought
  into model space with the SD3 scale and *no* shift (as ComfyUI and diffusers' pipeline do for
  these files); the ControlNet's pooled input is zeros. Its ``k`` block outputs go to the model's
  joint blocks ``depth // k`` blocks each, the last output one block fewer (ComfyUI's rule), so the
  model's last block gets none.
- ``flux_instantx``: diffusers' Flux ControlNets (InstantX canny/union, Shakker-Labs Union /
  Union Pro): ``controlnet_x_embedder``, optional ``controlnet_mode_embedder`` (union: the control
  type becomes one extra text token, none for "auto"). VAE-encoded hint (Flux latent format),
  packed 2×2 like the latent. Block outputs are stretched over the model's double (and single)
  blocks: model block ``i`` gets output ``i // ceil(depth / k)``.
- ``flux_xlabs``: XLabs' Flux ControlNets (Black Forest Labs' names: ``double_blocks.N``,
  ``pos_embed_input``, ``input_hint_block``, ``controlnet_blocks.N``): pixel hint (scaled to -1..1,
  through the hint encoder, 8× down), block outputs cycled over the double blocks (``i % k``).
- ``flux_mistoline``: TheMistoAI's MistoLine Flux ControlNet, XLabs' way with its own hint encoder
  and SiLU output heads (:mod:`nodes.families.components.flux_mistoline`).

The residuals are scaled by the strength and expanded to one tensor per block of the model the
sampler runs (:class:`nodes.core.control_base.ControlResiduals` ``blocks`` / ``single``); the family's
denoiser adds them after its blocks (``sd3_dit`` / ``flux_dit``). Refused with a message saying
so: SD3.5 ControlNets whose pooled embedder is square (a layout no published file
uses).

AliMama's inpainting ControlNets (Flux ``flux_instantx``, SD3 ``sd3``) take 17 hint channels, ComfyUI's
``concat_mask``: the encoded image, then the mask of what to keep (``nodes.control.controlnet.encode_hint``).
Diffusers' Flux ControlNet has no such input: its ``controlnet_x_embedder`` is widened by the
config's ``extra_condition_channels`` (AliMama's name: 4 packed features).

- ``sd35``: Stability AI's SD3.5 Large ControlNets (``sd3.5_large_controlnet_{blur,canny,depth}``):
  ``pos_embed_input.proj``, ``time_text_embed.*``, ``transformer_blocks.N`` in Stability's names
  (``adaLN_modulation.1``, ``attn.qkv``, ``attn.proj``, ``mlp.fc1/2``), ``controlnet_blocks.N`` and a
  scalar ``control_type`` (0 blur, 1 canny, 2 depth). Held in diffusers' ``SD3ControlNetModel``
  with ``use_pos_embed=False`` (single-stream blocks, no text input). As ComfyUI runs them: the
  latent is patch-embedded by the *model's* ``pos_embed.proj`` plus a fresh sin-cos table over the
  patch grid (positions spread evenly over 0..15), the pooled text goes in unchanged, and the hint is
  the VAE-encoded control image in the SD3 latent space *with* its shift, after a per-type pixel
  transform (canny: ``x * 127.5 + 0.5``; depth: ``1 - x``; blur: none). Block outputs are stretched
  over the joint blocks (``i // ceil(depth / k)``); diffusers' SD3 transformer adds nothing after its
  last block, where ComfyUI adds that block's share too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from nodes.core.control_base import ControlResiduals, file_label, fit_hint
from nodes.core.handles import WeightsHandle
from nodes.core.sampling_hooks import ConditioningError
from nodes.core.tensors import ModelLoadError
from nodes.core.weights import load_tensors, read_index
from nodes.families.components.flux_dit import rope_axes
from nodes.families.components.flux_mistoline import FLUX_MISTOLINE, mistoline_module, mistoline_to_diffusers
from nodes.families.components.flux_xlabs_keys import xlabs_to_diffusers
from nodes.families.components.latent_patches import pack, pad_to_even
from nodes.families.components.sd35_control import SD35_TYPES, sd35_to_diffusers, sincos_grid
from nodes.families.latent_format import FLUX_LATENT, SD3_LATENT, LatentFormat

SD3, SD35, FLUX_INSTANTX, FLUX_XLABS = "sd3", "sd35", "flux_instantx", "flux_xlabs"
FAMILY = {SD3: "sd3", SD35: "sd3", FLUX_INSTANTX: "flux", FLUX_XLABS: "flux", FLUX_MISTOLINE: "flux"}
PIXEL_HINT = (FLUX_XLABS, FLUX_MISTOLINE)  # pixel hints through the ControlNet's encoder, outputs cycled


def dit_layout(shapes: Mapping[str, Sequence[int]], name: str) -> str | None:
    """The DiT ControlNet layout of a file's tensors (None: not a DiT ControlNet); a known layout
    Loom cannot run raises a ModelLoadError saying what it is."""
    if "controlnet_blocks.0.linear.weight" in shapes:
        return FLUX_MISTOLINE
    layout = None
    if "controlnet_blocks.0.weight" in shapes and "double_blocks.0.img_attn.norm.key_norm.scale" in shapes:
        layout = FLUX_XLABS
    elif "pos_embed_input.proj.weight" in shapes and "controlnet_blocks.0.weight" in shapes:
        layout = SD35 if "transformer_blocks.0.adaLN_modulation.1.bias" in shapes else SD3
        embedder = shapes.get("time_text_embed.text_embedder.linear_1.weight", (0, 0))
        if layout == SD35 and embedder[0] == embedder[1]:
            raise ModelLoadError(
                f"{name} is an SD3.5 ControlNet with a square pooled-text embedder (a variant that feeds "
                "every block the same input), which Loom cannot run; use one of Stability AI's SD3.5 "
                "Large ControlNets (blur/canny/depth) or a diffusers-format SD3 ControlNet"
            )
    elif "controlnet_x_embedder.weight" in shapes:
        layout = FLUX_INSTANTX
    if layout is not None and _hint_channels(shapes, layout) not in (16, 17):
        raise ModelLoadError(
            f"{name} takes {_hint_channels(shapes, layout)}-channel control hints; Loom runs DiT ControlNets "
            "taking 16 (the encoded image) or 17 (inpainting ControlNets such as AliMama's: the image and the mask)"
        )
    return layout


def _hint_channels(shapes: Mapping[str, Sequence[int]], layout: str) -> int:
    if layout in (SD3, SD35):
        return int(shapes["pos_embed_input.proj.weight"][1])
    if layout == FLUX_INSTANTX:
        return int(shapes["controlnet_x_embedder.weight"][1]) // 4
    return 16


def _count(shapes: Mapping[str, Any], prefix: str) -> int:
    return len({k[len(prefix) :].split(".")[0] for k in shapes if k.startswith(prefix)})


def dit_config(
    shapes: Mapping[str, Sequence[int]], layout: str, control_type: float | None = None
) -> dict[str, Any]:
    """The diffusers config of a DiT ControlNet from the shapes of its tensors (as in the file);
    ``control_type``: an SD3.5 file's ``control_type`` value (kept in the config as ``sd35_type``)."""

    if layout == SD35:
        inner, channels, patch, _ = (int(s) for s in shapes["pos_embed_input.proj.weight"])
        head = 64 if inner % 64 == 0 else inner
        kind = round(control_type) if control_type is not None else -1
        return {
            "patch_size": patch,
            "in_channels": channels,
            "out_channels": channels,
            "num_layers": _count(shapes, "transformer_blocks."),
            "attention_head_dim": head,
            "num_attention_heads": inner // head,
            "joint_attention_dim": None,
            "caption_projection_dim": inner,
            "pooled_projection_dim": int(shapes["time_text_embed.text_embedder.linear_1.weight"][1]),
            "pos_embed_max_size": None,
            "pos_embed_type": None,
            "use_pos_embed": False,
            "force_zeros_for_pooled_projection": False,
            "sd35_type": SD35_TYPES.get(kind, "blur"),
        }

    if layout == SD3:
        inner, channels, patch, _ = (int(s) for s in shapes["pos_embed.proj.weight"])
        norm = "transformer_blocks.0.attn.norm_q.weight"
        head = int(shapes[norm][0]) if norm in shapes else 64 if inner % 64 == 0 else inner
        positions = shapes.get("pos_embed.pos_embed")
        layers = _count(shapes, "transformer_blocks.")
        return {
            "sample_size": 128,
            "patch_size": patch,
            "in_channels": channels,
            "out_channels": channels,
            "num_layers": layers,
            "attention_head_dim": head,
            "num_attention_heads": inner // head,
            "joint_attention_dim": int(shapes["context_embedder.weight"][1]),
            "caption_projection_dim": int(shapes["context_embedder.weight"][0]),
            "pooled_projection_dim": int(shapes["time_text_embed.text_embedder.linear_1.weight"][1]),
            "pos_embed_max_size": math.isqrt(int(positions[1])) if positions else 96,
            "extra_conditioning_channels": _hint_channels(shapes, SD3) - channels,
            "qk_norm": "rms_norm" if norm in shapes else None,
            "dual_attention_layers": [
                i for i in range(layers) if f"transformer_blocks.{i}.attn2.to_q.weight" in shapes
            ],
        }
    if layout == FLUX_INSTANTX:
        inner, channels = (int(s) for s in shapes["x_embedder.weight"])
        head = int(shapes["transformer_blocks.0.attn.norm_q.weight"][0])
        mode = shapes.get("controlnet_mode_embedder.weight")
        extra = 4 * _hint_channels(shapes, FLUX_INSTANTX) - channels  # AliMama inpainting: the packed mask
        return {
            **({"extra_condition_channels": extra} if extra else {}),
            "in_channels": channels,
            "num_layers": _count(shapes, "transformer_blocks."),
            "num_single_layers": _count(shapes, "single_transformer_blocks."),
            "attention_head_dim": head,
            "num_attention_heads": inner // head,
            "joint_attention_dim": int(shapes["context_embedder.weight"][1]),
            "pooled_projection_dim": int(shapes["time_text_embed.text_embedder.linear_1.weight"][1]),
            "guidance_embeds": "time_text_embed.guidance_embedder.linear_1.weight" in shapes,
            "axes_dims_rope": list(rope_axes(head)),
            "num_mode": int(mode[0]) if mode else None,
        }
    inner, channels = (int(s) for s in shapes["img_in.weight"])
    head = int(shapes["double_blocks.0.img_attn.norm.query_norm.scale"][0])
    return {
        "patch_size": 2,
        "in_channels": channels,
        "num_layers": _count(shapes, "double_blocks."),
        "num_single_layers": _count(shapes, "single_blocks."),
        "attention_head_dim": head,
        "num_attention_heads": inner // head,
        "joint_attention_dim": int(shapes["txt_in.weight"][1]),
        "pooled_projection_dim": int(shapes["vector_in.in_layer.weight"][1]),
        "guidance_embeds": "guidance_in.in_layer.weight" in shapes,
        "axes_dims_rope": list(rope_axes(head)),
        "conditioning_embedding_channels": 16,
    }  # patch_size: how diffusers packs the encoded hint (2×2)


def stretch(outputs: Sequence[torch.Tensor], depth: int, cycle: bool = False) -> list[torch.Tensor] | None:
    """Flux: ``outputs`` over ``depth`` model blocks, block ``i`` getting ``i // ceil(depth / k)``
    (``cycle``: ``i % k``, XLabs)."""
    if not outputs or depth == 0:
        return None
    if cycle:
        return [outputs[i % len(outputs)] for i in range(depth)]
    repeat = math.ceil(depth / len(outputs))
    return [outputs[i // repeat] for i in range(depth)]


def sd3_spread(outputs: Sequence[torch.Tensor], depth: int) -> list[torch.Tensor]:
    """SD3 (ComfyUI's rule): each output for ``depth // k`` model blocks, the last for one fewer;
    blocks left over get zeros."""
    count = depth // len(outputs)
    seq: list[torch.Tensor] = []
    for i, out in enumerate(outputs):
        seq += [out] * (count - (1 if i == len(outputs) - 1 else 0))
    zero = torch.zeros_like(outputs[0])
    return (seq + [zero] * depth)[:depth]


@dataclass(frozen=True, kw_only=True)
class DiTControlNetHandle(WeightsHandle):
    """A DiT ControlNet file; ``layout``: :data:`SD3`, :data:`FLUX_INSTANTX` or :data:`FLUX_XLABS`;
    ``control_type``: a union ControlNet's mode (SetUnionControlNetType; empty: "auto")."""

    kind: ClassVar[str] = "controlnet"
    config: Mapping[str, Any]
    layout: str
    control_type: tuple[int, ...] = ()

    def recipe(self) -> Any:
        return {**self.config, "layout": self.layout}

    @property
    def family(self) -> str:
        return FAMILY[self.layout]

    def fits(self, family: str) -> bool:
        return family == self.family

    @property
    def union_types(self) -> int | None:
        mode = self.config.get("num_mode")
        return int(mode) if mode else None

    @property
    def concat_mask(self) -> bool:
        """An inpainting ControlNet (AliMama's Flux and SD3 ones): its hint is the VAE-encoded image
        with one more channel, the mask of what to keep (ComfyUI's ``concat_mask``: 17 hint channels)."""
        if self.layout == SD3:
            return int(self.config.get("extra_conditioning_channels", 0)) == 1
        return int(self.config.get("extra_condition_channels", 0)) == 4

    @property
    def latent_format(self) -> LatentFormat | None:
        """The model space of a VAE-encoded hint (None: the ControlNet takes pixels)."""
        if self.layout == SD35:
            return SD3_LATENT
        if self.layout == SD3:
            return replace(SD3_LATENT, shift=0.0)  # these ControlNets were trained without the shift
        if self.layout == FLUX_INSTANTX:
            return FLUX_LATENT
        return None

    def hint_pixels(self, pixels: torch.Tensor) -> torch.Tensor:
        """The control image (B, C, H, W in 0..1) as this ControlNet's VAE takes it (SD3.5's canny and
        depth ControlNets: ComfyUI's per-type transform)."""
        kind = self.config.get("sd35_type") if self.layout == SD35 else None
        if kind == "canny":
            return pixels * 127.5 + 0.5
        if kind == "depth":
            return 1.0 - pixels
        return pixels

    def build(self) -> Any:
        from diffusers import FluxControlNetModel, SD3ControlNetModel  # lazy: diffusers is heavy to import

        cfg = {k: v for k, v in self.config.items() if k not in ("sd35_type", "extra_condition_channels")}
        if self.layout in (SD3, SD35):
            cfg["dual_attention_layers"] = tuple(cfg.get("dual_attention_layers", ()))
            module = SD3ControlNetModel.from_config(cfg)
        elif self.layout == FLUX_MISTOLINE:
            module = mistoline_module(cfg)
        else:
            module = FluxControlNetModel.from_config(cfg)
            extra = int(self.config.get("extra_condition_channels", 0))
            if extra:  # AliMama's inpainting ControlNet: the hint input takes the packed mask too
                embedder = module.controlnet_x_embedder
                module.controlnet_x_embedder = torch.nn.Linear(
                    embedder.in_features + extra, embedder.out_features
                )
        sd = load_tensors(read_index(self.path, allow_pickle=self.source.allow_pickle))
        if self.layout == FLUX_XLABS:
            sd = xlabs_to_diffusers(sd, self.config)
        elif self.layout == FLUX_MISTOLINE:
            sd = mistoline_to_diffusers(sd, self.config)
        elif self.layout == SD35:
            sd = sd35_to_diffusers(sd)
        missing, unexpected = module.load_state_dict(sd, strict=False)
        missing = [
            k for k in missing if k != "pos_embed.pos_embed"
        ]  # SD3: a file may leave out the sin-cos table
        if missing or unexpected:
            raise ModelLoadError(
                f"{file_label(self.path)}: ControlNet tensors do not match its config "
                f"(missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]})"
            )
        return module.eval()

    def residuals(
        self,
        module: Any,
        x_in: torch.Tensor,
        timestep: torch.Tensor,
        hint: torch.Tensor,
        rows: int,
        strength: float,
        extra: Mapping[str, Any],
    ) -> ControlResiduals:
        """This ControlNet's residuals for one model call, one per model block (module docstring).
        ``hint``: the model-space latent hint (VAE ControlNets) or the IMAGE (XLabs); ``extra``: the
        denoiser's keyword inputs and ``main_blocks`` (the model's double and single block counts)."""
        double, single = extra["main_blocks"]
        groups = x_in.shape[0] // rows
        if self.latent_format is not None and tuple(hint.shape[-2:]) != tuple(x_in.shape[-2:]):
            raise ConditioningError(
                f"ControlNet {file_label(self.path)!r} got a {x_in.shape[-1]}x{x_in.shape[-2]} latent call but its control "
                f"image was encoded for {hint.shape[-1]}x{hint.shape[-2]}: area-limited conditioning (ConditioningSetArea, "
                "mask bounds) cannot carry a VAE-encoded ControlNet; remove the area node or apply the ControlNet to "
                "full-image conditioning"
            )
        if self.layout in (SD3, SD35):
            return self._sd3(
                module, x_in, timestep, _rows(hint, rows).repeat(groups, 1, 1, 1), strength, extra, double
            )
        return self._flux(module, x_in, timestep, hint, rows, groups, strength, extra, double, single)

    def _sd3(
        self,
        module: Any,
        x_in: torch.Tensor,
        timestep: torch.Tensor,
        hint: torch.Tensor,
        strength: float,
        extra: Mapping[str, Any],
        depth: int,
    ) -> ControlResiduals:
        patch = module.config.patch_size
        pad = (0, (-x_in.shape[-1]) % patch, 0, (-x_in.shape[-2]) % patch)
        x, h = (
            (F.pad(x_in, pad, mode="circular"), F.pad(hint.to(x_in), pad, mode="circular"))
            if any(pad)
            else (x_in, hint.to(x_in))
        )
        t = timestep.to(x.dtype).reshape(-1).expand(x.shape[0])
        if self.layout == SD35:  # the model's patch embedding and a fresh sin-cos grid, the real pooled text
            tokens = extra["patch_embed"](x).flatten(2).transpose(1, 2)
            grid = sincos_grid(tokens.shape[-1], x.shape[-2] // patch, x.shape[-1] // patch)
            (outs,) = module(
                hidden_states=tokens + grid.to(tokens),
                controlnet_cond=h,
                conditioning_scale=float(strength),
                timestep=t,
                pooled_projections=extra["pooled_projections"],
                return_dict=False,
            )
            return ControlResiduals(blocks=stretch(list(outs), depth))
        pooled = torch.zeros_like(extra["pooled_projections"])  # ComfyUI and InstantX: no pooled input
        (outs,) = module(
            hidden_states=x,
            controlnet_cond=h,
            conditioning_scale=float(strength),
            timestep=t,
            encoder_hidden_states=extra["encoder_hidden_states"],
            pooled_projections=pooled,
            return_dict=False,
        )
        return ControlResiduals(blocks=sd3_spread(list(outs), depth))

    def _flux(
        self,
        module: Any,
        x_in: torch.Tensor,
        timestep: torch.Tensor,
        hint: torch.Tensor,
        rows: int,
        groups: int,
        strength: float,
        extra: Mapping[str, Any],
        double: int,
        single: int,
    ) -> ControlResiduals:
        tokens, img_ids = pack(pad_to_even(x_in))
        if self.layout in PIXEL_HINT:
            pixels = fit_hint(hint, rows, (x_in.shape[-2] * 8, x_in.shape[-1] * 8)).to(x_in) * 2 - 1
            cond, _ = pack(pad_to_even(module.input_hint_block(pixels.repeat(groups, 1, 1, 1))))
        else:
            cond, _ = pack(pad_to_even(_rows(hint, rows).to(x_in).repeat(groups, 1, 1, 1)))
        guidance = extra.get("guidance") if module.config.guidance_embeds else None
        blocks, singles = flux_forward(
            module,
            tokens,
            cond,
            timestep,
            extra["encoder_hidden_states"],
            extra["pooled_projections"],
            extra["txt_ids"],
            img_ids.to(x_in),
            guidance,
            self.control_type if self.union_types else (),
        )
        xlabs = self.layout in PIXEL_HINT
        return ControlResiduals(
            blocks=stretch([b * strength for b in blocks], double, cycle=xlabs),
            single=stretch([s * strength for s in singles], single, cycle=xlabs),
        )


def _rows(latent: torch.Tensor, rows: int) -> torch.Tensor:
    """ComfyUI's ``broadcast_image_to`` for one entry's ``rows``: one hint for all, else cut or tiled."""
    if latent.shape[0] == 1 or latent.shape[0] == rows:
        return latent.expand(rows, -1, -1, -1)
    latent = latent[:rows]
    return torch.cat([latent] * -(-rows // latent.shape[0]))[:rows]


def flux_forward(
    module: Any,
    tokens: torch.Tensor,
    cond: torch.Tensor,
    timestep: torch.Tensor,
    text: torch.Tensor,
    pooled: torch.Tensor,
    txt_ids: torch.Tensor,
    img_ids: torch.Tensor,
    guidance: torch.Tensor | None,
    control_type: Sequence[int],
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """A ``FluxControlNetModel``'s unscaled block outputs (double, single) for packed ``tokens`` and
    packed hint ``cond``, ComfyUI's way: a union ControlNet's mode token only when a type is set."""
    hidden = module.x_embedder(tokens) + module.controlnet_x_embedder(cond.to(tokens))
    t = timestep.to(tokens.dtype).reshape(-1).expand(tokens.shape[0]) * 1000
    if guidance is not None:
        temb = module.time_text_embed(t, guidance.to(tokens.dtype) * 1000, pooled)
    else:
        temb = module.time_text_embed(t, pooled)
    text = module.context_embedder(text)
    if control_type:
        modes = module.controlnet_mode_embedder(torch.tensor(list(control_type), device=tokens.device))
        text = torch.cat([modes.to(text).unsqueeze(0).expand(text.shape[0], -1, -1), text], dim=1)
        txt_ids = torch.cat([txt_ids[: len(control_type)], txt_ids])
    rope = module.pos_embed(torch.cat([txt_ids, img_ids]))
    blocks, singles = [], []
    for block, out in zip(module.transformer_blocks, module.controlnet_blocks, strict=True):
        text, hidden = block(
            hidden_states=hidden, encoder_hidden_states=text, temb=temb, image_rotary_emb=rope
        )
        blocks.append(out(hidden))
    for block, out in zip(module.single_transformer_blocks, module.controlnet_single_blocks, strict=True):
        text, hidden = block(
            hidden_states=hidden, encoder_hidden_states=text, temb=temb, image_rotary_emb=rope
        )
        singles.append(out(hidden))
    return blocks, singles
