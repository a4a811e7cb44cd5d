"""Core utility nodes that need no model: primitives, string concatenation, preview of any value."""

from __future__ import annotations

import json
import sys
from typing import Any

from engine.context import NodeContext
from engine.node import Node, NodeOutput
from engine.schema import ANY, BOOLEAN, FLOAT, INT, STRING, Input, NodeSchema, Output

BIG = sys.maxsize


def _primitive(node_id: str, display: str, type_: str, value: Input) -> NodeSchema:
    return NodeSchema(
        node_id=node_id,
        display_name=display,
        category="utils/primitive",
        description=f"Outputs a constant {type_.lower()} value to feed several inputs from one place.",
        inputs=(value,),
        outputs=(Output(type_, type_, f"the {type_.lower()} value"),),
    )


class PrimitiveInt(Node):
    SCHEMA = _primitive(
        "PrimitiveInt",
        "Int",
        INT,
        Input("value", INT, "the integer", default=0, min=-BIG, max=BIG, control_after_generate=True),
    )

    def run(self, ctx: NodeContext, *, value: int) -> tuple[int]:
        return (value,)


class PrimitiveFloat(Node):
    SCHEMA = _primitive(
        "PrimitiveFloat",
        "Float",
        FLOAT,
        Input("value", FLOAT, "the number", default=0.0, min=-float(BIG), max=float(BIG)),
    )

    def run(self, ctx: NodeContext, *, value: float) -> tuple[float]:
        return (value,)


class PrimitiveString(Node):
    SCHEMA = _primitive("PrimitiveString", "String", STRING, Input("value", STRING, "the text", default=""))

    def run(self, ctx: NodeContext, *, value: str) -> tuple[str]:
        return (value,)


class PrimitiveStringMultiline(Node):
    SCHEMA = _primitive(
        "PrimitiveStringMultiline",
        "String (Multiline)",
        STRING,
        Input("value", STRING, "the text", default="", multiline=True),
    )

    def run(self, ctx: NodeContext, *, value: str) -> tuple[str]:
        return (value,)


class PrimitiveBoolean(Node):
    SCHEMA = _primitive(
        "PrimitiveBoolean", "Boolean", BOOLEAN, Input("value", BOOLEAN, "true or false", default=False)
    )

    def run(self, ctx: NodeContext, *, value: bool) -> tuple[bool]:
        return (value,)


class StringConcatenate(Node):
    SCHEMA = NodeSchema(
        node_id="StringConcatenate",
        display_name="Concatenate",
        category="utils/string",
        description="Joins two strings with a delimiter between them.",
        inputs=(
            Input("string_a", STRING, "the first string", default="", multiline=True),
            Input("string_b", STRING, "the second string", default="", multiline=True),
            Input("delimiter", STRING, "put between the two strings", default=""),
        ),
        outputs=(Output("STRING", STRING, "string_a + delimiter + string_b"),),
    )

    def run(self, ctx: NodeContext, *, string_a: str, string_b: str, delimiter: str) -> tuple[str]:
        return (delimiter.join([string_a, string_b]),)


def preview_text(value: Any) -> str:
    """A readable text form of any value: JSON for plain data, shapes for tensors."""
    shape = getattr(value, "shape", None)
    if shape is not None and hasattr(value, "dtype"):
        return f"{type(value).__name__} shape={list(shape)} dtype={value.dtype}"
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, indent=2, default=repr)
    except (TypeError, ValueError):
        return repr(value)


class PreviewAny(Node):
    SCHEMA = NodeSchema(
        node_id="PreviewAny",
        display_name="Preview Any",
        category="utils",
        description="Shows any value as text on the node.",
        inputs=(Input("source", ANY, "the value to show"),),
        outputs=(),
        output_node=True,
    )

    def run(self, ctx: NodeContext, *, source: Any) -> NodeOutput:
        return NodeOutput(values=(), ui={"text": [preview_text(source)]})


NODES: list[type[Node]] = [
    PrimitiveInt,
    PrimitiveFloat,
    PrimitiveString,
    PrimitiveStringMultiline,
    PrimitiveBoolean,
    StringConcatenate,
    PreviewAny,
]
