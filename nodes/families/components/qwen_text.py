"""The Qwen3 text encoder kind (transformers' ``Qwen3Model``, the decoder without its LM head), as
Z-Image uses Qwen3-4B: config from the tensors, the key table, the build, the shipped tokenizer
(``models/configs/qwen_tokenizer``) and how a prompt goes through it.

Files: ComfyUI's ``qwen_3_4b.safetensors`` holds transformers' own names under ``model.``
(``model.embed_tokens.weight``, ``model.layers.N.self_attn.q_proj.weight``..., ``model.norm.weight``;
an ``lm_head.weight`` if present is not used), so the part's prefix is ``model.`` and the table is
the identity. What the shapes cannot tell are Qwen3's constants: RMS-norm eps 1e-6, rope theta 1e6,
40,960 positions.

Prompts follow ComfyUI's Z-Image text encoding (``comfy/text_encoders/z_image.py``): the prompt is
put in the chat template ``<|im_start|>user\\n{prompt}<|im_end|>\\n<|im_start|>assistant\\n``,
tokenized whole (no ``(word:1.2)`` weighting, no start/end token, no padding, no length limit; a
``\\(`` or ``\\)`` escape becomes the bare parenthesis), and the conditioning is the output of the
second-to-last decoder layer (no final norm), one row per token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from nodes.core.tensors import ModelLoadError, TensorIndex
from nodes.families.components import EncoderFile
from nodes.families.components.decoder_text import DecoderText, decoder_config

if TYPE_CHECKING:
    from nodes.families.prompt import ReadyEncoder

CONFIGS_DIR = Path(__file__).resolve().parents[3] / "models" / "configs"
QWEN3_FILES = (
    EncoderFile("Qwen3", "model.", "model.layers.0.self_attn.q_norm.weight"),
)  # ComfyUI's qwen_3_4b.safetensors
CHAT_TEMPLATE = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
QWEN3_CONSTANTS: dict[str, Any] = {
    "rms_norm_eps": 1e-6,
    "rope_theta": 1_000_000.0,
    "max_position_embeddings": 40960,
}


@dataclass(frozen=True)
class QwenText(DecoderText):
    """A Qwen3 decoder used as a text encoder (see the module docstring)."""

    template: str = CHAT_TEMPLATE
    id: str = "qwen3_text"
    config_class: ClassVar[str] = "Qwen3Config"
    model_class: ClassVar[str] = "Qwen3Model"

    # --- reading and building -----------------------------------------------------------------
    @staticmethod
    def config_from_tensors(index: TensorIndex, prefix: str) -> dict[str, Any]:
        """``Qwen3Config`` kwargs read from the shapes under ``prefix``."""
        if not index.has(f"{prefix}layers.0.self_attn.q_norm.weight"):
            raise ModelLoadError(
                f"{index.path}: no Qwen3 layers (layers.0.self_attn.q_norm) under {prefix!r}; "
                "a Qwen2/Qwen2.5 file is not the Qwen3 encoder this model needs"
            )
        head_dim = index.shape(f"{prefix}layers.0.self_attn.q_norm.weight")[0]
        heads = index.shape(f"{prefix}layers.0.self_attn.q_proj.weight")[0] // head_dim
        return {
            **decoder_config(index, prefix, head_dim, heads),
            "attention_bias": index.has(f"{prefix}layers.0.self_attn.q_proj.bias"),
            "tie_word_embeddings": True,
            **QWEN3_CONSTANTS,
        }

    # --- prompts ------------------------------------------------------------------------------
    def load_tokenizer(self, name: str) -> Any:
        return load_qwen_tokenizer()

    def token_ids(self, tokenizer: Any, text: str) -> list[int]:
        """ComfyUI's tokens of ``text``: the chat template around it, tokenized whole."""
        text = text.replace("\\)", ")").replace("\\(", "(")
        return list(tokenizer(self.template.format(text), add_special_tokens=False)["input_ids"])

    @torch.no_grad()
    def encode(self, module: Any, tokenizer: Any, text: str, layer: int) -> torch.Tensor:
        """The output of decoder layer ``layer`` (-2: the second-to-last; -1: the last, before the
        final norm, as ComfyUI's CLIPSetLastLayer -1) for ``text``: (1, T, D). An index beyond the
        depth gives the final, normed output (ComfyUI's "last")."""
        device = next(module.parameters()).device
        ids = torch.tensor([self.token_ids(tokenizer, text)], device=device)
        if not -len(module.layers) <= layer < 0:
            return module(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state
        captured: list[torch.Tensor] = []
        hook = module.layers[layer].register_forward_hook(
            lambda _m, _i, out: captured.append(out[0] if isinstance(out, tuple) else out)
        )
        try:
            module(input_ids=ids, attention_mask=torch.ones_like(ids))
        finally:
            hook.remove()
        return captured[0]


def load_qwen_tokenizer() -> Any:
    """Qwen's BPE tokenizer (Qwen2.5/Qwen3 vocabulary, 151,669 ids) from ``models/configs/qwen_tokenizer``."""
    from transformers import Qwen2Tokenizer  # lazy: transformers is heavy to import

    return Qwen2Tokenizer.from_pretrained(CONFIGS_DIR / "qwen_tokenizer", local_files_only=True)


@dataclass(frozen=True)
class ZImagePrompt:
    """ComfyUI's Z-Image text encoding: the Qwen3 encoder's hidden state (the handle's layer, -2 by
    default) of the templated prompt is the conditioning; there is no pooled vector."""

    def encode(self, text: str, encoders: Sequence[ReadyEncoder]) -> tuple[torch.Tensor, torch.Tensor | None]:
        for enc in encoders:
            if isinstance(enc.kind, QwenText):
                return enc.kind.encode(enc.module, enc.tokenizer, text, enc.layer), None
        raise ModelLoadError(
            "Z-Image needs the Qwen3-4B text encoder; load qwen_3_4b.safetensors with "
            "CLIPLoader (type lumina2)"
        )
