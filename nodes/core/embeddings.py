"""Textual-inversion embeddings in prompts, read as ComfyUI's tokenizer reads them.

A prompt word ``embedding:name`` (also weighted, ``(embedding:name:1.2)``) stands for the vectors
of ``models/embeddings/name`` (``name`` with or without ``.safetensors`` / ``.pt`` / ``.bin``,
sub-folders allowed; a trailing comma is not part of the name). The file's layouts:

- A1111's ``{"string_to_param": {"*": tensor}}`` (``.pt``, read with torch's weights-only loader);
- a file keyed by encoder (SDXL's ``clip_l`` and ``clip_g``; ``clip_h`` for SD2): each encoder
  takes its own vectors;
- any other dict (e.g. ``emb_params``) or a bare tensor: its first tensor.

Unlike ComfyUI, which drops a missing or wrong-width embedding with a log line, Loom stops with an
error that names the file, the folder searched and the widths, so a negative embedding never
silently vanishes from a prompt.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.context import ModelFiles

PREFIX = "embedding:"
EXTENSIONS = (".safetensors", ".pt", ".bin")


class EmbeddingError(ValueError):
    """An ``embedding:`` word that cannot be used; the message names the file and how to fix it."""


def read_embedding_file(path: Path) -> Any:
    """The raw contents: a dict of tensors (safetensors, or a weights-only torch pickle)."""
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file  # lazy: only prompts with embeddings read one

        return load_file(str(path), device="cpu")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unpickling failure: the file is not a plain embedding
        raise EmbeddingError(
            f"embedding file {path.name} cannot be read with torch's weights-only loader ({exc}); "
            "convert it to .safetensors"
        ) from None


def vectors_in(data: Any, key: str | None, width: int) -> torch.Tensor:
    """The [n, D] vectors of one encoder (``key``: clip_l / clip_g / clip_h) in a file's contents."""
    if isinstance(data, torch.Tensor):
        found: Any = data
    elif isinstance(data, Mapping) and "string_to_param" in data:
        found = next(iter(data["string_to_param"].values()))
    elif isinstance(data, Mapping) and key is not None and key in data:
        found = data[key]
    elif isinstance(data, list):
        rows = [t.reshape(-1, t.shape[-1]) for item in data for t in item.values() if t.shape[-1] == width]
        found = torch.cat(rows) if rows else None
    elif isinstance(data, Mapping):
        found = next((v for v in data.values() if isinstance(v, torch.Tensor)), None)
    else:
        found = None
    if not isinstance(found, torch.Tensor):
        raise EmbeddingError("it holds no embedding tensor")
    return found.reshape(-1, found.shape[-1]).float()


@dataclass(frozen=True)
class EmbeddingLookup:
    """Resolves ``embedding:`` words against the user's ``embeddings`` model folder."""

    files: ModelFiles

    def path_of(self, name: str) -> Path | None:
        known = set(self.files.list("embeddings"))
        for candidate in (name, *(name + ext for ext in EXTENSIONS)):
            if candidate in known:
                return self.files.resolve("embeddings", candidate)
        return None

    def vectors(self, name: str, encoder: str, key: str | None, width: int) -> torch.Tensor:
        """The vectors ``name`` stands for in ``encoder`` (width ``width``); raises EmbeddingError."""
        path = self.path_of(name)
        if path is None:
            available = ", ".join(sorted(self.files.list("embeddings"))[:20]) or "none"
            raise EmbeddingError(
                f"the prompt uses embedding:{name}, but models/embeddings has no {name}"
                f"{'' if Path(name).suffix else ' (.safetensors, .pt or .bin)'}; files there: {available}. "
                "Put the embedding file there or remove the word from the prompt."
            )
        try:
            rows = vectors_in(read_embedding_file(path), key, width)
        except EmbeddingError as exc:
            raise EmbeddingError(f"embedding:{name} ({path.name}): {exc}") from None
        if rows.shape[-1] != width:
            raise EmbeddingError(
                f"embedding:{name} ({path.name}) has vectors of width {rows.shape[-1]}, but the {encoder} "
                f"text encoder takes {width}. Use an embedding made for this model's text encoder."
            )
        return rows


def split_embedding_word(word: str) -> str | None:
    """The name in an ``embedding:name`` word, else None."""
    return word[len(PREFIX) :].strip("\n") if word.startswith(PREFIX) else None
