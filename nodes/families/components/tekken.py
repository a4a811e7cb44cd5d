"""Mistral's "tekken" tokenizer, read from the JSON that ComfyUI's Flux.2 dev text-encoder files carry
as a ``tekken_model`` uint8 tensor (the same file as Mistral's ``tekken.json``), turned into a
``tokenizers`` BPE tokenizer with no network and no extra package.

The format: ``config`` (the pre-tokenizer regex ``pattern``, ``default_vocab_size`` and
``default_num_special_tokens``), ``vocab`` (``rank`` and base64 ``token_bytes`` of every byte-level BPE
token, rank = merge priority) and ``special_tokens`` (``rank`` = id, ``token_str``). Ids: the special
tokens take 0 … n−1 (unlisted ones are ``<SPECIAL_i>``), vocabulary token ``rank`` is id ``rank + n``,
and only the first ``default_vocab_size − n`` vocabulary tokens are used. Merges are recovered from
the ranks (a token's merge is a split into two tokens of lower rank), as tiktoken-style BPE works."""

from __future__ import annotations

import base64
import json
from typing import Any


def _byte_chars() -> dict[int, str]:
    """GPT-2's printable stand-in character for every byte (what byte-level BPE vocabularies store)."""
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    )
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def tekken_tokenizer(data: bytes) -> Any:
    """A ``tokenizers.Tokenizer`` from tekken JSON ``data`` (special tokens recognised in the text)."""
    from tokenizers import (  # lazy: tokenizers only for a Mistral file
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        pre_tokenizers,
    )
    from tokenizers.models import BPE  # lazy: tokenizers only for a Mistral file

    try:
        spec = json.loads(data)
        config, vocab, specials = spec["config"], spec["vocab"], spec.get("special_tokens", [])
        n_special = int(config["default_num_special_tokens"])
        n_vocab = int(config["default_vocab_size"]) - n_special
        pattern = str(config["pattern"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"the text encoder's tekken_model is not a tekken tokenizer JSON ({exc})") from exc
    chars = _byte_chars()
    ranks: dict[bytes, int] = {}
    for entry in sorted(vocab, key=lambda e: int(e["rank"]))[:n_vocab]:
        ranks[base64.b64decode(entry["token_bytes"])] = int(entry["rank"])

    def text(token: bytes) -> str:
        return "".join(chars[b] for b in token)

    merges: list[tuple[int, int, int, str, str]] = []
    for token, rank in ranks.items():
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in ranks and right in ranks and ranks[left] < rank and ranks[right] < rank:
                merges.append((rank, ranks[left], ranks[right], text(left), text(right)))
    merges.sort()
    names = {int(s["rank"]): str(s["token_str"]) for s in specials}
    special_names = [names.get(i, f"<SPECIAL_{i}>") for i in range(n_special)]
    ids = {text(t): r + n_special for t, r in ranks.items()} | {
        name: i for i, name in enumerate(special_names)
    }
    model = BPE(ids, [(m[3], m[4]) for m in merges], fuse_unk=False, ignore_merges=True)
    tokenizer = Tokenizer(model)
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in special_names])
    return tokenizer
