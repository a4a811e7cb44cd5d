"""Flux.1's prompt recipe (ComfyUI's Flux text encoding): T5-XXL's last hidden state is the
conditioning, CLIP-L's pooled output (first 77-token window) the pooled vector. ``CLIPTextEncodeFlux``
may send each encoder its own text; ``CLIPTextEncode`` sends both the same."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nodes.core.tensors import ModelLoadError
from nodes.families.components.t5_text import T5Text

if TYPE_CHECKING:
    from torch import Tensor

    from nodes.families.prompt import ReadyEncoder


@dataclass(frozen=True)
class FluxPrompt:
    """The recipe (see the module docstring)."""

    def encode(self, text: str, encoders: Sequence[ReadyEncoder]) -> tuple[Tensor, Tensor | None]:
        return self.encode_pair(text, text, encoders)

    def encode_pair(
        self, clip_l: str, t5xxl: str, encoders: Sequence[ReadyEncoder]
    ) -> tuple[Tensor, Tensor | None]:
        embeds, pooled = None, None
        for enc in encoders:
            if isinstance(enc.kind, T5Text):
                embeds = enc.kind.encode(enc.module, enc.tokenizer, t5xxl, enc.options)
            else:
                _, pooled = enc.kind.encode(
                    enc.module, enc.tokenizer, clip_l, -1, final_norm=True, pooled=True
                )
        if embeds is None:
            raise ModelLoadError(
                "this model needs the T5-XXL text encoder; load it with DualCLIPLoader (type flux) "
                "or CLIPLoader (type chroma)"
            )
        return embeds, pooled
