"""What every decoder-only LLM used as a text encoder shares (Qwen3, Qwen2.5-VL's language model,
Mistral-Small): transformers' ``<Name>Model`` (the decoder without its LM head), whose files hold
transformers' own names under the part's prefix (``embed_tokens``, ``layers.N``, ``norm``; anything
else, an LM head or a vision tower, is dropped), and a Llama-style config read from the shapes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from nodes.core.tensors import TensorIndex

DECODER_PARTS = ("embed_tokens.", "layers.", "norm.")


def decoder_config(index: TensorIndex, prefix: str, head_dim: int, heads: int) -> dict[str, Any]:
    """The config kwargs every Llama-style decoder reads from its shapes under ``prefix``: vocabulary
    and width (the embedding), the MLP width, the depth, ``heads`` query heads of ``head_dim``, the
    key/value heads the k projection holds; no cache."""
    vocab, hidden = index.shape(f"{prefix}embed_tokens.weight")
    return {
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": index.shape(f"{prefix}layers.0.mlp.gate_proj.weight")[0],
        "num_hidden_layers": index.count(f"{prefix}layers."),
        "num_attention_heads": heads,
        "num_key_value_heads": index.shape(f"{prefix}layers.0.self_attn.k_proj.weight")[0] // head_dim,
        "head_dim": head_dim,
        "use_cache": False,
    }


@dataclass(frozen=True)
class DecoderText:
    """The key table and build of a decoder-only text encoder; a subclass names its transformers
    classes (``config_class``, ``model_class``) and reads its config and prompts."""

    config_class: ClassVar[str] = ""
    model_class: ClassVar[str] = ""

    @staticmethod
    def config_from_tensors(index: TensorIndex, prefix: str) -> dict[str, Any]:
        """The config kwargs read from the shapes under ``prefix`` (each subclass its own)."""
        raise NotImplementedError

    def kind_and_config(self, index: TensorIndex, prefix: str) -> tuple[DecoderText, dict[str, Any]]:
        return self, self.config_from_tensors(index, prefix)

    def to_diffusers(self, sd: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in sd.items() if k.startswith(DECODER_PARTS)}

    def to_original(self, sd: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
        return dict(sd)

    def module_keys(self, sd: dict[str, Any]) -> dict[str, Any]:
        return sd

    def empty(self, config: Mapping[str, Any]) -> Any:
        import transformers  # lazy: transformers is heavy to import

        config_type = getattr(transformers, self.config_class)
        return getattr(transformers, self.model_class)(config_type(**config))

    def from_pretrained(self, path: Path, safetensors: bool) -> Any:
        import transformers  # lazy: transformers is heavy to import

        model_type = getattr(transformers, self.model_class)
        return model_type.from_pretrained(path, local_files_only=True, use_safetensors=safetensors)
