"""The newer text nodes (nodes/text/text_edit.py): ComfyUI's names, inputs and outputs, format with
growable values, forgiving JSON extraction, and the small edits."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.context import Folders, NodeContext
from nodes.text import text_edit as t


@pytest.fixture
def ctx(tmp_path: Path) -> NodeContext:
    return NodeContext(node_id="1", prompt_id="p", folders=Folders(tmp_path, tmp_path, tmp_path))


def test_string_format_fills_named_values(ctx: NodeContext) -> None:
    values = {"values.a": 16, "values.b": 9, "values.c": 1024, "values.d": 576}
    assert t.StringFormat().run(ctx, f_string="{a}:{b}, {c} × {d} px", **values) == ("16:9, 1024 × 576 px",)
    assert t.StringFormat().run(ctx, f_string="{a:.2f}", **{"values.a": 0.5}) == ("0.50",)


def test_string_format_errors_teach(ctx: NodeContext) -> None:
    with pytest.raises(t.TextFormatError, match=r"placeholder \{c\} has no value \(connected: a\)"):
        t.StringFormat().run(ctx, f_string="{a} {c}", **{"values.a": 1})
    with pytest.raises(t.TextFormatError, match="named placeholders"):
        t.StringFormat().run(ctx, f_string="{} {a", **{"values.a": 1})


def test_string_format_declares_growable_values() -> None:
    info = t.StringFormat.SCHEMA.export()
    assert list(info["input"]["required"]) == ["f_string"]
    assert info["input"]["required"]["f_string"][1]["default"] == "{a}"
    assert list(info["input"]["optional"])[:3] == ["values.a", "values.b", "values.c"]
    assert info["input"]["optional"]["values.a"][0] == "*"


def test_json_extract_finds_the_first_object_in_prose(ctx: NodeContext) -> None:
    reply = 'Sure!\n```json\n{"prompt": "a red fox", "mu": 1.5, "tags": ["a"], "none": null}\n```\nDone {x}'
    node = t.JsonExtractString()
    assert node.run(ctx, json_string=reply, key="prompt") == ("a red fox",)
    assert node.run(ctx, json_string=reply, key="mu") == ("1.5",)
    assert node.run(ctx, json_string='[1, 2] {bad} {"k": 3}', key="k") == ("3",)


def test_json_extract_chains_through_an_extracted_object(ctx: NodeContext) -> None:
    # the Ideogram template's pattern: pick a preset object by name, then a number from it
    presets = '{"Default": {"num_steps": 20, "mu": 0.0, "turbo": false}, "Turbo": {"mu": 0.5}}'
    node = t.JsonExtractString()
    (preset,) = node.run(ctx, json_string=presets, key="Default")
    assert node.run(ctx, json_string=preset, key="num_steps") == ("20",)
    assert node.run(ctx, json_string=preset, key="mu") == ("0.0",)
    assert node.run(ctx, json_string=preset, key="turbo") == ("false",)


def test_json_extract_is_forgiving_as_comfyui(ctx: NodeContext) -> None:
    # ComfyUI's documented behaviour: a missing key, a null value or no JSON object give ''
    node = t.JsonExtractString()
    assert node.run(ctx, json_string='{"a": 1}', key="missing") == ("",)
    assert node.run(ctx, json_string='{"a": null}', key="a") == ("",)
    assert node.run(ctx, json_string="no json here", key="a") == ("",)


def test_small_text_edits(ctx: NodeContext) -> None:
    assert t.ReplaceText().run(ctx, text="a-b-c", find="-", replace="+") == ("a+b+c",)
    assert t.TextToLowercase().run(ctx, text="Red FOX") == ("red fox",)
    assert t.TextToUppercase().run(ctx, text="Red fox") == ("RED FOX",)
    assert t.AddTextPrefix().run(ctx, text="fox", prefix="a red ") == ("a red fox",)
    assert t.AddTextSuffix().run(ctx, text="a red", suffix=" fox") == ("a red fox",)
    assert t.AddTextPrefix().run(ctx, text="fox") == ("fox",)
    assert t.StripWhitespace().run(ctx, text=" \n\ta fox \r\n") == ("a fox",)
    assert t.TruncateText().run(ctx, text="abcdef", max_length=3) == ("abc",)


def test_text_edit_ports_match_comfyui() -> None:
    truncate = t.TruncateText.SCHEMA.export()
    assert truncate["output_name"] == ["string"]
    assert {k: truncate["input"]["required"]["max_length"][1][k] for k in ("default", "min", "max")} == {
        "default": 77,
        "min": 1,
        "max": 10000,
    }
    assert t.AddTextPrefix.SCHEMA.export()["input_order"] == {"required": ["text"], "optional": ["prefix"]}
    assert t.ReplaceText.SCHEMA.export()["output_name"] == ["text"]


def test_convert_array_and_dictionary_to_json(ctx: NodeContext) -> None:
    assert t.ConvertArrayToString().run(ctx, array=[1, "é"], indent=0) == ('[1, "é"]',)
    assert t.ConvertDictionaryToString().run(ctx, dictionary={"a": [1]}, indent=2) == (
        '{\n  "a": [\n    1\n  ]\n}',
    )
    with pytest.raises(TypeError, match="array: expected a list, found dict"):
        t.ConvertArrayToString().run(ctx, array={"a": 1})
    with pytest.raises(TypeError, match="dictionary: holds a value JSON cannot write"):
        t.ConvertDictionaryToString().run(ctx, dictionary={"a": object()})
