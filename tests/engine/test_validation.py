"""Every validation error type lands on the right node, with nothing run."""

from __future__ import annotations

from typing import Any

import pytest

from tests.engine.conftest import Harness
from tests.engine.stub_nodes import G


def errors_of(result: Any, node_id: str) -> list[str]:
    return [e["type"] for e in result.node_errors[node_id]["errors"]]


def run_invalid(harness: Harness, prompt: dict[str, Any]) -> Any:
    result = harness.run(prompt)
    assert result.status == "invalid"
    assert harness.calls == []  # nothing ran
    assert result.executed == []
    return result


def test_missing_node_type_suggests_close_names(harness: Harness) -> None:
    g = G()
    c = g.add("Cosnt", value=1)
    g.add("Show", value=g.out(c))
    result = run_invalid(harness, g.prompt)
    err = result.node_errors["1"]["errors"][0]
    assert err["type"] == "missing_node_type"
    assert "Const" in err["extra_info"]["suggestions"]
    assert result.node_errors["1"]["dependent_outputs"] == ["2"]
    assert result.error["type"] == "prompt_outputs_failed_validation"


def test_prompt_without_outputs(harness: Harness) -> None:
    g = G()
    g.add("Const", value=1)
    result = run_invalid(harness, g.prompt)
    assert result.error["type"] == "prompt_no_outputs"


def test_required_input_missing(harness: Harness) -> None:
    g = G()
    a = g.add("Const", value=1)
    s = g.add("Add", a=g.out(a))
    g.add("Show", value=g.out(s))
    result = run_invalid(harness, g.prompt)
    assert errors_of(result, "2") == ["required_input_missing"]
    assert result.node_errors["2"]["errors"][0]["extra_info"]["input_name"] == "b"


@pytest.mark.parametrize("link", [["99", 0], ["1", 5]])
def test_bad_linked_input(harness: Harness, link: list[Any]) -> None:
    g = G()
    g.add("Const", value=1)
    g.add("Show", value=link)
    result = run_invalid(harness, g.prompt)
    assert errors_of(result, "2") == ["bad_linked_input"]


def test_return_type_mismatch(harness: Harness) -> None:
    g = G()
    p = g.add("Pick", choice="a")  # STRING
    d = g.add("Double", value=g.out(p))  # wants INT
    g.add("Show", value=g.out(d))
    result = run_invalid(harness, g.prompt)
    err = result.node_errors["2"]["errors"][0]
    assert err["type"] == "return_type_mismatch"
    assert err["extra_info"]["received_type"] == "STRING"


@pytest.mark.parametrize(
    ("node", "inputs", "kind"),
    [
        ("Const", {"value": "twelve"}, "invalid_input_type"),
        ("Const", {"value": 1.5}, "invalid_input_type"),
        ("Const", {"value": -101}, "value_smaller_than_min"),
        ("Const", {"value": 101}, "value_bigger_than_max"),
        ("Ratio", {"x": 1.5}, "value_bigger_than_max"),
        ("Pick", {"choice": "c"}, "value_not_in_list"),
        ("Even", {"value": 3}, "custom_validation_failed"),
    ],
)
def test_constant_rules(harness: Harness, node: str, inputs: dict[str, Any], kind: str) -> None:
    g = G()
    n = g.add(node, **inputs)
    g.add("Show", value=g.out(n))
    result = run_invalid(harness, g.prompt)
    assert errors_of(result, "1") == [kind]


def test_forced_input_of_a_widget_type_accepts_a_constant_as_comfyui_does(harness: Harness) -> None:
    g = G()
    d = g.add("Double", value=5)
    g.add("Show", value=g.out(d))
    assert harness.run(g.prompt).outputs == {"2": {"text": ["10"]}}


def test_constant_for_a_link_only_type_rejected(harness: Harness) -> None:
    g = G()
    g.add("UseThing", thing=5)
    g.add("Show", value=["1", 0])
    result = run_invalid(harness, g.prompt)
    assert errors_of(result, "1") == ["invalid_input_type"]


def test_dependency_cycle_names_the_nodes(harness: Harness) -> None:
    g = G()
    g.add("Add", a=["2", 0], b=["2", 0])
    g.add("Double", value=["1", 0])
    g.add("Show", value=["2", 0])
    result = run_invalid(harness, g.prompt)
    assert "dependency_cycle" in errors_of(result, "1")
    assert "dependency_cycle" in errors_of(result, "2")
    cycle = result.node_errors["1"]["errors"][-1]["extra_info"]["cycle"]
    assert set(cycle) == {"1", "2"}


def test_all_failures_collected_not_only_the_first(harness: Harness) -> None:
    g = G()
    a = g.add("Const", value=500)
    b = g.add("Nope")
    s = g.add("Add", a=g.out(a), b=g.out(b))
    g.add("Show", value=g.out(s))
    result = run_invalid(harness, g.prompt)
    assert set(result.node_errors) == {"1", "2"}


def test_a_failing_output_does_not_block_a_valid_one(harness: Harness) -> None:
    g = G()
    bad = g.add("Const", value=500)
    g.add("Show", value=g.out(bad))
    good = g.add("Const", value=7)
    g.add("Show", value=g.out(good))
    result = harness.run(g.prompt)
    assert result.status == "success"
    assert result.outputs == {"4": {"text": ["7"]}}
    assert result.node_errors["1"]["dependent_outputs"] == ["2"]
    assert "1" not in result.executed


def test_not_a_prompt(harness: Harness) -> None:
    result = harness.run({"1": "nonsense"})  # type: ignore[dict-item]
    assert result.status == "invalid"


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf"), "nan", "Infinity", 10**400])
def test_non_finite_floats_are_refused(harness: Harness, value: Any) -> None:
    g = G()
    r = g.add("Ratio", x=value)
    g.add("Show", value=g.out(r))
    result = run_invalid(harness, g.prompt)
    assert errors_of(result, "1") == ["invalid_input_type"]
    assert (
        "finite" in result.node_errors["1"]["errors"][0]["details"]
        or "too large" in result.node_errors["1"]["errors"][0]["details"]
    )


def test_a_missing_node_type_fails_the_prompt_even_when_unconnected(harness: Harness) -> None:
    g = G()
    c = g.add("Const", value=1)
    g.add("Show", value=g.out(c))
    g.add("NoSuchNode")  # connected to nothing
    result = run_invalid(harness, g.prompt)
    assert result.error["type"] == "invalid_prompt"
    assert result.error["message"] == "Cannot execute because node NoSuchNode does not exist."
    assert errors_of(result, "3") == ["missing_node_type"]
