"""The T5 encoder kind (transformers' ``T5EncoderModel``, T5 v1.1 with the gated-GELU MLP, as in
Flux.1, Chroma and SD3): config from the tensors, the key table (ComfyUI's and Black Forest Labs'
T5-XXL files already use transformers' names: ``encoder.block.N.layer.0.SelfAttention.q``,
``shared``; ComfyUI's all-in-one checkpoints nest them under ``text_encoders.t5xxl.transformer.``),
the build, the shipped tokenizer, and how a prompt goes through it.

Prompts follow ComfyUI's T5 rules: words are tokenized one by one, the end token ``</s>`` closes
the sequence, which is padded with ``<pad>`` to at least ``min_length`` tokens (256 for Flux, 77 for
SD3; diffusers pads to 512/256, which changes images) and is not truncated; the padding is attended
(no attention mask) unless ``attention_mask`` is set (Chroma). ``(word:1.2)`` weights scale the
token's embedding away from the empty prompt's, as for CLIP.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from nodes.core import prompt_weights as pw
from nodes.core.tensors import ModelLoadError, TensorIndex
from nodes.families.components import EncoderFile
from nodes.families.prompt import TokenizerOptions

CONFIGS_DIR = Path(__file__).resolve().parents[3] / "models" / "configs"
_EMBED = "encoder.embed_tokens.weight"
# umT5 (Wan) keeps a relative attention bias in every block; T5 v1.1 only in the first
PER_BLOCK_BIAS = "encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight"
T5_FILES = (
    EncoderFile("T5-XXL", "", "encoder.block.0.layer.0.SelfAttention.q.weight", unless=PER_BLOCK_BIAS),
)  # a T5-XXL file


@dataclass(frozen=True)
class T5Text:
    """A T5 encoder (see the module docstring); ``min_length`` is the family's padding length."""

    min_length: int = 256
    attention_mask: bool = False
    id: str = "t5_encoder"

    # --- reading and building -----------------------------------------------------------------
    def kind_and_config(self, index: TensorIndex, prefix: str) -> tuple[T5Text, dict[str, Any]]:
        return self, self.config_from_tensors(index, prefix)

    @staticmethod
    def config_from_tensors(index: TensorIndex, prefix: str) -> dict[str, Any]:
        """``T5Config`` kwargs read from the shapes under ``prefix``."""
        embed = f"{prefix}shared.weight" if index.has(f"{prefix}shared.weight") else f"{prefix}{_EMBED}"
        vocab, d_model = index.shape(embed)
        bias = index.shape(f"{prefix}encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight")
        heads = bias[1]
        if not index.has(f"{prefix}encoder.block.0.layer.1.DenseReluDense.wi_0.weight"):
            raise ModelLoadError(
                f"{index.path}: a T5 encoder without the gated MLP (wi_0/wi_1) is T5 v1.0, "
                "which no supported family uses; use a T5 v1.1 XXL file (t5xxl_*.safetensors)"
            )
        return {
            "vocab_size": vocab,
            "d_model": d_model,
            "d_kv": index.shape(f"{prefix}encoder.block.0.layer.0.SelfAttention.q.weight")[0] // heads,
            "d_ff": index.shape(f"{prefix}encoder.block.0.layer.1.DenseReluDense.wi_0.weight")[0],
            "num_layers": index.count(f"{prefix}encoder.block."),
            "num_heads": heads,
            "relative_attention_num_buckets": bias[0],
            "relative_attention_max_distance": 128,
            "feed_forward_proj": "gated-gelu",
            "layer_norm_epsilon": 1e-6,
            "is_encoder_decoder": False,
            "use_cache": False,
        }

    def to_diffusers(self, sd: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in sd.items() if k.startswith(("shared.", "encoder."))}
        embed = out.get("shared.weight", out.get(_EMBED))
        if embed is None:
            raise ModelLoadError(
                "a T5 encoder file without its token embedding (shared.weight); the file is incomplete"
            )
        out["shared.weight"] = out[_EMBED] = embed  # tied in T5EncoderModel
        return out

    def to_original(self, sd: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in sd.items() if k != _EMBED}

    def module_keys(self, sd: dict[str, Any]) -> dict[str, Any]:
        return sd

    def empty(self, config: Mapping[str, Any]) -> Any:
        from transformers import T5Config, T5EncoderModel  # lazy: transformers is heavy to import

        return T5EncoderModel(T5Config(**config))

    def from_pretrained(self, path: Path, safetensors: bool) -> Any:
        from transformers import T5EncoderModel  # lazy: transformers is heavy to import

        return T5EncoderModel.from_pretrained(path, local_files_only=True, use_safetensors=safetensors)

    # --- prompts ------------------------------------------------------------------------------
    def load_tokenizer(self, name: str) -> Any:
        return load_t5_tokenizer()

    def tokenize(self, tokenizer: Any, text: str, options: TokenizerOptions | None = None) -> pw.Chunk:
        """ComfyUI's T5 tokens of ``text`` with their weights: words one by one, ``</s>``, then
        ``min_padding`` pads and pads up to ``min_length`` (``options`` override the family's)."""
        ids: list[int] = []
        weights: list[float] = []
        for segment in pw.parse_weights(text):
            for word in segment.text.replace("\n", " ").split(" "):
                if word:
                    word_ids = list(tokenizer(word, add_special_tokens=False)["input_ids"])
                    ids += word_ids
                    weights += [segment.weight] * len(word_ids)
        ids.append(tokenizer.eos_token_id)
        weights.append(1.0)
        options = options or TokenizerOptions()
        min_length = self.min_length if options.min_length is None else options.min_length
        pad = options.min_padding or 0
        pad += max(0, min_length - len(ids) - pad)
        return pw.Chunk(tuple(ids + [tokenizer.pad_token_id] * pad), tuple(weights + [1.0] * pad))

    @torch.no_grad()
    def encode(
        self, module: Any, tokenizer: Any, text: str, options: TokenizerOptions | None = None
    ) -> torch.Tensor:
        """The last hidden state (1, T, D) of ``text`` (T ≥ min_length), weights applied."""
        chunk = self.tokenize(tokenizer, text, options)
        weighted = any(w != 1.0 for w in chunk.weights)
        rows = [chunk.ids]
        if weighted:
            empty = self.tokenize(tokenizer, "", options)
            rows.append(empty.ids + (tokenizer.pad_token_id,) * (len(chunk.ids) - len(empty.ids)))
        device = next(module.parameters()).device
        ids = torch.tensor(rows, device=device)
        mask = (ids != tokenizer.pad_token_id).long() if self.attention_mask else None
        if mask is not None:
            mask[:, 0] = 1
        hidden = module(input_ids=ids, attention_mask=mask).last_hidden_state
        if weighted:
            return pw.apply_weights(hidden[:1], hidden[1], [chunk])
        return hidden


def load_t5_tokenizer() -> Any:
    """The T5 v1.1 tokenizer from ``models/configs/t5_tokenizer`` (tokenizers backend, offline)."""
    from transformers import AutoTokenizer  # lazy: transformers is heavy to import

    return AutoTokenizer.from_pretrained(CONFIGS_DIR / "t5_tokenizer", local_files_only=True)
