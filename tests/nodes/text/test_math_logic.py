"""The math and logic nodes (nodes/text/math_logic.py): ComfyUI's names and growable inputs, a safe
expression evaluator, number conversion, truthiness gates and the resolution selector."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engine.cache import OutputCache
from engine.context import Folders, NodeContext
from engine.executor import Executor, RunRequest
from engine.formats import convert_ui_to_api
from engine.registry import NodeRegistry
from nodes.text import math_logic as m
from nodes.text.primitives import NODES as UTILITY_NODES


@pytest.fixture
def ctx(tmp_path: Path) -> NodeContext:
    return NodeContext(node_id="1", prompt_id="p", folders=Folders(tmp_path, tmp_path, tmp_path))


def math(ctx: NodeContext, expression: str, **letters: Any) -> tuple[float, int, bool]:
    return m.ComfyMathExpression().run(
        ctx, expression=expression, **{f"values.{k}": v for k, v in letters.items()}
    )


def test_math_expression_gives_float_int_and_bool(ctx: NodeContext) -> None:
    assert math(ctx, "a + b", a=2, b=0.5) == (2.5, 2, True)
    assert math(ctx, "a - a", a=3) == (0.0, 0, False)
    assert math(ctx, "-7 / 2", a=0) == (-3.5, -3, True)  # INT truncates toward zero
    assert math(ctx, "sum(values)", a=1, b=2, c=3) == (6.0, 6, True)
    assert math(ctx, "a > b and not c", a=2, b=1, c=False) == (1.0, 1, True)  # booleans count as 1/0
    assert math(ctx, "sqrt(a) + floor(2.7) + ceil(0.1) + log2(8) + max(a, 1)", a=16)[0] == 4 + 2 + 1 + 3 + 16


def test_math_expression_from_an_official_template(ctx: NodeContext) -> None:
    frames = "max(5, round(a * 24)) + (5 - (max(5, round(a * 24)) % 17)) % 17"
    assert math(ctx, frames, a=5.0) == (124.0, 124, True)


@pytest.mark.parametrize(
    ("expression", "teaches"),
    [
        ("__import__('os')", "'__import__'"),
        ("a.real.conjugate()", "Call"),
        ("a.__class__", "Attribute"),
        ("'text'", "Constant"),
        ("[x for x in values]", "ListComp"),
        ("open('f')", "'open'"),
        ("lambda: 1", "Lambda"),
    ],
)
def test_math_expression_refuses_anything_but_arithmetic(
    ctx: NodeContext, expression: str, teaches: str
) -> None:
    with pytest.raises(m.MathExpressionError, match="not allowed") as err:
        math(ctx, expression, a=1)
    assert teaches in str(err.value) and "sqrt" in str(err.value)  # names what it found and what is allowed


def test_math_expression_errors_teach(ctx: NodeContext) -> None:
    with pytest.raises(m.MathExpressionError, match="unknown name 'c'.*a, b"):
        math(ctx, "a + c", a=1, b=2)
    with pytest.raises(m.MathExpressionError, match="not a valid formula"):
        math(ctx, "a +", a=1)
    with pytest.raises(m.MathExpressionError, match="empty"):
        math(ctx, "   ", a=1)
    with pytest.raises(m.MathExpressionError, match="could not be computed.*division"):
        math(ctx, "a / 0", a=1)
    with pytest.raises(m.MathExpressionError, match="not finite"):
        math(ctx, "float(a) * 1e308 * 10", a=10)
    with pytest.raises(m.MathExpressionError, match="exponent"):
        math(ctx, "9 ** 999999", a=1)
    with pytest.raises(m.MathExpressionError, match="must give a number"):
        math(ctx, "values", a=1)


def test_math_expression_declares_comfyui_growable_values() -> None:
    info = m.ComfyMathExpression.SCHEMA.export()
    assert list(info["input"]["required"]) == ["expression", "values.a"]
    assert info["input"]["required"]["values.a"][0] == "FLOAT,INT,BOOLEAN"
    assert list(info["input"]["optional"])[:2] == ["values.b", "values.c"]
    assert list(info["input"]["optional"])[-1] == "values.z"
    assert info["output"] == ["FLOAT", "INT", "BOOLEAN"] and info["output_name"] == ["FLOAT", "INT", "BOOL"]


def test_number_convert(ctx: NodeContext) -> None:
    node = m.ComfyNumberConvert()
    assert node.run(ctx, value=" 3.75 ") == (3.75, 3)
    assert node.run(ctx, value=-2.9) == (-2.9, -2)
    assert node.run(ctx, value=True) == (1.0, 1)
    assert node.run(ctx, value=12) == (12.0, 12)
    for bad, teaches in (("", "empty"), ("twelve", "not a number"), ("inf", "finite"), ([1], "found list")):
        with pytest.raises(ValueError, match=teaches):
            node.run(ctx, value=bad)


def test_truthiness_gates(ctx: NodeContext) -> None:
    assert m.ComfyAndNode().run(ctx, **{"values.value0": 1, "values.value1": "x"}) == (True,)
    assert m.ComfyAndNode().run(ctx, **{"values.value0": 1, "values.value1": ""}) == (False,)
    assert m.ComfyOrNode().run(ctx, **{"values.value0": 0, "values.value1": [0]}) == (True,)
    assert m.ComfyOrNode().run(ctx, **{"values.value0": 0, "values.value2": None}) == (False,)
    assert m.ComfyNotNode().run(ctx, value=[]) == (True,)
    assert m.ComfyNotNode().run(ctx, value="a") == (False,)
    required = m.ComfyAndNode.SCHEMA.export()["input"]["required"]
    assert list(required) == ["values.value0"] and required["values.value0"][0] == "*"


def test_resolution_selector(ctx: NodeContext) -> None:
    node = m.ResolutionSelector()
    assert node.run(ctx, aspect_ratio="1:1 (Square)", megapixels=1.0) == (1024, 1024)
    width, height = node.run(ctx, aspect_ratio="16:9 (Widescreen)", megapixels=0.4, multiple=32)
    assert (width, height) == (864, 480) and width % 32 == height % 32 == 0
    with pytest.raises(ValueError, match="aspect_ratio.*'5:4'.*1:1 \\(Square\\)"):
        node.run(ctx, aspect_ratio="5:4", megapixels=1.0)
    info = m.ResolutionSelector.SCHEMA.export()
    assert info["input_order"] == {
        "required": ["aspect_ratio", "megapixels"],
        "optional": ["preview", "multiple"],
    }
    multiple = info["input"]["optional"]["multiple"][1]
    assert {k: multiple[k] for k in ("default", "min", "max", "step")} == {
        "default": 8,
        "min": 8,
        "max": 128,
        "step": 4,
    }


def test_math_feeding_a_prompt_runs(tmp_path: Path) -> None:
    registry = NodeRegistry()
    registry.register_all([*UTILITY_NODES, *m.NODES])
    executor = Executor(registry, OutputCache(), Folders(tmp_path, tmp_path, tmp_path))
    prompt = {
        "1": {
            "class_type": "ResolutionSelector",
            "inputs": {"aspect_ratio": "3:2 (Photo)", "megapixels": 1.0},
        },
        "2": {
            "class_type": "ComfyMathExpression",
            "inputs": {"expression": "a * b", "values.a": ["1", 0], "values.b": ["1", 1]},
        },
        "3": {"class_type": "PreviewAny", "inputs": {"source": ["2", 1]}},
    }
    result = executor.run(RunRequest(prompt=prompt))
    assert result.status == "success", json.dumps(result.error)
    assert result.outputs["3"]["text"] == [str(1256 * 840)]


def test_a_ui_file_maps_growable_values_and_widgets_by_name() -> None:
    # the shape today's frontend saves (from the MiniMax template): values.a linked, values.b open
    registry = NodeRegistry()
    registry.register_all([*UTILITY_NODES, *m.NODES])
    ui = {
        "nodes": [
            {
                "id": 1,
                "type": "ResolutionSelector",
                "mode": 0,
                "inputs": [],
                "outputs": [
                    {"name": "width", "type": "INT", "links": [7]},
                    {"name": "height", "type": "INT", "links": []},
                ],
                "widgets_values": ["16:9 (Widescreen)", 0.4, 32],
            },
            {
                "id": 2,
                "type": "ComfyMathExpression",
                "mode": 0,
                "inputs": [
                    {"name": "values.a", "type": "FLOAT,INT,BOOLEAN", "link": 7},
                    {"name": "values.b", "shape": 7, "type": "FLOAT,INT,BOOLEAN", "link": None},
                ],
                "outputs": [{"name": "FLOAT", "type": "FLOAT", "links": []}],
                "widgets_values": ["a // 16"],
            },
        ],
        "links": [[7, 1, 0, 2, 0, "INT"]],
    }
    prompt = convert_ui_to_api(ui, registry.object_info())
    assert prompt["1"]["inputs"] == {"aspect_ratio": "16:9 (Widescreen)", "megapixels": 0.4, "multiple": 32}
    assert prompt["2"]["inputs"] == {"expression": "a // 16", "values.a": ["1", 0]}
