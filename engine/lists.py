"""ComfyUI's list semantics for one node call.

Every value travelling along a link is a list of items. A node that does not take lists
(``schema.input_is_list`` False) is called once per index, up to the longest input list, with
shorter lists repeating their last item. Outputs declared ``is_list`` are concatenated across the
calls; other outputs collect one item per call. UI outputs concatenate per key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engine.context import NodeContext
from engine.node import ExecutionBlocker, NodeDef


@dataclass
class NodeRun:
    node_def: NodeDef
    ctx: NodeContext
    inputs: dict[str, list[Any]]


@dataclass
class MappedResult:
    outputs: list[list[Any]]
    ui: dict[str, Any] | None
    # per call (graph or None, values) when some call returned an expansion (engine.expansion)
    expansions: list[tuple[Mapping[str, Any] | None, tuple[Any, ...]]] | None = None


def call_mapped(run: NodeRun) -> MappedResult:
    schema = run.node_def.schema
    n_out = len(schema.outputs)
    if schema.input_is_list:
        calls = [dict(run.inputs)]
    else:
        length = max((len(v) for v in run.inputs.values()), default=1)
        if any(len(v) == 0 for v in run.inputs.values()):
            length = 0
        calls = [{k: v[min(i, len(v) - 1)] for k, v in run.inputs.items()} for i in range(length)]
    outputs: list[list[Any]] = [[] for _ in range(n_out)]
    ui: dict[str, Any] | None = None
    calls_made: list[tuple[Mapping[str, Any] | None, tuple[Any, ...]]] = []
    for index, call in enumerate(calls):
        run.ctx.check_interrupt()
        run.ctx.call_index, run.ctx.graphs_built = index, 0
        result = run.node_def.execute(run.ctx, call)
        calls_made.append((result.expand, result.values))
        for slot, value in enumerate(result.values):
            if schema.outputs[slot].is_list:
                outputs[slot].extend(value if isinstance(value, list | tuple) else [value])
            else:
                outputs[slot].append(value)
        if result.ui:
            ui = {} if ui is None else ui
            for key, value in result.ui.items():
                if isinstance(value, list | tuple):
                    ui.setdefault(key, []).extend(value)
                else:
                    ui[key] = value
    if any(graph is not None for graph, _ in calls_made):
        return MappedResult(outputs, ui, calls_made)
    return MappedResult(outputs, ui)


def first_blocker(inputs: Mapping[str, list[Any]]) -> ExecutionBlocker | None:
    """The first :class:`ExecutionBlocker` among the inputs' items, if any."""
    for items in inputs.values():
        for item in items:
            if isinstance(item, ExecutionBlocker):
                return item
    return None
