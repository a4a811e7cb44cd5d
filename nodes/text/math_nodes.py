"""ComfyUI's math and number nodes: the Math Expression (a safe evaluator over the letters ``a``..``z``),
number conversion, logical not, and the resolution selector.

``ComfyMathExpression`` evaluates arithmetic, comparisons, ``and``/``or``/``not`` and ``x if c else y``
over its inputs and a fixed set of functions; anything else (attribute access, strings, lambdas,
names it does not know) is refused with the expression and what is allowed.
"""

from __future__ import annotations

import ast
import math
import operator
import string
from collections.abc import Callable
from typing import Any

from engine.context import NodeContext
from engine.node import Node
from engine.schema import ANY, BOOLEAN, COMBO, FLOAT, INT, STRING, Input, NodeSchema, Output

LETTERS = string.ascii_lowercase
MAX_EXPONENT = 4000  # as ComfyUI: a huge exponent would hang the worker


class ExpressionError(ValueError):
    """An expression the Math Expression node cannot evaluate; the message says why and what is allowed."""


def _sum(*args: Any) -> Any:
    if len(args) == 1 and isinstance(args[0], (list, tuple)):
        return sum(args[0])
    return sum(args)


def _pow(base: Any, exp: Any) -> Any:
    if abs(exp) > MAX_EXPONENT:
        raise ExpressionError(f"the exponent {exp} is larger than the {MAX_EXPONENT} allowed")
    return base**exp


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "sum": _sum,
    "min": min,
    "max": max,
    "abs": abs,
    "round": round,
    "pow": _pow,
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

BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: _pow,
}
COMPARE: dict[type, Callable[[Any, Any], bool]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}
ALLOWED = (
    "numbers, the input letters, `values` (all inputs as a list), + - * / // % **, comparisons, "
    "and/or/not, `x if condition else y`, and the functions " + ", ".join(FUNCTIONS)
)


def evaluate(expression: str, names: dict[str, Any]) -> Any:
    """The value of ``expression`` with ``names`` bound; raises :class:`ExpressionError`."""
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise ExpressionError(f"it is not a valid expression ({exc.msg}); allowed: {ALLOWED}") from None
    try:
        return _eval(tree.body, names)
    except ZeroDivisionError:
        raise ExpressionError("it divides by zero") from None
    except (OverflowError, ValueError, TypeError) as exc:
        if isinstance(exc, ExpressionError):
            raise
        raise ExpressionError(f"it cannot be computed: {exc}") from None


def _eval(node: ast.AST, names: dict[str, Any]) -> Any:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in names:
            known = ", ".join(sorted(names))
            raise ExpressionError(f"it uses `{node.id}`, which is not an input (inputs: {known})")
        return names[node.id]
    if isinstance(node, ast.BinOp) and type(node.op) in BINARY:
        return BINARY[type(node.op)](_eval(node.left, names), _eval(node.right, names))
    if isinstance(node, ast.UnaryOp):
        value = _eval(node.operand, names)
        if isinstance(node.op, ast.USub):
            return -value
        if isinstance(node.op, ast.UAdd):
            return +value
        if isinstance(node.op, ast.Not):
            return not value
    if isinstance(node, ast.BoolOp):
        result = _eval(node.values[0], names)
        for item in node.values[1:]:
            if isinstance(node.op, ast.And) and not result:
                return result
            if isinstance(node.op, ast.Or) and result:
                return result
            result = _eval(item, names)
        return result
    if isinstance(node, ast.Compare) and all(type(op) in COMPARE for op in node.ops):
        left = _eval(node.left, names)
        for op, right_node in zip(node.ops, node.comparators, strict=True):
            right = _eval(right_node, names)
            if not COMPARE[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.IfExp):
        return _eval(node.body if _eval(node.test, names) else node.orelse, names)
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_eval(item, names) for item in node.elts]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
        function = FUNCTIONS.get(node.func.id)
        if function is None:
            raise ExpressionError(f"it calls `{node.func.id}`, which is not one of {', '.join(FUNCTIONS)}")
        return function(*(_eval(arg, names) for arg in node.args))
    raise ExpressionError(f"it contains `{ast.unparse(node)}`, which is not allowed; allowed: {ALLOWED}")


def _letter_inputs(type_: str, description: str, required: int) -> tuple[Input, ...]:
    # ComfyUI's Autogrow with the names a..z: inputs ``values.a`` .. ``values.z``
    return tuple(
        Input(
            f"values.{letter}",
            type_,
            f"{description} `{letter}`.",
            optional=i >= required,
            display_name=letter,
        )
        for i, letter in enumerate(LETTERS)
    )


def letter_values(given: dict[str, Any]) -> dict[str, Any]:
    """The connected ``values.<letter>`` inputs as {letter: value}, in letter order."""
    return {letter: given[f"values.{letter}"] for letter in LETTERS if f"values.{letter}" in given}


class ComfyMathExpression(Node):
    SCHEMA = NodeSchema(
        node_id="ComfyMathExpression",
        display_name="Math Expression",
        category="logic",
        description="Evaluate a formula over the inputs a, b, c, ... (e.g. `a * 2 + b`); FLOAT, INT (truncated) and BOOL out.",
        inputs=(
            Input(
                "expression",
                STRING,
                "The formula; the inputs are named by their letters.",
                default="a + b",
                multiline=True,
            ),
            *_letter_inputs("FLOAT,INT,BOOLEAN", "The value named", required=1),
        ),
        outputs=(
            Output("FLOAT", FLOAT, "The result as a number."),
            Output("INT", INT, "The result with its fraction cut off."),
            Output("BOOL", BOOLEAN, "Whether the result is not zero."),
        ),
    )

    def run(self, ctx: NodeContext, *, expression: str, **given: Any) -> tuple[float, int, bool]:
        if not expression.strip():
            raise ExpressionError("The Math Expression is empty: write a formula such as `a + b`.")
        values = letter_values(given)
        names: dict[str, Any] = {**values, "values": list(values.values())}
        try:
            result = evaluate(expression, names)
        except ExpressionError as exc:
            raise ExpressionError(f"Math Expression {expression!r}: {exc}.") from None
        if isinstance(result, bool):
            result = int(result)
        if not isinstance(result, (int, float)):
            raise ExpressionError(
                f"Math Expression {expression!r} must give a number or a boolean, but gave "
                f"{type(result).__name__} {result!r}."
            )
        number = float(result)
        if not math.isfinite(number):
            raise ExpressionError(
                f"Math Expression {expression!r} gave {number}, which is not a finite number."
            )
        return number, int(result), result != 0


class ComfyNumberConvert(Node):
    SCHEMA = NodeSchema(
        node_id="ComfyNumberConvert",
        display_name="Number Convert",
        category="logic",
        description="Turn an integer, number, boolean or numeric text into FLOAT and INT (truncated).",
        inputs=(Input("value", "INT,FLOAT,STRING,BOOLEAN", "The value to convert."),),
        outputs=(
            Output("FLOAT", FLOAT, "The value as a number."),
            Output("INT", INT, "The value with its fraction cut off."),
        ),
    )

    def run(self, ctx: NodeContext, *, value: Any) -> tuple[float, int]:
        if isinstance(value, str):
            text = value.strip()
            if not text:
                raise ValueError("Number Convert: the text input is empty; give a number such as 3 or 2.5.")
            try:
                number = float(text)
            except ValueError:
                raise ValueError(f"Number Convert: {value!r} is not a number (e.g. 3 or 2.5).") from None
            if not math.isfinite(number):
                raise ValueError(f"Number Convert: {value!r} is not a finite number.")
            whole = int(text) if text.lstrip("+-").isdigit() else int(number)
            return number, whole
        if isinstance(value, bool) or isinstance(value, (int, float)):
            number = float(value)
            if not math.isfinite(number):
                raise ValueError(f"Number Convert: {value!r} is not a finite number.")
            return number, int(value)
        raise ValueError(f"Number Convert takes INT, FLOAT, STRING or BOOLEAN, not {type(value).__name__}.")


class ComfyNotNode(Node):
    SCHEMA = NodeSchema(
        node_id="ComfyNotNode",
        display_name="Not",
        category="logic",
        description="True when the value is falsy (0, empty text, empty list, nothing), else false.",
        inputs=(Input("value", ANY, "Any value."),),
        outputs=(Output("output", BOOLEAN, "The value's logical inverse."),),
    )

    def run(self, ctx: NodeContext, *, value: Any) -> tuple[bool]:
        return (not _truthy(value),)


def _truthy(value: Any) -> bool:
    numel = getattr(value, "numel", None)  # a tensor: true when it holds anything non-zero
    if callable(numel):
        return bool(numel() and bool(value.any()))
    return bool(value)


ASPECT_RATIOS = (
    "1:1 (Square)",
    "2:3 (Portrait Photo)",
    "3:2 (Photo)",
    "3:4 (Portrait Standard)",
    "4:3 (Standard)",
    "9:16 (Portrait Widescreen)",
    "16:9 (Widescreen)",
    "21:9 (Ultrawide)",
)


def ratio_of(label: str) -> tuple[int, int]:
    """``"16:9 (Widescreen)"`` → (16, 9)."""
    w, h = label.split(" ", 1)[0].split(":")
    return int(w), int(h)


class ResolutionSelector(Node):
    SCHEMA = NodeSchema(
        node_id="ResolutionSelector",
        display_name="Resolution Selector",
        category="utilities",
        description="Width and height from an aspect ratio and a megapixel target (1 MP = 1024×1024).",
        inputs=(
            Input(
                "aspect_ratio",
                COMBO,
                "The aspect ratio of the result.",
                default="1:1 (Square)",
                options=ASPECT_RATIOS,
            ),
            Input("megapixels", FLOAT, "Target total megapixels.", default=1.0, min=0.1, max=16.0, step=0.1),
            Input(
                "multiple",
                INT,
                "Round both sides to a multiple of this.",
                default=8,
                min=8,
                max=128,
                step=4,
                optional=True,
                extra={"advanced": True},
            ),
        ),
        outputs=(
            Output("width", INT, "The width in pixels."),
            Output("height", INT, "The height in pixels."),
        ),
    )

    def run(
        self, ctx: NodeContext, *, aspect_ratio: str, megapixels: float, multiple: int = 8
    ) -> tuple[int, int]:
        w_ratio, h_ratio = ratio_of(aspect_ratio)
        scale = math.sqrt(megapixels * 1024 * 1024 / (w_ratio * h_ratio))
        width = round(w_ratio * scale / multiple) * multiple
        height = round(h_ratio * scale / multiple) * multiple
        return max(width, multiple), max(height, multiple)


NODES = (ComfyMathExpression, ComfyNumberConvert, ComfyNotNode, ResolutionSelector)
