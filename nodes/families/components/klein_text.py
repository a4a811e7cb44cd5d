"""The Qwen3 text encoder as Flux.2 Klein uses it (ComfyUI's ``KleinTokenizer`` / ``Qwen3_4BModel``
for Flux.2, the same files as Z-Image's Qwen3 kind: ``qwen_3_4b.safetensors`` for Klein 4B,
``qwen_3_8b.safetensors`` for Klein 9B).

What differs from Z-Image's encoding: the chat template closes an empty thinking block
(``<|im_start|>user\\n{prompt}<|im_end|>\\n<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n``), the
tokens are padded to at least 512 with ``<|endoftext|>`` (151643) under an attention mask, and the
conditioning stacks the hidden states of layers 9, 18 and 27 (``hidden_states[9]`` etc.: the inputs
of those decoder layers) per token: (1, T, 3·D), token-major, as ComfyUI's ``Flux2TEModel`` and
diffusers' ``Flux2KleinPipeline`` both do."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from nodes.core.tensors import ModelLoadError
from nodes.families.components.mistral_text import MistralText
from nodes.families.components.qwen_text import QwenText

if TYPE_CHECKING:
    from nodes.families.prompt import ReadyEncoder

KLEIN_TEMPLATE = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
KLEIN_LAYERS = (9, 18, 27)
MIN_TOKENS = 512
PAD_ID = 151643


@dataclass(frozen=True)
class KleinText(QwenText):
    """Qwen3 with Klein's template, padding and stacked hidden states (see the module docstring)."""

    template: str = KLEIN_TEMPLATE
    id: str = "qwen3_klein_text"
    layers: tuple[int, ...] = KLEIN_LAYERS
    min_tokens: int = MIN_TOKENS

    @torch.no_grad()
    def encode(self, module: Any, tokenizer: Any, text: str, layer: int) -> torch.Tensor:
        """The stacked hidden states of ``text`` (``layer`` is not used: Klein always takes 9, 18, 27)."""
        depth = module.config.num_hidden_layers
        if depth < max(self.layers):
            raise ModelLoadError(
                f"this Qwen3 text encoder has {depth} layers but Flux.2 Klein reads layers "
                f"{list(self.layers)}; load the Qwen3 file that belongs to the model "
                "(qwen_3_4b for Klein 4B, qwen_3_8b for Klein 9B)"
            )
        device = next(module.parameters()).device
        ids = self.token_ids(tokenizer, text)
        pad = max(0, self.min_tokens - len(ids))
        input_ids = torch.tensor([ids + [PAD_ID] * pad], device=device)
        mask = torch.tensor([[1] * len(ids) + [0] * pad], device=device)
        out = module(input_ids=input_ids, attention_mask=mask, output_hidden_states=True)
        stacked = torch.stack([out.hidden_states[i] for i in self.layers], dim=2)  # (1, T, 3, D)
        return stacked.reshape(stacked.shape[0], stacked.shape[1], -1)


@dataclass(frozen=True)
class Flux2Prompt:
    """ComfyUI's Flux.2 text encoding: the stacked hidden states of the one LLM encoder (Klein's Qwen3,
    dev's Mistral-Small) are the conditioning; there is no pooled vector."""

    def encode(self, text: str, encoders: Sequence[ReadyEncoder]) -> tuple[torch.Tensor, torch.Tensor | None]:
        for enc in encoders:
            if isinstance(enc.kind, KleinText | MistralText):
                return enc.kind.encode(enc.module, enc.tokenizer, text, enc.layer), None
        raise ModelLoadError(
            "Flux.2 needs its LLM text encoder (Qwen3 for Klein, Mistral-Small for dev); load it "
            "with CLIPLoader (type flux2)"
        )
