"""Prompt weighting syntax, chunking of long prompts, and the weighting's effect on embeddings."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from nodes.core import prompt_weights as pw
from nodes.core.cond import CondEntry
from nodes.encode.conditioning import CLIPTextEncode
from nodes.families.components.clip_text import load_tokenizer
from nodes.families.prompt import ReadyEncoder
from nodes.load.handles import open_checkpoint


def _weights(prompt: str) -> list[tuple[str, float]]:
    return [(s.text, round(s.weight, 4)) for s in pw.parse_weights(prompt)]


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ("a cat", [("a cat", 1.0)]),
        ("a (cat:1.5) here", [("a ", 1.0), ("cat", 1.5), (" here", 1.0)]),
        ("(cat)", [("cat", 1.1)]),
        ("((cat))", [("cat", 1.21)]),
        ("[cat]", [("cat", round(1 / 1.1, 4))]),
        ("((a (cat:1.5)))", [("a ", 1.21), ("cat", 1.5)]),  # explicit weight replaces (ComfyUI)
        ("(a:b)", [("a:b", 1.1)]),  # not a number: plain emphasis
        (r"\(cat\) \[x\]", [("(cat) [x]", 1.0)]),
        ("cat) dog", [("cat) dog", 1.0)]),  # stray closer kept
        ("(cat dog", [("(cat dog", 1.0)]),  # opener never closed kept
        ("(big (red:0.5) cat:1.3)", [("big ", 1.3), ("red", 0.5), (" cat", 1.3)]),
    ],
)
def test_parse_weights(prompt: str, expected: list[tuple[str, float]]) -> None:
    assert _weights(prompt) == expected


def test_chunking_keeps_every_token_and_words_whole() -> None:
    tok = load_tokenizer("clip_tokenizer")

    def word(w: str) -> list[int]:
        return list(tok(w, add_special_tokens=False)["input_ids"])

    text = " ".join(["photograph"] * 80)  # 80 tokens: two chunks
    chunks = pw.chunk_tokens(pw.parse_weights(text), word, bos=49406, eos=49407, pad=49407)
    assert len(chunks) == 2 and all(len(c.ids) == 77 for c in chunks)
    body = [i for c in chunks for i in c.ids[1:] if i != 49407]
    assert len(body) == 80
    assert chunks[0].ids[0] == 49406 and chunks[0].ids[76] == 49407
    assert pw.chunk_tokens([], word, bos=49406, eos=49407, pad=49407)[0].ids[:2] == (49406, 49407)


@pytest.fixture(scope="module")
def sd15_encoder(tiny_models: dict) -> list[ReadyEncoder]:
    from nodes.families.catalog import SD15
    from nodes.families.components.clip_text import ClipText

    spec = SD15.text_encoders[0]
    kind = ClipText(spec.layout)
    return [
        ReadyEncoder(spec, kind, load_tokenizer(spec.tokenizer), tiny_models["sd15"].modules["clip_l"], -1)
    ]


def encode_prompt(text: str, encoders: list[ReadyEncoder]) -> Any:
    from nodes.families.catalog import SD15

    return CondEntry(*SD15.prompt.encode(text, encoders))


def test_weight_follows_comfyui_formula(sd15_encoder: list[ReadyEncoder]) -> None:
    plain = encode_prompt("a cat", sd15_encoder).embeds
    weighted = encode_prompt("a (cat:1.5)", sd15_encoder).embeds
    empty = encode_prompt("", sd15_encoder).embeds
    assert plain.shape == weighted.shape == (1, 77, 32)
    # token 0 = BOS, 1 = "a", 2 = "cat": only "cat" moves, along (z - z_empty) * 1.5 + z_empty
    assert torch.allclose(weighted[0, :2], plain[0, :2], atol=1e-6)
    expected = (plain[0, 2] - empty[0, 2]) * 1.5 + empty[0, 2]
    assert torch.allclose(weighted[0, 2], expected, atol=1e-5)
    assert (weighted[0, 2] - plain[0, 2]).abs().max() > 1e-3


def test_long_prompt_is_not_truncated(sd15_encoder: list[ReadyEncoder]) -> None:
    long = ", ".join(f"word{i}" for i in range(60))  # well over 75 tokens
    embeds = encode_prompt(long, sd15_encoder).embeds
    assert embeds.shape[1] % 77 == 0 and embeds.shape[1] >= 154
    tail = encode_prompt(long + ", zebra", sd15_encoder).embeds
    assert not torch.allclose(tail[:, -77:], embeds[:, -77:])  # the last words reached the encoder


def test_clip_text_encode_sdxl_concatenates_and_pools(tiny_sdxl_ckpt: Any, make_ctx: Any) -> None:
    ck = open_checkpoint(tiny_sdxl_ckpt)
    (entry,) = CLIPTextEncode().run(make_ctx(), text="a (cat:1.2)", clip=ck.clip)[0]
    assert entry.embeds.shape == (1, 77, 64)  # clip_l 32 + clip_g 32
    assert entry.pooled is not None and entry.pooled.shape == (1, 32)


def test_clip_set_last_layer_is_honoured(tiny_sd15_ckpt: Any, make_ctx: Any) -> None:
    from dataclasses import replace

    ck = open_checkpoint(tiny_sd15_ckpt)
    ctx = make_ctx()
    last = CLIPTextEncode().run(ctx, text="a cat", clip=ck.clip)[0][0].embeds
    skipped = CLIPTextEncode().run(ctx, text="a cat", clip=replace(ck.clip, layer=-2))[0][0].embeds
    assert not torch.allclose(last, skipped)
