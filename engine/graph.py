"""The workflow as a graph: links, deterministic topological order, cycles, needed subsets.

A workflow in API format maps node ids to ``{"class_type", "inputs"}``; an input whose value is
``[source_id, output_index]`` is a link. Order is Kahn's algorithm with ties broken by node id
(numeric ids in numeric order), so the same workflow always runs in the same order.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import networkx as nx

Prompt = Mapping[str, Mapping[str, Any]]


@dataclass(frozen=True)
class Link:
    source: str
    output_index: int


def as_link(value: Any) -> Link | None:
    """``[source_id, output_index]`` → Link; anything else → None (a constant)."""
    if (
        isinstance(value, list | tuple)
        and len(value) == 2
        and isinstance(value[0], str | int)
        and not isinstance(value[0], bool)
        and isinstance(value[1], int)
        and not isinstance(value[1], bool)
    ):
        return Link(str(value[0]), value[1])
    return None


def links_of(node: Mapping[str, Any]) -> dict[str, Link]:
    inputs = node.get("inputs") or {}
    found: dict[str, Link] = {}
    if isinstance(inputs, Mapping):
        for name, value in inputs.items():
            link = as_link(value)
            if link is not None:
                found[name] = link
    return found


def sort_key(node_id: str) -> tuple[int, int | str]:
    """Numeric ids first in numeric order, then other ids alphabetically."""
    return (0, int(node_id)) if node_id.isdigit() else (1, node_id)


def build_graph(prompt: Prompt) -> nx.DiGraph:
    """Edges run from producer to consumer; links to missing nodes are left out (validation reports them)."""
    graph = nx.DiGraph()
    graph.add_nodes_from(prompt)
    for node_id, node in prompt.items():
        for link in links_of(node).values():
            if link.source in prompt:
                graph.add_edge(link.source, node_id)
    return graph


def find_cycle(graph: nx.DiGraph, among: Iterable[str] | None = None) -> list[str]:
    """The nodes of one cycle (in order), or [] if the (sub)graph is acyclic."""
    sub = graph.subgraph(among) if among is not None else graph
    try:
        edges = nx.find_cycle(sub)
    except nx.NetworkXNoCycle:
        return []
    return [str(edge[0]) for edge in edges]


def topological_order(graph: nx.DiGraph, nodes: Iterable[str] | None = None) -> list[str]:
    """Deterministic topological order of ``nodes`` (default: all). Raises ValueError on a cycle."""
    sub = graph.subgraph(nodes) if nodes is not None else graph
    try:
        return list(nx.lexicographical_topological_sort(sub, key=sort_key))
    except nx.NetworkXUnfeasible as exc:
        cycle = find_cycle(sub)
        raise ValueError(f"the workflow has a dependency cycle through nodes {cycle}") from exc
