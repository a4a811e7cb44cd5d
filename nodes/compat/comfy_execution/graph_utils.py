"""Stand-in for ComfyUI's ``comfy_execution.graph_utils``: ``GraphBuilder``, ``is_link``,
``ExecutionBlocker``, ``add_graph_prefix``, answered by Loom's node expansion (``engine.expansion``).

``GraphBuilder()`` without a prefix takes ComfyUI's default, ``"{node}.{call}.{graph}."`` of the
node running on this thread, so the ids of an expansion are the same on every run. Loom loads a
fresh copy of this file per :class:`nodes.compat.shim.ComfyShim`; ``_binding`` is that copy's one
piece of state (the shim that knows the running node).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from engine.expansion import ExpandedNode, is_link
from engine.expansion import GraphBuilder as LoomGraphBuilder
from engine.node import ExecutionBlocker

if TYPE_CHECKING:
    from nodes.compat.shim import ComfyShim

_binding: ComfyShim | None = None

Node = ExpandedNode


def _bind(shim: ComfyShim) -> None:
    global _binding
    _binding = shim


class GraphBuilder(LoomGraphBuilder):
    """ComfyUI's ``GraphBuilder(prefix=None)``: ``node``, ``lookup_node``, ``finalize``, ..."""

    def __init__(self, prefix: str | None = None) -> None:
        super().__init__(prefix if prefix is not None else GraphBuilder.alloc_prefix())

    @classmethod
    def alloc_prefix(
        cls, root: str | None = None, call_index: int | None = None, graph_index: int | None = None
    ) -> str:
        ctx = _binding.running_context if _binding is not None else None
        if ctx is None:
            if root is None:
                raise RuntimeError(
                    "comfy_execution.graph_utils.GraphBuilder() without a prefix was made outside a running "
                    "node, so Loom cannot derive its ids from the node; pass a prefix: GraphBuilder('my_prefix.')"
                )
            return f"{root}.{call_index or 0}.{graph_index or 0}."
        default = ctx.expansion_prefix()
        if root is None and call_index is None and graph_index is None:
            return default
        parts = default.rstrip(".").rsplit(".", 2)
        chosen = (root, call_index, graph_index)
        return ".".join(str(c) if c is not None else p for c, p in zip(chosen, parts, strict=True)) + "."

    @classmethod
    def set_default_prefix(cls, prefix_root: str, call_index: int, graph_index: int = 0) -> None:
        """Accepted for ComfyUI's API; Loom sets the default itself from the running node."""


def add_graph_prefix(
    graph: dict[str, Any], outputs: tuple[Any, ...] | list[Any], prefix: str
) -> tuple[dict[str, Any], tuple[Any, ...]]:
    """ComfyUI's: the graph's ids and internal links (and the outputs' links) with ``prefix``."""
    new_graph: dict[str, Any] = {}
    for node_id, info in graph.items():
        inputs = {
            name: [prefix + value[0], value[1]] if is_link(value) else value
            for name, value in info.get("inputs", {}).items()
        }
        new_graph[prefix + node_id] = {"class_type": info["class_type"], "inputs": inputs}
    new_outputs = tuple([prefix + o[0], o[1]] if is_link(o) else o for o in outputs)
    return new_graph, new_outputs


__all__ = ["ExecutionBlocker", "GraphBuilder", "Node", "add_graph_prefix", "is_link"]
