"""The CLIP text encoder kind (transformers' ``CLIPTextModel`` / ``CLIPTextModelWithProjection``):
config from the tensors, the key table both ways for the two single-file layouts (``hf_clip``:
transformers' own names; ``open_clip``: OpenCLIP's ``transformer.resblocks.*`` with fused q/k/v),
the build, the tokenizers, and how a prompt goes through one encoder; and :class:`TextEncoders`,
the loaded CLIP value.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from nodes.core import prompt_weights as pw
from nodes.core.embeddings import EmbeddingLookup, split_embedding_word
from nodes.core.tensors import TensorIndex
from nodes.families import arch, keys
from nodes.families.components import EncoderFile

CONFIGS_DIR = Path(__file__).resolve().parents[3] / "models" / "configs"
CLIP_G_MARKER = "text_model.encoder.layers.30.mlp.fc1.weight"  # ComfyUI's rule: CLIP-G has 32 layers
CLIP_G_FILES = (EncoderFile("CLIP-G", "", CLIP_G_MARKER),)  # transformers' names with the projection
CLIP_L_FILES = (  # transformers' names, with or without ``text_model.``
    EncoderFile(
        "CLIP-L", "text_model.", "text_model.encoder.layers.0.self_attn.q_proj.weight", unless=CLIP_G_MARKER
    ),
    EncoderFile("CLIP-L", "", "encoder.layers.0.self_attn.q_proj.weight"),
)


@dataclass(frozen=True)
class ClipText:
    """A CLIP text encoder in single-file ``layout`` (``hf_clip`` | ``open_clip``), with or without
    the text projection (its pooled output)."""

    layout: str
    projection: bool = False

    @property
    def id(self) -> str:
        return f"clip_text/{self.layout}" + ("+projection" if self.projection else "")

    @classmethod
    def from_tensors(cls, index: TensorIndex, prefix: str, layout: str) -> tuple[ClipText, dict[str, Any]]:
        """The kind and its CLIPTextConfig kwargs, read from the tensors under ``prefix``."""
        cfg = arch.clip_config(index, prefix, layout)
        return cls(layout, "projection_dim" in cfg), cfg

    def kind_and_config(self, index: TensorIndex, prefix: str) -> tuple[ClipText, dict[str, Any]]:
        """The kind of this layout for the tensors under ``prefix`` (the projection read from them)."""
        return ClipText.from_tensors(index, prefix, self.layout)

    @classmethod
    def from_diffusers(cls, layout: str, config: Mapping[str, Any]) -> ClipText:
        return cls(layout, "WithProjection" in str(config.get("architectures", "")))

    def to_diffusers(self, sd: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
        if self.layout == "open_clip":
            return keys.open_clip_to_hf(sd)
        return {k: v for k, v in sd.items() if k != "embeddings.position_ids"}

    def to_original(self, sd: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
        inner = {k.removeprefix("text_model."): v for k, v in sd.items()} if self.projection else dict(sd)
        if self.layout == "open_clip":
            return keys.hf_to_open_clip(inner)
        return {k: v for k, v in inner.items() if k != "embeddings.position_ids"}

    def module_keys(self, sd: dict[str, Any]) -> dict[str, Any]:
        """transformers' ``CLIPTextModelWithProjection`` nests the encoder under ``text_model.``."""
        if not self.projection:
            return sd
        return {k if k.startswith("text_projection.") else f"text_model.{k}": v for k, v in sd.items()}

    def empty(self, config: Mapping[str, Any]) -> Any:
        from transformers import (  # lazy: transformers is heavy to import
            CLIPTextConfig,
            CLIPTextModel,
            CLIPTextModelWithProjection,
        )

        cfg = CLIPTextConfig(**config)
        return CLIPTextModelWithProjection(cfg) if self.projection else CLIPTextModel(cfg)

    def load_tokenizer(self, name: str) -> Any:
        """The tokenizer of settings folder ``name`` (see :func:`load_tokenizer`)."""
        return load_tokenizer(name)

    def from_pretrained(self, path: Path, safetensors: bool) -> Any:
        from transformers import (  # lazy: transformers is heavy to import
            CLIPTextModel,
            CLIPTextModelWithProjection,
        )

        cls = CLIPTextModelWithProjection if self.projection else CLIPTextModel
        return cls.from_pretrained(path, local_files_only=True, use_safetensors=safetensors)

    # --- prompts ------------------------------------------------------------------------------
    @torch.no_grad()
    def encode(
        self,
        module: Any,
        tokenizer: Any,
        text: str,
        layer: int,
        *,
        final_norm: bool,
        pooled: bool,
        embeddings: EmbeddingLookup | None = None,
        encoder: str = "clip_l",
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``text`` (with ``(word:1.2)`` weights; long prompts in 77-token chunks) through
        ``module``: the hidden state ``layer`` (optionally final-normed), chunks concatenated,
        (1, 77·n, D); and the pooled (projected, if the model has a projection) output (1, P) if ``pooled``.
        With ``embeddings``, ``embedding:name`` words become that file's vectors for ``encoder``."""
        ids = {"bos": tokenizer.bos_token_id, "eos": tokenizer.eos_token_id, "pad": tokenizer.pad_token_id}
        table = module.get_input_embeddings()

        def tokenize_word(word: str) -> list[pw.Token]:
            name = split_embedding_word(word) if embeddings is not None else None
            if name is None or embeddings is None:
                return list(tokenizer(word, add_special_tokens=False)["input_ids"])
            stripped = name.rstrip(",")
            if stripped != name and embeddings.path_of(name) is None:
                name, rest = stripped, name[len(stripped) :]  # "embedding:x," -> x and a comma token
            else:
                rest = ""
            rows = embeddings.vectors(name, encoder, encoder, table.embedding_dim)
            tail = list(tokenizer(rest, add_special_tokens=False)["input_ids"]) if rest else []
            return [*rows, *tail]

        chunks = pw.chunk_tokens(pw.parse_weights(text), tokenize_word, **ids)
        weighted = any(c.has_weights for c in chunks)
        batch = [c.ids for c in chunks] + ([pw.empty_chunk(**ids).ids] if weighted else [])
        device = next(module.parameters()).device
        with _vectors_at(table, chunks):
            out = module(torch.tensor(batch, device=device), output_hidden_states=True)
        hidden = out.hidden_states[layer]
        if final_norm:
            hidden = _final_norm(module)(hidden)  # (n_chunks [+1], 77, D)
        if weighted:
            z = pw.apply_weights(hidden[:-1], hidden[-1], chunks)
        else:
            z = hidden.reshape(1, -1, hidden.shape[-1])  # chunks concatenated: (1, 77 * n, D)
        # pooled: the projected EOS state, or without a projection (Flux's CLIP-L) the final-normed EOS state
        pooled_out = out.text_embeds if self.projection else out.pooler_output
        return z, (pooled_out[0:1] if pooled else None)


@contextmanager
def _vectors_at(table: nn.Module, chunks: list[pw.Chunk]) -> Iterator[None]:
    """While inside, the token-embedding ``table`` puts each chunk's embedding vectors at their
    positions (a torch forward hook on the input embedding, removed on exit)."""
    placed = [(row, position, vector) for row, c in enumerate(chunks) for position, vector in c.vectors]
    if not placed:
        yield
        return

    def put(_module: nn.Module, _inputs: Any, output: torch.Tensor) -> torch.Tensor:
        output = output.clone()
        for row, position, vector in placed:
            output[row, position] = vector.to(output.dtype).to(output.device)
        return output

    handle = table.register_forward_hook(put)
    try:
        yield
    finally:
        handle.remove()


def _final_norm(module: Any) -> Any:
    norm = getattr(module, "final_layer_norm", None)
    return norm if norm is not None else module.text_model.final_layer_norm


def load_tokenizer(name: str) -> Any:
    """A CLIP tokenizer from the shipped files: ``models/configs/clip_tokenizer`` vocabulary with
    the settings of ``models/configs/<name>/tokenizer_config.json`` (e.g. a pad token ``!``)."""
    from transformers import CLIPTokenizer  # lazy: transformers is heavy to import

    tokenizer = CLIPTokenizer.from_pretrained(CONFIGS_DIR / "clip_tokenizer", local_files_only=True)
    if name != "clip_tokenizer":
        settings = json.loads((CONFIGS_DIR / name / "tokenizer_config.json").read_text(encoding="utf-8"))
        # Set after loading: the pad id becomes 0 while a "!" typed in a prompt still tokenizes as
        # "!</w>" (256), as in OpenCLIP and ComfyUI. (Passed to from_pretrained, "!" would become
        # a special token and prompt text "!" would turn into padding, as in diffusers.)
        tokenizer.pad_token = settings.get("pad_token", tokenizer.pad_token)
    return tokenizer


class TextEncoders(nn.ModuleDict):
    """The loaded CLIP value: the text encoders by name, and their tokenizers (a plain attribute:
    loaded with the module and kept with it in the RAM tier, since building one costs ~1 s)."""

    def __init__(self, encoders: dict[str, Any], tokenizers: dict[str, Any]) -> None:
        super().__init__(encoders)
        self.tokenizers = tokenizers
