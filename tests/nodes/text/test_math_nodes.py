"""The math and number nodes (nodes/text/math_nodes.py): ComfyUI's Math Expression over the letters
a..z, number conversion, Not and the resolution selector, with their errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine.context import Folders, NodeContext
from engine.registry import NodeRegistry
from engine.validate import validate_node
from nodes.text import math_nodes as m


@pytest.fixture
def ctx(tmp_path: Path) -> NodeContext:
    return NodeContext(node_id="7", prompt_id="p", folders=Folders(tmp_path, tmp_path, tmp_path))


def math(ctx: NodeContext, expression: str, **letters: Any) -> tuple[float, int, bool]:
    return m.ComfyMathExpression().run(
        ctx, expression=expression, **{f"values.{k}": v for k, v in letters.items()}
    )


def test_expression_arithmetic_gives_float_truncated_int_and_bool(ctx: NodeContext) -> None:
    assert math(ctx, "a + b", a=2, b=0.5) == (2.5, 2, True)
    assert math(ctx, "a - b", a=-2.5, b=0) == (-2.5, -2, True)
    assert math(ctx, "a * 0", a=3) == (0.0, 0, False)
    assert math(ctx, "a // b + a % b + 2 ** 3", a=7, b=3) == (2 + 1 + 8.0, 11, True)


def test_expression_uses_the_template_forms(ctx: NodeContext) -> None:
    # forms taken from ComfyUI's official templates
    assert math(ctx, "a % b if b > 0 else 0", a=10, b=4)[1] == 2
    assert math(ctx, "a % b if b > 0 else 0", a=10, b=0)[1] == 0
    assert math(ctx, "ceil(a / (81 - 5))", a=77)[1] == 2
    assert math(ctx, "min(abs(b), 16) * a", a=2, b=-20)[1] == 32
    frames = "max(5, round(a * 24)) + (5 - (max(5, round(a * 24)) % 17)) % 17"
    assert math(ctx, frames, a=2.0)[1] == 56  # 48 + (5 - 48 % 17) % 17 = 48 + 8


def test_expression_functions_values_list_and_booleans(ctx: NodeContext) -> None:
    assert math(ctx, "sum(values)", a=1, b=2, c=3)[0] == 6.0
    assert math(ctx, "sum(a, b)", a=1, b=2)[0] == 3.0
    assert math(ctx, "sqrt(a) + floor(b) + log2(8)", a=9, b=1.9)[0] == 3 + 1 + 3.0
    assert math(ctx, "a > b and not c", a=2, b=1, c=False) == (1.0, 1, True)
    assert math(ctx, "a", a=True) == (1.0, 1, True)


@pytest.mark.parametrize(
    ("expression", "says"),
    [
        ("", "is empty"),
        ("   ", "is empty"),
        ("a +", "not a valid expression"),
        ("a.__class__", "not allowed"),
        ("__import__('os')", "not one of"),
        ("'text'", "not allowed"),
        ("zz + 1", "`zz`, which is not an input"),
        ("a / 0", "divides by zero"),
        ("2 ** 100000", "larger than the 4000"),
        ("pow(2, 5000)", "larger than the 4000"),
        ("sqrt(-1)", "cannot be computed"),
        ("[a, a]", "must give a number"),
        ("float('inf') if a else 0", "not allowed"),
        ("a * 1e308 * 10", "not a finite number"),
    ],
)
def test_expression_errors_teach(ctx: NodeContext, expression: str, says: str) -> None:
    with pytest.raises(m.ExpressionError, match=says):
        math(ctx, expression, a=1)


def test_expression_inputs_are_values_a_to_z_with_a_required() -> None:
    schema = m.ComfyMathExpression.SCHEMA
    names = [i.name for i in schema.inputs]
    assert names[:3] == ["expression", "values.a", "values.b"] and names[-1] == "values.z"
    by_name = {i.name: i for i in schema.inputs}
    assert not by_name["values.a"].optional and by_name["values.b"].optional
    assert by_name["values.a"].type == "FLOAT,INT,BOOLEAN"
    assert [o.name for o in schema.outputs] == ["FLOAT", "INT", "BOOL"]


def test_expression_validates_with_only_the_connected_letters() -> None:
    registry = NodeRegistry()
    registry.register_all(m.NODES)
    registry.register_all(__import__("nodes.text.primitives", fromlist=["NODES"]).NODES)
    prompt = {
        "1": {"class_type": "PrimitiveFloat", "inputs": {"value": 1.5}},
        "2": {"class_type": "ComfyMathExpression", "inputs": {"expression": "a * 2", "values.a": ["1", 0]}},
    }
    issues, _ = validate_node("2", prompt, registry)
    assert issues == []
    missing = {"2": {"class_type": "ComfyMathExpression", "inputs": {"expression": "a"}}}
    issues, _ = validate_node("2", missing, registry)
    assert issues and "values.a" in str(issues)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (3, (3.0, 3)),
        (2.9, (2.9, 2)),
        (-2.9, (-2.9, -2)),
        (True, (1.0, 1)),
        (False, (0.0, 0)),
        (" 42 ", (42.0, 42)),
        ("3.75", (3.75, 3)),
        ("-1e3", (-1000.0, -1000)),
    ],
)
def test_number_convert(ctx: NodeContext, value: Any, expected: tuple[float, int]) -> None:
    assert m.ComfyNumberConvert().run(ctx, value=value) == expected


@pytest.mark.parametrize(
    ("value", "says"),
    [("", "empty"), ("abc", "not a number"), ("inf", "not a finite"), ("nan", "not a finite")],
)
def test_number_convert_refuses_text_that_is_no_number(ctx: NodeContext, value: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        m.ComfyNumberConvert().run(ctx, value=value)


@pytest.mark.parametrize(
    ("value", "expected"),
    [(0, True), ("", True), ([], True), (None, True), (1, False), ("x", False), ([0], False)],
)
def test_not_uses_python_truthiness(ctx: NodeContext, value: Any, expected: bool) -> None:
    assert m.ComfyNotNode().run(ctx, value=value) == (expected,)


@pytest.mark.parametrize(
    ("ratio", "megapixels", "multiple", "size"),
    [
        ("1:1 (Square)", 1.0, 8, (1024, 1024)),
        ("16:9 (Widescreen)", 1.0, 8, (1368, 768)),  # 1024*sqrt(16/9)=1365.3 -> 1368; 1024*sqrt(9/16)=768
        ("9:16 (Portrait Widescreen)", 1.0, 8, (768, 1368)),
        ("16:9 (Widescreen)", 0.4, 32, (864, 480)),  # 863.6 -> 864, 485.7 -> 480
        ("3:2 (Photo)", 2.0, 64, (1792, 1152)),  # 1773.6 -> 1792, 1182.4 -> 1152
    ],
)
def test_resolution_selector(
    ctx: NodeContext, ratio: str, megapixels: float, multiple: int, size: tuple[int, int]
) -> None:
    assert (
        m.ResolutionSelector().run(ctx, aspect_ratio=ratio, megapixels=megapixels, multiple=multiple) == size
    )


def test_resolution_selector_reads_ui_widgets_without_multiple() -> None:
    # older saved files hold two widget values: [aspect_ratio, megapixels]
    by_name = {i.name: i for i in m.ResolutionSelector.SCHEMA.inputs}
    assert by_name["multiple"].optional and by_name["multiple"].default == 8
    assert m.ResolutionSelector.SCHEMA.inputs[0].options == m.ASPECT_RATIOS
