"""ComfyUI's math and logic nodes: the math expression, number conversion, And/Or/Not and the
resolution selector.

The math expression is read with :mod:`ast` and evaluated by a small walker that knows only
arithmetic, comparisons, boolean logic and the functions ComfyUI documents (sum, min, max, abs,
round, pow, sqrt, ceil, floor, log, log2, log10, sin, cos, tan, int, float); anything else is
refused with an error naming what was found. Growable inputs are declared as ComfyUI's V3
Autogrow inputs appear in API prompts and UI files (``values.a``, ``values.b``, ...).
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable, Mapping
from typing import Any

from engine.context import NodeContext
from engine.node import Node
from engine.schema import ANY, BOOLEAN, COMBO, FLOAT, INT, STRING, Input, NodeSchema, Output

LETTERS = tuple(chr(ord("a") + i) for i in range(26))  # the names ComfyUI gives growable values
LOGIC_SLOTS = 32  # And/Or: values.value0 .. values.value31, at least one


class MathExpressionError(ValueError):
    """An expression the math node cannot evaluate; the message says what and how to fix it."""


FUNCTIONS: Mapping[str, Callable[..., Any]] = {
    "sum": sum,
    "min": min,
    "max": max,
    "abs": abs,
    "round": round,
    "pow": pow,
    "sqrt": math.sqrt,
    "ceil": math.ceil,
    "floor": math.floor,
    "log": math.log,
    "log2": math.log2,
    "log10": math.log10,
    "sin": math.sin,
    "cos": math.cos,
    "tan": math.tan,
    "int": int,
    "float": float,
}
BINARY: Mapping[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
UNARY: Mapping[type, Callable[[Any], Any]] = {
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
    ast.Not: operator.not_,
}
COMPARE: Mapping[type, Callable[[Any, Any], bool]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}
MAX_EXPONENT = 10_000  # a larger power of a number above 1 would hang the worker


def _refuse(expression: str, what: str) -> MathExpressionError:
    return MathExpressionError(
        f"expression {expression!r}: {what} is not allowed. Expected arithmetic (+ - * / // % **), "
        f"comparisons, and/or/not, numbers, the input names and these functions: {', '.join(FUNCTIONS)}."
    )


def evaluate_expression(expression: str, names: Mapping[str, Any]) -> Any:
    """The value of ``expression`` with ``names`` bound; only arithmetic and FUNCTIONS are allowed."""
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise MathExpressionError(
            f"expression {expression!r} is not a valid formula ({exc.msg}); write it like 'a * 2 + b'"
        ) from exc

    def walk(node: ast.AST) -> Any:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return node.value
        if isinstance(node, ast.Name):
            if node.id in names:
                return names[node.id]
            raise MathExpressionError(
                f"expression {expression!r}: unknown name {node.id!r}; the inputs here are "
                f"{', '.join(n for n in names if n != 'values') or 'none'} (connect more values to add names)"
            )
        if isinstance(node, ast.BinOp) and type(node.op) in BINARY:
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT and abs(left) > 1:
                raise MathExpressionError(f"expression {expression!r}: exponent {right} is too large")
            return BINARY[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in UNARY:
            return UNARY[type(node.op)](walk(node.operand))
        if isinstance(node, ast.BoolOp):
            values = [walk(v) for v in node.values]
            result = values[0]
            for value in values[1:]:
                result = (result and value) if isinstance(node.op, ast.And) else (result or value)
            return result
        if isinstance(node, ast.Compare) and all(type(op) in COMPARE for op in node.ops):
            left = walk(node.left)
            for op, comparator in zip(node.ops, node.comparators, strict=True):
                right = walk(comparator)
                if not COMPARE[type(op)](left, right):
                    return False
                left = right
            return True
        if isinstance(node, ast.IfExp):
            return walk(node.body) if walk(node.test) else walk(node.orelse)
        if isinstance(node, ast.List | ast.Tuple):
            return [walk(e) for e in node.elts]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
            function = FUNCTIONS.get(node.func.id)
            if function is None:
                raise _refuse(expression, f"the function {node.func.id!r}")
            return function(*(walk(a) for a in node.args))
        raise _refuse(expression, f"{type(node).__name__} ({ast.unparse(node)!r})")

    try:
        return walk(tree.body)
    except (ArithmeticError, TypeError, ValueError) as exc:
        if isinstance(exc, MathExpressionError):
            raise
        raise MathExpressionError(f"expression {expression!r} could not be computed: {exc}") from exc


class ComfyMathExpression(Node):
    SCHEMA = NodeSchema(
        node_id="ComfyMathExpression",
        display_name="Math Expression",
        category="math",
        description="Evaluate a formula over the values a, b, c, ... (and the list `values`).",
        inputs=(
            Input("expression", STRING, "The formula, e.g. 'a + b'.", default="a + b", multiline=True),
            *(
                Input(f"values.{name}", "FLOAT,INT,BOOLEAN", f"The value named {name}.", optional=i >= 1)
                for i, name in enumerate(LETTERS)
            ),
        ),
        outputs=(
            Output("FLOAT", FLOAT, "The result as a float."),
            Output("INT", INT, "The result truncated to an integer."),
            Output("BOOL", BOOLEAN, "True when the result is not zero."),
        ),
    )

    def run(self, ctx: NodeContext, *, expression: str, **values: Any) -> tuple[float, int, bool]:
        if not expression.strip():
            raise MathExpressionError("expression is empty; write a formula such as 'a + b'")
        named = {k.removeprefix("values."): v for k, v in values.items() if v is not None}
        names: dict[str, Any] = {n: named[n] for n in LETTERS if n in named}
        names["values"] = list(names.values())
        result = evaluate_expression(expression, names)
        if not isinstance(result, int | float):
            raise MathExpressionError(
                f"expression {expression!r} must give a number or a boolean, "
                f"found {type(result).__name__} {result!r}"
            )
        try:
            number = float(result)
        except OverflowError as exc:
            raise MathExpressionError(f"expression {expression!r}: the result is too large") from exc
        if not math.isfinite(number):
            raise MathExpressionError(f"expression {expression!r}: the result {number} is not finite")
        return (number, int(number), number != 0)


class ComfyNumberConvert(Node):
    SCHEMA = NodeSchema(
        node_id="ComfyNumberConvert",
        display_name="Convert Number",
        category="math",
        description="Turn an int, float, numeric text or boolean into a FLOAT and a (truncated) INT.",
        inputs=(Input("value", "INT,FLOAT,STRING,BOOLEAN", "The value to convert."),),
        outputs=(Output("FLOAT", FLOAT, "The value as a float."), Output("INT", INT, "The value truncated.")),
    )

    def run(self, ctx: NodeContext, *, value: Any) -> tuple[float, int]:
        if isinstance(value, str):
            text = value.strip()
            if not text:
                raise ValueError("value: the text is empty; expected a number such as '42' or '3.14'")
            try:
                number = float(text)
            except ValueError:
                raise ValueError(
                    f"value: {value!r} is not a number; expected text such as '42' or '3.14'"
                ) from None
        elif isinstance(value, bool | int | float):
            number = float(value)
        else:
            raise ValueError(f"value: expected INT, FLOAT, STRING or BOOLEAN, found {type(value).__name__}")
        if not math.isfinite(number):
            raise ValueError(f"value: {value!r} is not a finite number")
        if isinstance(value, int) and not isinstance(value, bool):
            return (number, value)
        return (number, int(number))


def _logic_inputs() -> tuple[Input, ...]:
    return tuple(
        Input(f"values.value{i}", ANY, f"Value #{i + 1} (any type, Python truthiness).", optional=i >= 1)
        for i in range(LOGIC_SLOTS)
    )


def _given(values: Mapping[str, Any]) -> list[Any]:
    return [values[f"values.value{i}"] for i in range(LOGIC_SLOTS) if f"values.value{i}" in values]


class ComfyAndNode(Node):
    SCHEMA = NodeSchema(
        node_id="ComfyAndNode",
        display_name="And",
        category="logic",
        description="True if every value is truthy (Python's rules).",
        inputs=_logic_inputs(),
        outputs=(Output("BOOLEAN", BOOLEAN, "True when all values are truthy."),),
    )

    def run(self, ctx: NodeContext, **values: Any) -> tuple[bool]:
        return (all(bool(v) for v in _given(values)),)


class ComfyOrNode(Node):
    SCHEMA = NodeSchema(
        node_id="ComfyOrNode",
        display_name="Or",
        category="logic",
        description="True if any value is truthy (Python's rules).",
        inputs=_logic_inputs(),
        outputs=(Output("BOOLEAN", BOOLEAN, "True when any value is truthy."),),
    )

    def run(self, ctx: NodeContext, **values: Any) -> tuple[bool]:
        return (any(bool(v) for v in _given(values)),)


class ComfyNotNode(Node):
    SCHEMA = NodeSchema(
        node_id="ComfyNotNode",
        display_name="Not",
        category="logic",
        description="The logical inverse of a value (Python's truthiness).",
        inputs=(Input("value", ANY, "The value to invert."),),
        outputs=(Output("output", BOOLEAN, "True when the value is falsy."),),
    )

    def run(self, ctx: NodeContext, *, value: Any) -> tuple[bool]:
        return (not value,)


ASPECT_RATIOS: Mapping[str, tuple[int, int]] = {
    "1:1 (Square)": (1, 1),
    "2:3 (Portrait Photo)": (2, 3),
    "3:2 (Photo)": (3, 2),
    "3:4 (Portrait Standard)": (3, 4),
    "4:3 (Standard)": (4, 3),
    "9:16 (Portrait Widescreen)": (9, 16),
    "16:9 (Widescreen)": (16, 9),
    "21:9 (Ultrawide)": (21, 9),
}


def resolution_for(aspect_ratio: str, megapixels: float, multiple: int) -> tuple[int, int]:
    """Width and height with about ``megapixels`` MP (1 MP = 1024²) at ``aspect_ratio``, each rounded
    to the nearest ``multiple``."""
    ratio = ASPECT_RATIOS.get(aspect_ratio)
    if ratio is None:
        raise ValueError(f"aspect_ratio: {aspect_ratio!r} is not one of {list(ASPECT_RATIOS)}")
    if multiple < 1:
        raise ValueError(f"multiple: expected a positive integer, found {multiple}")
    w, h = ratio
    scale = math.sqrt(megapixels * 1024 * 1024 / (w * h))
    return round(w * scale / multiple) * multiple, round(h * scale / multiple) * multiple


class ResolutionSelector(Node):
    SCHEMA = NodeSchema(
        node_id="ResolutionSelector",
        display_name="Resolution Selector",
        category="utils",
        description="Width and height from an aspect ratio and a megapixel target (e.g. for Empty Latent Image).",
        inputs=(
            Input(
                "aspect_ratio",
                COMBO,
                "The aspect ratio for the output dimensions.",
                default="1:1 (Square)",
                options=tuple(ASPECT_RATIOS),
            ),
            Input(
                "megapixels",
                FLOAT,
                "Target total megapixels. 1.0 MP ≈ 1024×1024 for square.",
                default=1.0,
                min=0.1,
                max=16.0,
                step=0.1,
            ),
            Input(
                "preview", "RESOLUTION_PREVIEW", "Live preview of the resulting resolution.", optional=True
            ),
            Input(
                "multiple",
                INT,
                "Round width and height to the nearest multiple of this.",
                default=8,
                min=8,
                max=128,
                step=4,
                optional=True,
            ),
        ),
        outputs=(
            Output("width", INT, "Calculated width in pixels."),
            Output("height", INT, "Calculated height in pixels."),
        ),
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        aspect_ratio: str,
        megapixels: float,
        multiple: int = 8,
        preview: Any = None,
    ) -> tuple[int, int]:
        return resolution_for(aspect_ratio, megapixels, multiple)


NODES: list[type[Node]] = [
    ResolutionSelector,
    ComfyMathExpression,
    ComfyNumberConvert,
    ComfyAndNode,
    ComfyOrNode,
    ComfyNotNode,
]
