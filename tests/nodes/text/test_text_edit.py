"""The newer text nodes (nodes/text/text_edit.py): String Format, JSON extraction, replace, case,
prefix/suffix, truncate and seed, as ComfyUI's documentation describes them."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from engine.context import Folders, NodeContext
from nodes.text import text_edit as t


@pytest.fixture
def ctx(tmp_path: Path) -> NodeContext:
    return NodeContext(node_id="3", prompt_id="p", folders=Folders(tmp_path, tmp_path, tmp_path))


def fmt(ctx: NodeContext, f_string: str, **letters: Any) -> str:
    return t.StringFormat().run(ctx, f_string=f_string, **{f"values.{k}": v for k, v in letters.items()})[0]


def test_string_format_fills_letters_with_format_specs_and_braces(ctx: NodeContext) -> None:
    assert fmt(ctx, "{a}; {b}; aesthetics: {c}", a="cat", b=3, c=True) == "cat; 3; aesthetics: True"
    assert fmt(ctx, "cx: {a:.3f}, w: {b:.3f}", a=0.5, b=1) == "cx: 0.500, w: 1.000"
    assert fmt(ctx, '{{"ratio": "{a}"}}', a="16:9") == '{"ratio": "16:9"}'
    assert fmt(ctx, "no placeholders") == "no placeholders"


@pytest.mark.parametrize(
    ("f_string", "says"),
    [
        ("{b}", r"\{b\} has no input \(connected: a\)"),
        ("{}", "positional"),
        ("{a", "literal braces"),
        ("{a:q}", "literal braces"),
    ],
)
def test_string_format_errors_name_the_placeholder(ctx: NodeContext, f_string: str, says: str) -> None:
    with pytest.raises(t.TextFormatError, match=says):
        fmt(ctx, f_string, a=1)


def extract(ctx: NodeContext, text: str, key: str) -> str:
    return t.JsonExtractString().run(ctx, json_string=text, key=key)[0]


def test_json_extract_finds_the_object_inside_prose_and_fences(ctx: NodeContext) -> None:
    llm = 'Sure! Here it is:\n```json\n{"positive_prompt": "a red fox", "mu": 0.0, "n": 3}\n```\nEnjoy {not json'
    assert extract(ctx, llm, "positive_prompt") == "a red fox"
    assert extract(ctx, llm, "mu") == "0.0"
    assert extract(ctx, llm, "n") == "3"
    assert extract(ctx, '{"a": {"b": [1, 2]}}', "a") == '{"b": [1, 2]}'
    assert extract(ctx, '{"a": null}', "a") == ""
    assert extract(ctx, '[1, 2] then {"k": "v"}', "k") == "v"  # arrays are skipped, objects only


def test_json_extract_is_empty_and_logs_when_nothing_matches(
    ctx: NodeContext, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        assert extract(ctx, "no json here", "k") == ""
        assert extract(ctx, '{"other": 1}', "k") == ""
    assert "no JSON object" in caplog.text
    assert "has no key 'k' (keys: other)" in caplog.text


def test_text_edits(ctx: NodeContext) -> None:
    assert t.ReplaceText().run(ctx, text="a-b-c", find="-", replace="+") == ("a+b+c",)
    assert t.ReplaceText().run(ctx, text="abc", find="", replace="+") == ("abc",)
    assert t.TextToLowercase().run(ctx, text="Red FOX") == ("red fox",)
    assert t.TextToUppercase().run(ctx, text="Red fox") == ("RED FOX",)
    assert t.AddTextPrefix().run(ctx, text="fox", prefix="a red ") == ("a red fox",)
    assert t.AddTextPrefix().run(ctx, text="fox") == ("fox",)
    assert t.AddTextSuffix().run(ctx, text="fox", suffix=", 4k") == ("fox, 4k",)
    assert t.TruncateText().run(ctx, text="abcdef", max_length=3) == ("abc",)
    assert t.TruncateText().run(ctx, text="ab", max_length=77) == ("ab",)
    assert t.SeedNode().run(ctx, seed=2**63 - 1) == (2**63 - 1,)


def test_output_names_are_comfyuis() -> None:
    outs = {n.SCHEMA.node_id: [o.name for o in n.SCHEMA.outputs] for n in t.NODES}
    assert outs["JsonExtractString"] == ["STRING"] and outs["StringFormat"] == ["STRING"]
    assert outs["TruncateText"] == ["string"] and outs["ReplaceText"] == ["text"]
