"""Stub nodes for engine tests: no torch, every call recorded in ``ctx.settings.record["calls"]``."""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass, field
from typing import Any

from engine.context import Folders, NodeContext, RunSettings
from engine.node import ExecutionBlocker, Node, NodeOutput
from engine.schema import ANY, BOOLEAN, COMBO, FLOAT, INT, STRING, Input, NodeSchema, Output


def schema(
    node_id: str, inputs: tuple[Input, ...] = (), outputs: tuple[Output, ...] = (), **kw: Any
) -> NodeSchema:
    return NodeSchema(
        node_id=node_id,
        display_name=node_id,
        category="test",
        description=f"stub {node_id}",
        inputs=inputs,
        outputs=outputs,
        **kw,
    )


@dataclass(frozen=True)
class StubSettings(RunSettings):
    """Run settings with a scratch dict the stub nodes record into (calls, counters, events)."""

    record: dict[str, Any] = field(default_factory=dict)


def scratch(ctx: NodeContext) -> dict[str, Any]:
    settings = ctx.settings
    assert isinstance(settings, StubSettings), "stub nodes run under StubSettings"
    return settings.record


def record(ctx: NodeContext, what: str) -> None:
    scratch(ctx).setdefault("calls", []).append((ctx.node_id, what))


INT_OUT = (Output("INT", INT, "a number"),)


class Const(Node):
    SCHEMA = schema("Const", (Input("value", INT, "the number", default=0, min=-100, max=100),), INT_OUT)

    def run(self, ctx: NodeContext, *, value: int) -> tuple[int]:
        record(ctx, "Const")
        return (value,)


class Add(Node):
    SCHEMA = schema(
        "Add",
        (Input("a", INT, "left", force_input=True), Input("b", INT, "right", force_input=True)),
        INT_OUT,
    )

    def run(self, ctx: NodeContext, *, a: int, b: int) -> tuple[int]:
        record(ctx, "Add")
        return (a + b,)


class Show(Node):
    SCHEMA = schema("Show", (Input("value", ANY, "anything"),), (), output_node=True)

    def run(self, ctx: NodeContext, *, value: Any) -> NodeOutput:
        record(ctx, "Show")
        return NodeOutput(ui={"text": [str(value)]})


class Random(Node):
    SCHEMA = schema("Random", (), INT_OUT, not_idempotent=True)

    def run(self, ctx: NodeContext) -> tuple[int]:
        record(ctx, "Random")
        scratch(ctx)["random_counter"] = scratch(ctx).get("random_counter", 0) + 1
        return (scratch(ctx)["random_counter"],)


class ReadFile(Node):
    SCHEMA = schema(
        "ReadFile",
        (Input("name", STRING, "file in the input folder", default="a.txt"),),
        (Output("STRING", STRING, "its text"),),
    )

    @classmethod
    def fingerprint(cls, folders: Folders, **inputs: Any) -> Any:
        return hashlib.sha256((folders.input_dir / inputs["name"]).read_bytes()).hexdigest()

    def run(self, ctx: NodeContext, *, name: str) -> tuple[str]:
        record(ctx, "ReadFile")
        return ((ctx.folders.input_dir / name).read_text(),)


class Fail(Node):
    SCHEMA = schema("Fail", (Input("value", INT, "ignored", force_input=True),), INT_OUT)

    def run(self, ctx: NodeContext, *, value: int) -> tuple[int]:
        record(ctx, "Fail")
        raise ValueError("this node always fails")


class Slow(Node):
    """Loops with progress and interrupt checks; sets the scratch dict's 'slow_started' when running."""

    SCHEMA = schema("Slow", (Input("steps", INT, "loop count", default=50, min=1, max=10_000),), INT_OUT)

    def run(self, ctx: NodeContext, *, steps: int) -> tuple[int]:
        record(ctx, "Slow")
        started = scratch(ctx).get("slow_started")
        if isinstance(started, threading.Event):
            started.set()
        for i in range(steps):
            ctx.progress(i + 1, steps)
            threading.Event().wait(0.01)
        return (steps,)


class MakeList(Node):
    SCHEMA = schema(
        "MakeList",
        (Input("n", INT, "how many", default=3, min=0, max=100),),
        (Output("INT", INT, "0..n-1 as a list", is_list=True),),
    )

    def run(self, ctx: NodeContext, *, n: int) -> tuple[list[int]]:
        record(ctx, "MakeList")
        return (list(range(n)),)


class Double(Node):
    SCHEMA = schema("Double", (Input("value", INT, "x", force_input=True),), INT_OUT)

    def run(self, ctx: NodeContext, *, value: int) -> tuple[int]:
        record(ctx, "Double")
        return (value * 2,)


class SumList(Node):
    SCHEMA = schema(
        "SumList", (Input("values", INT, "numbers", force_input=True),), INT_OUT, input_is_list=True
    )

    def run(self, ctx: NodeContext, *, values: list[int]) -> tuple[int]:
        record(ctx, "SumList")
        return (sum(values),)


class Switch(Node):
    SCHEMA = schema(
        "Switch",
        (
            Input("choose", BOOLEAN, "which branch", default=True),
            Input("on_true", INT, "used when choose", lazy=True, force_input=True),
            Input("on_false", INT, "used otherwise", lazy=True, force_input=True),
        ),
        INT_OUT,
    )

    def check_lazy_status(self, ctx: NodeContext, **inputs: Any) -> list[str]:
        wanted = "on_true" if inputs["choose"] else "on_false"
        return [wanted] if inputs.get(wanted) is None else []

    def run(self, ctx: NodeContext, *, choose: bool, on_true: Any = None, on_false: Any = None) -> tuple[int]:
        record(ctx, "Switch")
        return (on_true if choose else on_false,)


class Gate(Node):
    SCHEMA = schema(
        "Gate",
        (
            Input("value", INT, "x", force_input=True),
            Input("open", BOOLEAN, "pass?", default=True),
            Input("message", STRING, "error when closed", default=""),
        ),
        INT_OUT,
    )

    def run(self, ctx: NodeContext, *, value: int, open: bool, message: str) -> tuple[Any]:
        record(ctx, "Gate")
        return (value if open else ExecutionBlocker(message or None),)


class Pick(Node):
    SCHEMA = schema(
        "Pick",
        (Input("choice", COMBO, "a letter", options=("a", "b"), default="a"),),
        (Output("STRING", STRING, "the letter"),),
    )

    def run(self, ctx: NodeContext, *, choice: str) -> tuple[str]:
        return (choice,)


class Ratio(Node):
    SCHEMA = schema(
        "Ratio",
        (Input("x", FLOAT, "between 0 and 1", default=0.5, min=0.0, max=1.0),),
        (Output("FLOAT", FLOAT, "x"),),
    )

    def run(self, ctx: NodeContext, *, x: float) -> tuple[float]:
        return (x,)


class Even(Node):
    SCHEMA = schema("Even", (Input("value", INT, "must be even", default=0),), INT_OUT)

    @classmethod
    def validate_inputs(cls, **inputs: Any) -> bool | str:
        return True if inputs.get("value", 0) % 2 == 0 else f"value must be even, got {inputs.get('value')}"

    def run(self, ctx: NodeContext, *, value: int) -> tuple[int]:
        return (value,)


class UseThing(Node):
    SCHEMA = schema(
        "UseThing", (Input("thing", "THING", "a custom type that only links can carry"),), INT_OUT
    )

    def run(self, ctx: NodeContext, *, thing: Any) -> tuple[int]:
        return (1,)


STUBS: list[type[Node]] = [
    Const,
    Add,
    Show,
    Random,
    ReadFile,
    Fail,
    Slow,
    MakeList,
    Double,
    SumList,
    Switch,
    Gate,
    Pick,
    Ratio,
    Even,
    UseThing,
]


class G:
    """A tiny workflow builder: ``g.add("Const", value=1)`` returns the node id; ``g.out(id)`` a link."""

    def __init__(self, start: int = 1) -> None:
        self.prompt: dict[str, Any] = {}
        self._next = start

    def add(self, class_type: str, _id: str | None = None, **inputs: Any) -> str:
        node_id = _id or str(self._next)
        self._next += 1
        self.prompt[node_id] = {"class_type": class_type, "inputs": inputs}
        return node_id

    @staticmethod
    def out(node_id: str, index: int = 0) -> list[Any]:
        return [node_id, index]
