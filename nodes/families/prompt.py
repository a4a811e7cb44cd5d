"""Prompt recipes: how a family turns prompt text into the conditioning its denoiser takes.

A recipe gets the family's ready text encoders (:class:`ReadyEncoder`: the kind, the module, its
tokenizer, the hidden-state index to use and the spec's flags) and returns ``(embeds, pooled)``:
embeds (1, T, D) and the pooled output (1, P) or None.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from torch import Tensor

    from nodes.core.embeddings import EmbeddingLookup
    from nodes.families.base import TextEncoderSpec


@dataclass(frozen=True)
class TokenizerOptions:
    """ComfyUI's tokenizer options for one encoder (T5TokenizerOptions' ``<encoder>_min_length``
    and ``<encoder>_min_padding``); None keeps the family's own value. Padding order as ComfyUI:
    after the end token, ``min_padding`` pad tokens, then pads up to ``min_length`` tokens."""

    min_length: int | None = None
    min_padding: int | None = None

    @staticmethod
    def from_flat(name: str, flat: Mapping[str, int]) -> TokenizerOptions:
        """The options of encoder ``name`` from ComfyUI's flat ``{"t5xxl_min_length": n, ...}``."""
        return TokenizerOptions(flat.get(f"{name}_min_length"), flat.get(f"{name}_min_padding"))


@dataclass(frozen=True)
class ReadyEncoder:
    """A text encoder resident for encoding: its spec, kind, tokenizer, module, the index into
    ``hidden_states`` to use (the family default, or CLIPSetLastLayer's choice) and its tokenizer
    options (T5TokenizerOptions)."""

    spec: TextEncoderSpec
    kind: Any  # a ClipText (nodes.families.components.clip_text)
    tokenizer: Any
    module: Any
    layer: int
    options: TokenizerOptions = TokenizerOptions()
    embeddings: EmbeddingLookup | None = None  # the user's embeddings folder (``embedding:name`` words)


@dataclass(frozen=True)
class ConcatPrompt:
    """SD1.x, SD2.x, SDXL (ComfyUI's ``CLIPTextEncode``): every encoder encodes the prompt; their
    outputs are concatenated along the feature axis; the pooled output comes from the encoder
    whose spec says ``pooled`` (SDXL's clip_g), computed on the first chunk."""

    def encode(self, text: str, encoders: Sequence[ReadyEncoder]) -> tuple[Tensor, Tensor | None]:
        parts, pooled = [], None
        for enc in encoders:
            z, p = enc.kind.encode(
                enc.module,
                enc.tokenizer,
                text,
                enc.layer,
                final_norm=enc.spec.final_norm,
                pooled=enc.spec.pooled,
                embeddings=enc.embeddings,
                encoder=enc.spec.name,
            )
            parts.append(z)
            pooled = p if p is not None else pooled
        return torch.cat(parts, dim=-1), pooled
