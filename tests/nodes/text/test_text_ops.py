"""The text and logic nodes (nodes/text/strings.py): ComfyUI's behaviour, the lazy switch, and the
free-choice custom combo passing validation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engine.context import Folders, NodeContext
from engine.registry import NodeRegistry
from engine.validate import validate_node
from nodes.text import strings as t


@pytest.fixture
def ctx(tmp_path: Path) -> NodeContext:
    return NodeContext(node_id="1", prompt_id="p", folders=Folders(tmp_path, tmp_path, tmp_path))


def run(node: type, ctx: NodeContext, **inputs: Any) -> Any:
    return node().run(ctx, **inputs)


def test_string_edits(ctx: NodeContext) -> None:
    assert run(t.StringReplace, ctx, string="a-b-c", find="-", replace="+") == ("a+b+c",)
    assert run(t.StringSubstring, ctx, string="lighthouse", start=-5, end=10) == ("house",)
    assert run(t.StringTrim, ctx, string="  x  ", mode="Left") == ("x  ",)
    assert run(t.StringTrim, ctx, string="  x  ", mode="Both") == ("x",)
    assert run(t.StringLength, ctx, string="héllo") == (5,)
    assert run(t.CaseConverter, ctx, string="a red FOX", mode="Capitalize") == ("A red fox",)
    assert run(t.CaseConverter, ctx, string="a red fox", mode="Title Case") == ("A Red Fox",)


def test_contains_and_compare_case_rules(ctx: NodeContext) -> None:
    assert run(t.StringContains, ctx, string="Red Fox", substring="fox", case_sensitive=True) == (False,)
    assert run(t.StringContains, ctx, string="Red Fox", substring="fox", case_sensitive=False) == (True,)
    assert run(
        t.StringCompare, ctx, string_a="Foxes", string_b="fox", mode="Starts With", case_sensitive=False
    ) == (True,)
    assert run(
        t.StringCompare, ctx, string_a="Foxes", string_b="ES", mode="Ends With", case_sensitive=True
    ) == (False,)
    assert run(t.StringCompare, ctx, string_a="a", string_b="a", mode="Equal", case_sensitive=True) == (True,)


def test_regex_match_and_extract(ctx: NodeContext) -> None:
    flags = {"case_insensitive": True, "multiline": False, "dotall": False}
    assert run(t.RegexMatch, ctx, string="Seed 42", regex_pattern=r"seed \d+", **flags) == (True,)
    assert run(t.RegexMatch, ctx, string="x", regex_pattern="(", **flags) == (False,)  # invalid: no match
    text = "w=512 h=768"
    assert run(
        t.RegexExtract,
        ctx,
        string=text,
        regex_pattern=r"(\w)=(\d+)",
        mode="All Matches",
        group_index=1,
        **flags,
    ) == ("w\nh",)  # findall with groups keeps each match's first group
    assert run(
        t.RegexExtract,
        ctx,
        string=text,
        regex_pattern=r"(\w)=(\d+)",
        mode="First Group",
        group_index=2,
        **flags,
    ) == ("512",)
    assert run(
        t.RegexExtract,
        ctx,
        string=text,
        regex_pattern=r"(\w)=(\d+)",
        mode="All Groups",
        group_index=2,
        **flags,
    ) == ("512\n768",)
    assert run(
        t.RegexExtract, ctx, string=text, regex_pattern=r"(\w)=", mode="First Group", group_index=5, **flags
    ) == ("",)
    assert run(
        t.RegexExtract, ctx, string=text, regex_pattern=r"\d+", mode="First Match", group_index=1, **flags
    ) == ("512",)


def test_regex_replace_and_its_error(ctx: NodeContext) -> None:
    assert run(t.RegexReplace, ctx, string="A a a", regex_pattern="a", replace="b", count=2) == ("b b a",)
    assert run(t.RegexReplace, ctx, string="A a", regex_pattern="a", replace="b", case_insensitive=False) == (
        "A b",
    )
    with pytest.raises(t.TextError, match="regex_pattern or replace: invalid regular expression"):
        run(t.RegexReplace, ctx, string="x", regex_pattern="(", replace="")


def test_switch_asks_only_for_the_chosen_branch(ctx: NodeContext) -> None:
    node = t.ComfySwitchNode()
    assert node.check_lazy_status(ctx, switch=True, on_true=None, on_false=None) == ["on_true"]
    assert node.check_lazy_status(ctx, switch=False, on_true=None, on_false=None) == ["on_false"]
    assert node.check_lazy_status(ctx, switch=False, on_true=None, on_false=3) == []
    assert node.check_lazy_status(ctx, switch=True) == []  # not connected: nothing to compute
    assert node.run(ctx, switch=True, on_true="yes", on_false="no") == ("yes",)
    assert node.run(ctx, switch=False) == (None,)


def test_custom_combo_accepts_any_choice() -> None:
    registry = NodeRegistry()
    registry.register_all(t.text_node_defs())
    prompt = {"1": {"class_type": "CustomCombo", "inputs": {"choice": "my own option", "index": 2}}}
    issues, constants = validate_node("1", prompt, registry)
    assert issues == [] and constants == {"choice": "my own option", "index": 2}
    assert t.CustomCombo().run(
        NodeContext("1", "p", Folders(Path("."), Path("."), Path("."))), choice="my own option", index=2
    ) == ("my own option", 2)


def switch_prompt(switch: bool) -> dict[str, Any]:
    return {
        "2": {"class_type": "RegexReplace", "inputs": {"string": "x", "regex_pattern": "(", "replace": ""}},
        "3": {
            "class_type": "StringReplace",
            "inputs": {"string": "a good fox", "find": "good", "replace": "red"},
        },
        "4": {
            "class_type": "ComfySwitchNode",
            "inputs": {"switch": switch, "on_false": ["2", 0], "on_true": ["3", 0]},
        },
        "5": {"class_type": "PreviewAny", "inputs": {"source": ["4", 0]}},
    }


def test_switch_in_a_run_never_computes_the_other_branch(tmp_path: Path) -> None:
    from engine.cache import OutputCache
    from engine.executor import Executor, RunRequest
    from nodes.text.primitives import NODES as UTILITY_NODES

    registry = NodeRegistry()
    registry.register_all([*UTILITY_NODES, *t.text_node_defs()])
    executor = Executor(registry, OutputCache(), Folders(tmp_path, tmp_path, tmp_path))
    chosen = executor.run(RunRequest(prompt=switch_prompt(True)))
    assert chosen.status == "success" and chosen.outputs["5"]["text"] == ["a red fox"]
    # the false branch holds an invalid pattern: computing it fails the run, naming the input
    other = executor.run(RunRequest(prompt=switch_prompt(False)))
    assert other.status != "success" and "regex_pattern" in json.dumps(other.error)
