"""Node expansion in the executor: a node returns a sub-graph that runs in its place."""

from __future__ import annotations

from pathlib import Path

from engine.context import NodeContext
from engine.events import Executed, Executing, ExecutionError
from engine.expansion import MAX_DEPTH, GraphBuilder
from engine.node import Node, NodeOutput
from engine.registry import NodeRegistry
from engine.schema import INT, Input
from tests.engine.conftest import Harness
from tests.engine.stub_nodes import INT_OUT, STUBS, G, record, schema


class AddThree(Node):
    """Expands into Const(value) + Const(3) -> Add, and shows the sum through an expanded Show."""

    SCHEMA = schema("AddThree", (Input("value", INT, "the number", default=0, min=-100, max=100),), INT_OUT)

    def run(self, ctx: NodeContext, *, value: int) -> NodeOutput:
        record(ctx, "AddThree")
        graph = GraphBuilder(ctx.expansion_prefix())
        left, three = graph.node("Const", value=value), graph.node("Const", value=3)
        total = graph.node("Add", a=left.out(0), b=three.out(0))
        graph.node("Show", value=total.out(0))
        return NodeOutput((total.out(0),), expand=graph.finalize())


class AddSix(Node):
    """Expands into two AddThree nodes (nested expansion)."""

    SCHEMA = schema("AddSix", (Input("value", INT, "the number", default=0, min=-100, max=100),), INT_OUT)

    def run(self, ctx: NodeContext, *, value: int) -> NodeOutput:
        graph = GraphBuilder(ctx.expansion_prefix())
        first = graph.node("AddThree", value=value)
        show = graph.node("ShowInt", value=first.out(0))
        return NodeOutput((show.out(0),), expand=graph.finalize())


class ShowInt(Node):
    """Passes an int through (so AddSix can feed a linked int into a second AddThree)."""

    SCHEMA = schema("ShowInt", (Input("value", INT, "the number", force_input=True),), INT_OUT)

    def run(self, ctx: NodeContext, *, value: int) -> NodeOutput:
        graph = GraphBuilder(ctx.expansion_prefix())
        again = graph.node("AddThree", value=value)
        return NodeOutput((again.out(0),), expand=graph.finalize())


class Unknown(Node):
    SCHEMA = schema("Unknown", (), INT_OUT)

    def run(self, ctx: NodeContext) -> NodeOutput:
        graph = GraphBuilder(ctx.expansion_prefix())
        return NodeOutput((graph.node("NoSuchNode").out(0),), expand=graph.finalize())


class Forever(Node):
    SCHEMA = schema("Forever", (), INT_OUT)

    def run(self, ctx: NodeContext) -> NodeOutput:
        graph = GraphBuilder(ctx.expansion_prefix())
        return NodeOutput((graph.node("Forever").out(0),), expand=graph.finalize())


class FailInside(Node):
    SCHEMA = schema("FailInside", (), INT_OUT)

    def run(self, ctx: NodeContext) -> NodeOutput:
        graph = GraphBuilder(ctx.expansion_prefix())
        return NodeOutput((graph.node("Fail", value=1).out(0),), expand=graph.finalize())


class BadLink(Node):
    SCHEMA = schema("BadLink", (), INT_OUT)

    def run(self, ctx: NodeContext) -> NodeOutput:
        graph = GraphBuilder(ctx.expansion_prefix())
        graph.node("Const", value=1)
        return NodeOutput((["elsewhere", 0],), expand=graph.finalize())


class AddToLinked(Node):
    """Expands into Add(a=<the workflow node linked to its input>, b=Const(10))."""

    SCHEMA = schema("AddToLinked", (Input("source", INT, "the number", force_input=True),), INT_OUT)

    def run(self, ctx: NodeContext, *, source: int) -> NodeOutput:
        graph = GraphBuilder(ctx.expansion_prefix())
        ten = graph.node("Const", value=10)
        total = graph.node("Add", a=["1", 0], b=ten.out(0))  # node 1 of the workflow
        return NodeOutput((total.out(0),), expand=graph.finalize())


def harness(tmp_path: Path) -> Harness:
    registry = NodeRegistry()
    registry.register_all(
        [*STUBS, AddThree, AddSix, ShowInt, Unknown, Forever, FailInside, BadLink, AddToLinked]
    )
    return Harness(tmp_path, registry=registry)


def test_the_expanded_nodes_run_and_the_parent_outputs_what_they_link_to(tmp_path: Path) -> None:
    h = harness(tmp_path)
    g = G()
    node = g.add("AddThree", value=4)
    g.add("Show", value=g.out(node))
    result = h.run(g.prompt)
    assert result.status == "success", result.error
    assert result.outputs["2"] == {"text": ["7"]}
    # ComfyUI's ids: "{parent}.{call}.{graph}.{n}"
    assert {"1.0.0.1", "1.0.0.2", "1.0.0.3", "1.0.0.4"} <= set(result.executed)
    assert result.outputs["1.0.0.4"] == {"text": ["7"]}  # the expansion's own output node ran


def test_the_result_equals_running_the_nodes_directly(tmp_path: Path) -> None:
    h = harness(tmp_path)
    g = G()
    a, b = g.add("Const", value=4), g.add("Const", value=3)
    g.add("Show", value=g.out(g.add("Add", a=g.out(a), b=g.out(b))))
    direct = h.run(g.prompt)
    expanded = harness(tmp_path / "x").run(
        {
            "1": {"class_type": "AddThree", "inputs": {"value": 4}},
            "2": {"class_type": "Show", "inputs": {"value": ["1", 0]}},
        }
    )
    assert direct.outputs["4"] == expanded.outputs["2"] == {"text": ["7"]}


def test_a_second_run_reuses_the_cached_results(tmp_path: Path) -> None:
    h = harness(tmp_path)
    prompt = {
        "1": {"class_type": "AddThree", "inputs": {"value": 4}},
        "2": {"class_type": "Show", "inputs": {"value": ["1", 0]}},
    }
    first = h.run(prompt)
    assert "1.0.0.3" in first.executed
    second = h.run(prompt)
    assert second.status == "success"
    assert h.ran() == set() and "1" in second.cached and second.outputs["2"] == {"text": ["7"]}
    prompt["1"]["inputs"]["value"] = 5  # the parent runs again; the expanded Const(3) is a cache hit
    third = h.run(prompt)
    assert third.outputs["2"] == {"text": ["8"]}
    assert "1.0.0.2" not in third.executed and "1.0.0.1" in third.executed


def test_nested_expansion(tmp_path: Path) -> None:
    h = harness(tmp_path)
    prompt = {
        "1": {"class_type": "AddSix", "inputs": {"value": 1}},
        "2": {"class_type": "Show", "inputs": {"value": ["1", 0]}},
    }
    result = h.run(prompt)
    assert result.status == "success", result.error
    assert result.outputs["2"] == {"text": ["7"]}
    assert "1.0.0.1.0.0.3" in result.executed  # AddThree inside AddSix
    executing = [e for e in h.events if isinstance(e, Executing) and e.node == "1.0.0.1.0.0.3"]
    assert executing and executing[0].data()["display_node"] == "1"


def test_events_name_the_display_node(tmp_path: Path) -> None:
    h = harness(tmp_path)
    h.run(
        {
            "5": {"class_type": "AddThree", "inputs": {"value": 1}},
            "6": {"class_type": "Show", "inputs": {"value": ["5", 0]}},
        }
    )
    executed = [e.data() for e in h.events if isinstance(e, Executed)]
    assert {"node": "5.0.0.4", "display_node": "5", "output": {"text": ["4"]}} == {
        k: executed[0][k] for k in ("node", "display_node", "output")
    }


def test_an_unknown_class_in_an_expansion_names_the_parent(tmp_path: Path) -> None:
    h = harness(tmp_path)
    result = h.run(
        {
            "9": {"class_type": "Unknown", "inputs": {}},
            "2": {"class_type": "Show", "inputs": {"value": ["9", 0]}},
        }
    )
    assert result.status == "error"
    assert result.error is not None and result.error["node_id"] == "9"
    message = result.error["exception_message"]
    assert "node 9 (Unknown) expanded into a sub-graph" in message and "NoSuchNode" in message


def test_a_failure_inside_an_expansion_is_reported_on_the_workflow_node(tmp_path: Path) -> None:
    h = harness(tmp_path)
    result = h.run(
        {
            "3": {"class_type": "FailInside", "inputs": {}},
            "2": {"class_type": "Show", "inputs": {"value": ["3", 0]}},
        }
    )
    assert result.status == "error" and result.error is not None
    assert result.error["node_id"] == "3"
    assert "inside the sub-graph node 3 expanded into" in result.error["exception_message"]
    assert any(isinstance(e, ExecutionError) for e in h.events)


def test_endless_expansion_stops_with_a_teaching_error(tmp_path: Path) -> None:
    h = harness(tmp_path)
    result = h.run(
        {
            "1": {"class_type": "Forever", "inputs": {}},
            "2": {"class_type": "Show", "inputs": {"value": ["1", 0]}},
        }
    )
    assert result.status == "error" and result.error is not None
    assert f"nested {MAX_DEPTH} levels deep" in result.error["exception_message"]
    assert result.error["node_id"] == "1"


def test_a_result_linking_outside_the_sub_graph_is_refused(tmp_path: Path) -> None:
    result = harness(tmp_path).run(
        {
            "1": {"class_type": "BadLink", "inputs": {}},
            "2": {"class_type": "Show", "inputs": {"value": ["1", 0]}},
        }
    )
    assert result.status == "error" and result.error is not None
    assert "its sub-graph has no node 'elsewhere'" in result.error["exception_message"]


def test_an_expansion_may_link_to_a_workflow_node(tmp_path: Path) -> None:
    prompt = {
        "1": {"class_type": "Const", "inputs": {"value": 5}},
        "2": {"class_type": "AddToLinked", "inputs": {"source": ["1", 0]}},
        "3": {"class_type": "Show", "inputs": {"value": ["2", 0]}},
    }
    result = harness(tmp_path).run(prompt)
    assert result.status == "success", result.error
    assert result.outputs["3"] == {"text": ["15"]}
