"""Prompt weighting as ComfyUI and A1111 users write it, and CLIP chunking of long prompts.

Syntax (``parse_weights``):

- ``(text)`` multiplies the weight of ``text`` by 1.1; ``((text))`` by 1.1² and so on.
- ``(text:1.3)`` sets the weight to 1.3, *replacing* the enclosing weight, as ComfyUI does
  (``comfy/sd1_clip.py`` ``token_weights``: ``((a:1.5))`` is 1.5, not 1.65 as in A1111).
- ``[text]`` divides the weight by 1.1 (A1111's de-emphasis; ComfyUI keeps brackets literal).
- ``\\(``, ``\\)``, ``\\[``, ``\\]`` are literal brackets.
- Unbalanced brackets are tolerated: a ``)`` or ``]`` without an opener and an opener never
  closed are kept as literal text, the way ComfyUI keeps going instead of failing.

Tokenisation (``chunk_tokens``) follows ComfyUI's ``SDTokenizer.tokenize_with_weights``: every
weighted segment is split at spaces into words, each word is tokenised on its own (no BOS/EOS),
and words are packed into chunks of 75 tokens; a word of at most 8 tokens that does not fit is
moved whole to the next chunk (the rest padded), a longer word is split. Each chunk becomes
``[BOS] + tokens + [EOS] + pad`` = 77 ids. Long prompts give several chunks; the encoder output
of all chunks is concatenated along the token axis (never truncated).

A word ``embedding:name`` is a textual-inversion embedding: the tokenizer callback returns its
vectors instead of ids (``nodes.core.embeddings``); they pack like tokens and the chunk records
their positions (:attr:`Chunk.vectors`) for the encoder's input embedding.

Weighting (``apply_weights``) is ComfyUI's ``ClipTokenWeightEncoder.encode_token_weights``: when
any weight differs from 1.0, an "empty" chunk (``[BOS, EOS, pad...]``) is encoded too and each
token's hidden state becomes ``z = (z - z_empty) * w + z_empty`` (per token position, per chunk);
tokens of weight 1.0 are untouched, so an unweighted prompt encodes exactly like diffusers does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

EMPHASIS = 1.1
CHUNK_TOKENS = 75  # content tokens per chunk; +BOS +EOS = 77
MAX_WORD_TOKENS = 8  # words up to this length are never split across chunks (ComfyUI's rule)

_ESCAPES = {"\\(": "\0a", "\\)": "\0b", "\\[": "\0c", "\\]": "\0d"}


@dataclass(frozen=True)
class Segment:
    """A run of prompt text and its weight."""

    text: str
    weight: float


@dataclass(frozen=True)
class Chunk:
    """77 token ids (with BOS/EOS/padding) and one weight per id (1.0 for the specials); and the
    positions whose input embedding is a given vector instead (textual-inversion embeddings: their
    id there is a placeholder, BOS)."""

    ids: tuple[int, ...]
    weights: tuple[float, ...]
    vectors: tuple[tuple[int, torch.Tensor], ...] = ()

    @property
    def has_weights(self) -> bool:
        return any(w != 1.0 for w in self.weights)


def _escape(text: str) -> str:
    for raw, code in _ESCAPES.items():
        text = text.replace(raw, code)
    return text


def _unescape(text: str) -> str:
    for raw, code in _ESCAPES.items():
        text = text.replace(code, raw[1])
    return text


def _matching_close(text: str, start: int) -> int:
    """Index of the bracket closing ``text[start]`` (same kind, nesting counted), or -1."""
    opener = text[start]
    closer = ")" if opener == "(" else "]"
    depth = 0
    for i in range(start, len(text)):
        if text[i] == opener:
            depth += 1
        elif text[i] == closer:
            depth -= 1
            if depth == 0:
                return i
    return -1


def _explicit_weight(inner: str) -> tuple[str, float | None]:
    """Split ``word:1.2`` into ``("word", 1.2)``; ``(None)`` when there is no numeric suffix."""
    colon = inner.rfind(":")
    if colon <= 0:
        return inner, None
    try:
        return inner[:colon], float(inner[colon + 1 :])
    except ValueError:
        return inner, None


def _parse(text: str, weight: float, out: list[Segment]) -> None:
    plain = ""
    i = 0
    while i < len(text):
        char = text[i]
        end = _matching_close(text, i) if char in "([" else -1
        if end < 0:  # ordinary char, stray closer, or an opener never closed: literal text
            plain += char
            i += 1
            continue
        if plain:
            out.append(Segment(plain, weight))
            plain = ""
        inner = text[i + 1 : end]
        if char == "(":
            inner, explicit = _explicit_weight(inner)
            _parse(inner, explicit if explicit is not None else weight * EMPHASIS, out)
        else:
            _parse(inner, weight / EMPHASIS, out)
        i = end + 1
    if plain:
        out.append(Segment(plain, weight))


def parse_weights(prompt: str) -> list[Segment]:
    """Split a prompt into weighted segments (see the module docstring for the syntax)."""
    out: list[Segment] = []
    _parse(_escape(prompt), 1.0, out)
    merged: list[Segment] = []
    for seg in out:
        text = _unescape(seg.text)
        if merged and merged[-1].weight == seg.weight:
            merged[-1] = Segment(merged[-1].text + text, seg.weight)
        elif text:
            merged.append(Segment(text, seg.weight))
    return merged


Token = int | torch.Tensor  # a token id, or an embedding vector (D,) standing for one token
TokenizeWord = Callable[[str], Sequence[Token]]


def chunk_tokens(
    segments: Sequence[Segment], tokenize_word: TokenizeWord, *, bos: int, eos: int, pad: int
) -> list[Chunk]:
    """Pack weighted words into 77-id chunks; always at least one chunk (empty prompt)."""
    chunks: list[list[tuple[Token, float]]] = [[]]
    for seg in segments:
        for word in seg.text.replace("\n", " ").split(" "):
            if not word:
                continue
            tokens: list[tuple[Token, float]] = [(t, seg.weight) for t in tokenize_word(word)]
            while tokens:
                room = CHUNK_TOKENS - len(chunks[-1])
                if len(tokens) <= room:
                    chunks[-1].extend(tokens)
                    break
                if len(tokens) <= MAX_WORD_TOKENS:  # short word: move it whole to a new chunk
                    chunks.append([])
                    continue
                chunks[-1].extend(tokens[:room])
                tokens = tokens[room:]
                chunks.append([])
    if len(chunks) > 1 and not chunks[-1]:
        chunks.pop()
    result = []
    for body in chunks:
        padding = CHUNK_TOKENS - len(body)
        ids = (bos, *(t if isinstance(t, int) else bos for t, _ in body), eos) + (pad,) * padding
        weights = (1.0, *(w for _, w in body), 1.0) + (1.0,) * padding
        vectors = tuple((i + 1, t) for i, (t, _) in enumerate(body) if isinstance(t, torch.Tensor))
        result.append(Chunk(ids, weights, vectors))
    return result


def empty_chunk(*, bos: int, eos: int, pad: int) -> Chunk:
    """The chunk of an empty prompt: the reference point of the weighting."""
    return Chunk((bos, eos) + (pad,) * CHUNK_TOKENS, (1.0,) * (CHUNK_TOKENS + 2))


def apply_weights(hidden: torch.Tensor, empty: torch.Tensor, chunks: Sequence[Chunk]) -> torch.Tensor:
    """ComfyUI's per-token weighting; ``hidden`` is [n_chunks, 77, D], ``empty`` [77, D].

    Returns the chunks concatenated along the token axis: [1, 77 * n_chunks, D].
    """
    weights = torch.tensor([c.weights for c in chunks], dtype=hidden.dtype, device=hidden.device)
    weights = weights.unsqueeze(-1)  # (n, 77, 1)
    weighted = torch.where(weights == 1.0, hidden, (hidden - empty) * weights + empty)
    return weighted.reshape(1, -1, hidden.shape[-1])
