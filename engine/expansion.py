"""Node expansion: a node returns a sub-graph to run in its place (ComfyUI's ``expand``).

A node's :class:`engine.node.NodeOutput` may carry ``expand``, a graph in API format, and values
that are links ``[node_id, output_index]`` into that graph (or plain values). The executor adds
the graph's nodes to the running graph under the ids the graph gives them (:class:`GraphBuilder`
derives them from the parent's id, the call index and a counter, as ComfyUI does, so they are the
same on every run and their outputs are cached by content like any node), runs them, and then
resolves the parent's outputs to what the links point at.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from engine.context import Folders
from engine.graph import build_graph, links_of, topological_order
from engine.plan import Plan, PlannedNode, cache_key, with_defaults
from engine.registry import NodeRegistry
from engine.validate import validate_node

MAX_DEPTH = 1000  # how deep expansions may nest (a loop built by expansion nests once per turn)


class ExpansionError(ValueError):
    """An expansion the executor cannot run; the message names the parent node and the fix."""


def is_link(value: Any) -> bool:
    """ComfyUI's test: a two-item list of a node id (text) and an output index."""
    return (
        isinstance(value, list)
        and len(value) == 2
        and isinstance(value[0], str)
        and isinstance(value[1], int | float)
        and not isinstance(value[1], bool)
    )


@dataclass
class ExpandedNode:
    """One node of a graph being built: ``out(i)`` is the link to its output ``i``."""

    id: str
    class_type: str
    inputs: dict[str, Any]
    override_display_id: str | None = None

    def out(self, index: int) -> list[Any]:
        return [self.id, index]

    def set_input(self, key: str, value: Any) -> None:
        if value is None:
            self.inputs.pop(key, None)
        else:
            self.inputs[key] = value

    def get_input(self, key: str) -> Any:
        return self.inputs.get(key)

    def set_override_display_id(self, override_display_id: str | None) -> None:
        self.override_display_id = override_display_id

    def serialize(self) -> dict[str, Any]:
        node: dict[str, Any] = {"class_type": self.class_type, "inputs": self.inputs}
        if self.override_display_id is not None:
            node["override_display_id"] = self.override_display_id
        return node


class GraphBuilder:
    """Builds an expansion graph; every id gets ``prefix`` (native nodes: ``ctx.expansion_prefix()``)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.nodes: dict[str, ExpandedNode] = {}
        self.id_gen = 1

    def node(self, class_type: str, id: str | None = None, **inputs: Any) -> ExpandedNode:
        if id is None:
            id = str(self.id_gen)
            self.id_gen += 1
        full = self.prefix + id
        if full not in self.nodes:
            self.nodes[full] = ExpandedNode(full, class_type, dict(inputs))
        return self.nodes[full]

    def lookup_node(self, id: str) -> ExpandedNode | None:
        return self.nodes.get(self.prefix + id)

    def finalize(self) -> dict[str, Any]:
        return {node_id: node.serialize() for node_id, node in self.nodes.items()}

    def replace_node_output(self, node_id: str, index: int, new_value: Any) -> None:
        target = [self.prefix + node_id, index]
        for node in self.nodes.values():
            for key, value in list(node.inputs.items()):
                if is_link(value) and [value[0], value[1]] == target:
                    node.set_input(key, new_value)

    def remove_node(self, id: str) -> None:
        del self.nodes[self.prefix + id]


@dataclass
class Pending:
    """A parent waiting for its expansions: per call, ``(graph or None, values)``."""

    calls: list[tuple[Mapping[str, Any] | None, tuple[Any, ...]]]
    ui: dict[str, Any] | None = None


@dataclass
class Lineage:
    """Who expanded whom: ``parents`` and ``display`` (ComfyUI's DynamicPrompt bookkeeping)."""

    parents: dict[str, str] = field(default_factory=dict)
    display: dict[str, str] = field(default_factory=dict)

    def real_node_id(self, node_id: str) -> str:
        while node_id in self.parents:
            node_id = self.parents[node_id]
        return node_id

    def display_node_id(self, node_id: str) -> str:
        while node_id in self.display:
            node_id = self.display[node_id]
        return node_id

    def depth(self, node_id: str) -> int:
        depth = 0
        while node_id in self.parents:
            node_id = self.parents[node_id]
            depth += 1
        return depth


def plan_expansion(
    parent: str,
    parent_class: str,
    graph: Mapping[str, Any],
    running: Mapping[str, Mapping[str, Any]],
    registry: NodeRegistry,
    lineage: Lineage,
    linkable: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[PlannedNode]:
    """Validate ``graph`` (the expansion ``parent`` returned) against the registry and the running
    graph ``running`` (ids taken); its links may reach ``linkable`` (default: ``running``), the
    nodes of this run; record its nodes in ``lineage``; return them in the order they run."""
    who = f"node {parent} ({parent_class}) expanded into a sub-graph"
    if not isinstance(graph, Mapping):
        raise ExpansionError(f"{who}, but 'expand' is a {type(graph).__name__}; expected a dict of nodes")
    if lineage.depth(parent) + 1 > MAX_DEPTH:
        raise ExpansionError(
            f"{who} nested {MAX_DEPTH} levels deep (expansions inside expansions); Loom stops there. "
            "A node that expands must stop doing so (a loop's end condition, a recursion's base case)"
        )
    merged: dict[str, Mapping[str, Any]] = dict(running if linkable is None else linkable)
    for node_id, node in graph.items():
        node_id = str(node_id)
        if node_id in running:
            raise ExpansionError(
                f"{who} that adds node {node_id!r}, but the running graph already has a node with that id; "
                "ids in an expansion must be unique and deterministic: build it with "
                "comfy_execution.graph_utils.GraphBuilder"
            )
        merged[node_id] = node
    planned: dict[str, PlannedNode] = {}
    for node_id in graph:
        node_id = str(node_id)
        issues, constants = validate_node(node_id, merged, registry)
        if issues:
            found = "; ".join(
                f"{issue.message}: {issue.details}" if issue.details else issue.message for issue in issues
            )
            raise ExpansionError(f"{who} whose node {node_id!r} is invalid: {found}")
        node = merged[node_id]
        definition = registry.get(str(node["class_type"]))
        assert definition is not None, "validate_node checked the class"
        planned[node_id] = PlannedNode(
            node_id, definition, links_of(node), with_defaults(definition, constants)
        )
    try:
        order = topological_order(build_graph({k: merged[k] for k in planned}))
    except ValueError as exc:
        raise ExpansionError(f"{who} with a cycle: {exc}") from exc
    for node_id in order:
        lineage.parents[node_id] = parent
        override = graph[node_id].get("override_display_id") if isinstance(graph[node_id], Mapping) else None
        lineage.display[node_id] = str(override) if override is not None else parent
    return [planned[node_id] for node_id in order]


class RunState(Protocol):
    """What :func:`add_to_run` changes in the executor's per-run state."""

    plan: Plan
    nodes: dict[str, PlannedNode]
    keys: dict[str, str]
    order_index: dict[str, tuple[int, ...]]
    consumers: dict[str, int]
    expanding: dict[str, Pending]
    lineage: Lineage


def add_to_run(
    run: RunState, parent: str, pending: Pending, registry: NodeRegistry, folders: Folders
) -> list[str]:
    """Add the sub-graphs ``parent`` returned to ``run`` (its nodes sort after the parent's old
    place, the parent after them); return the nodes that must run: the sub-graphs' output nodes
    and what the parent's values link to."""
    running: dict[str, Any] = {n: {"class_type": p.class_type, "inputs": {}} for n, p in run.nodes.items()}
    class_type = run.nodes[parent].class_type
    needed: list[str] = []
    key = run.order_index[parent]
    for graph, values in pending.calls:
        if graph is None:
            continue
        taken = {**run.plan.prompt, **running}
        for planned in plan_expansion(parent, class_type, graph, taken, registry, run.lineage, running):
            node_id = planned.node_id
            running[node_id] = graph[node_id]
            run.nodes[node_id] = planned
            run.keys[node_id] = cache_key(planned, run.keys, folders)
            run.order_index[node_id] = (*key, len(run.order_index))
            for source in {link.source for link in planned.links.values()}:
                run.consumers[source] = run.consumers.get(source, 0) + 1
            if planned.definition.schema.output_node:
                needed.append(node_id)
        for value in values:
            if is_link(value) and str(value[0]) not in run.nodes:
                raise ExpansionError(
                    f"node {parent} ({class_type}) returned the link {value!r}, but its sub-graph has no node "
                    f"{value[0]!r}; return links to nodes of the graph in 'expand'"
                )
            if is_link(value):  # kept for the parent's resolution
                needed.append(str(value[0]))
                run.consumers[str(value[0])] = run.consumers.get(str(value[0]), 0) + 1
    run.order_index[parent] = (*key, len(run.order_index))
    run.expanding[parent] = pending
    return needed


def resolve(
    pending: Pending, outputs_are_lists: list[bool], results: Mapping[str, list[list[Any]]]
) -> list[list[Any]]:
    """The parent's outputs once its expansions ran: links become the items they point at."""
    outputs: list[list[Any]] = [[] for _ in outputs_are_lists]
    for graph, values in pending.calls:
        for slot, value in enumerate(values[: len(outputs)]):
            if graph is not None and is_link(value):
                outputs[slot].extend(results[str(value[0])][int(value[1])])
            elif outputs_are_lists[slot] and isinstance(value, list | tuple):
                outputs[slot].extend(value)
            else:
                outputs[slot].append(value)
    return outputs
