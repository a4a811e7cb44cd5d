"""SD3's text encoders and prompt recipe, as ComfyUI's ``sd3_clip.py`` builds them: CLIP-L and CLIP-G
take their penultimate hidden states (no final norm), side by side (768 + 1280 = 2048 wide),
zero-padded to T5's width (4096), and T5-XXL's last hidden state (tokens padded to 77, not diffusers'
256) follows them along the token axis; the pooled vector is CLIP-L's pooled output (final-normed end
token, *not* projected — the SAI reference and ComfyUI both skip CLIP-L's projection) ‖ CLIP-G's
projected one. An encoder that is not loaded contributes zeros of its real width (T5 absent: the CLIP
tokens alone; everything absent: 77 zero tokens).

CLIP-G as SD3 files store it (:class:`NestedClipText`): transformers' ``CLIPTextModelWithProjection``
names (``text_model.*`` and ``text_projection.weight``) under one prefix.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from nodes.core.tensors import ModelLoadError, TensorIndex
from nodes.families import arch
from nodes.families.components.clip_text import ClipText

if TYPE_CHECKING:
    from torch import Tensor

    from nodes.families.prompt import ReadyEncoder

WIDTHS = {"clip_l": 768, "clip_g": 1280, "t5xxl": 4096}  # of the real encoders: the zeros of a missing one
CLIP_TOKENS = 77


@dataclass(frozen=True)
class NestedClipText(ClipText):
    """CLIP-G as SD3 files store it: transformers' ``CLIPTextModelWithProjection`` names
    (``text_model.*`` and ``text_projection.weight``) under one prefix."""

    layout: str = "hf_clip"
    projection: bool = True

    @property
    def id(self) -> str:
        return "clip_text/hf_clip+projection+nested"

    def kind_and_config(self, index: TensorIndex, prefix: str) -> tuple[NestedClipText, dict[str, Any]]:
        return self, clip_g_config(index, prefix)

    def to_diffusers(self, sd: Any, config: Any) -> dict[str, Any]:
        return {k.removeprefix("text_model."): v for k, v in sd.items() if not k.endswith("position_ids")}

    def to_original(self, sd: Any, config: Any) -> dict[str, Any]:
        return {
            k if k.startswith("text_projection.") else f"text_model.{k.removeprefix('text_model.')}": v
            for k, v in sd.items()
            if not k.endswith("position_ids")
        }


def clip_g_config(index: TensorIndex, prefix: str) -> dict[str, Any]:
    """CLIP-G's ``CLIPTextConfig`` kwargs from an SD3-layout file (OpenCLIP's GELU, the projection)."""
    if not index.has(f"{prefix}text_projection.weight"):
        raise ModelLoadError(
            f"{index.path}: the CLIP-G text encoder has no text_projection.weight, which SD3's "
            "pooled vector needs; use the clip_g.safetensors of the SD3/SD3.5 release"
        )
    cfg = arch.clip_config(index, f"{prefix}text_model.", "hf_clip")
    return cfg | {"hidden_act": "gelu", "projection_dim": index.shape(f"{prefix}text_projection.weight")[0]}


@dataclass(frozen=True)
class SD3Prompt:
    """ComfyUI's SD3 text encoding (see the module docstring). ``CLIPTextEncode`` sends the same text
    to the three encoders; ``CLIPTextEncodeSD3`` may send different ones and, with empty_padding
    "none", leaves an empty prompt out instead of encoding it."""

    def encode(self, text: str, encoders: Sequence[ReadyEncoder]) -> tuple[Tensor, Tensor | None]:
        return self.encode_triple(text, text, text, encoders, drop_empty=False)

    def encode_triple(
        self, clip_l: str, clip_g: str, t5xxl: str, encoders: Sequence[ReadyEncoder], *, drop_empty: bool
    ) -> tuple[Tensor, Tensor | None]:
        by_name = {enc.spec.name: enc for enc in encoders}
        if not by_name:
            raise ModelLoadError(
                "this CLIP holds no text encoder: the SD3 checkpoint it came from has none; load "
                "clip_l, clip_g and t5xxl with TripleCLIPLoader and encode with its CLIP"
            )
        t5 = by_name.get("t5xxl")
        width = int(t5.module.config.d_model) if t5 is not None else WIDTHS["t5xxl"]
        texts = {"clip_l": clip_l, "clip_g": clip_g}
        if drop_empty and not clip_l and not clip_g:  # both CLIP prompts left out: pooled zeros
            out = None
            pooled = torch.zeros(1, sum(_pooled_width(by_name.get(n), n) for n in texts))
        else:
            # one empty CLIP prompt is encoded as the empty prompt either way (ComfyUI pads its tokens so)
            out, pooled = _encode_clips(by_name, texts, width)
        if t5 is not None:
            kind = replace(t5.kind, min_length=1) if drop_empty and not t5xxl else t5.kind  # [</s>] alone
            t5_out = kind.encode(t5.module, t5.tokenizer, t5xxl)
            out = t5_out if out is None else torch.cat([out.to(t5_out), t5_out], dim=-2)
        if out is None:
            out = torch.zeros(1, CLIP_TOKENS, width)
        return out, pooled


def _encode_clips(
    by_name: dict[str, ReadyEncoder], texts: dict[str, str], width: int
) -> tuple[Tensor | None, Tensor]:
    """CLIP-L's and CLIP-G's tokens side by side (CLIP-L's columns zeros without it; no CLIP-G
    columns without it), zero-padded to ``width``; and their pooled vectors, concatenated (zeros of
    the real width for an encoder not loaded)."""

    hidden, pools = {}, {}
    for name, text in texts.items():
        enc = by_name.get(name)
        if enc is not None:
            hidden[name], pools[name] = _clip(enc, text)
    _pad_chunks(hidden, by_name)
    out = None
    if hidden:
        g = hidden.get("clip_g")
        lg = hidden.get("clip_l")
        if lg is None:
            assert g is not None
            lg = g.new_zeros(1, g.shape[1], WIDTHS["clip_l"])
        lg = lg if g is None else torch.cat([lg, g], dim=-1)
        out = F.pad(lg, (0, max(0, width - lg.shape[-1])))
    pooled = [
        pools[n].float().cpu() if n in pools else torch.zeros(1, WIDTHS[n]) for n in ("clip_l", "clip_g")
    ]
    return out, torch.cat(pooled, dim=-1)


def _clip(enc: ReadyEncoder, text: str) -> tuple[Tensor, Tensor]:
    z, pooled = enc.kind.encode(
        enc.module, enc.tokenizer, text, enc.layer, final_norm=enc.spec.final_norm, pooled=True
    )
    assert pooled is not None
    return z, pooled


def _pooled_width(enc: ReadyEncoder | None, name: str) -> int:
    """The width of an encoder's pooled output (CLIP-L: unprojected; CLIP-G: projected)."""
    if enc is None:
        return WIDTHS[name]
    config = enc.module.config
    return int(getattr(config, "projection_dim", 0) if name == "clip_g" else config.hidden_size)


def _pad_chunks(hidden: dict[str, Tensor], by_name: dict[str, ReadyEncoder]) -> None:
    """CLIP-L and CLIP-G as many 77-token chunks as each other: the shorter one gets the empty
    prompt's chunk repeated (ComfyUI's CLIPTextEncodeSD3 rule)."""
    if len(hidden) < 2:
        return
    chunks = {name: z.shape[1] // CLIP_TOKENS for name, z in hidden.items()}
    most = max(chunks.values())
    for name, n in chunks.items():
        if n < most:
            empty, _ = _clip(by_name[name], "")
            hidden[name] = torch.cat([hidden[name], *([empty] * (most - n))], dim=1)
