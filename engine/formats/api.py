"""ComfyUI's API format (what the engine executes): its checks and normalisation, the errors every
format reports, and the one test of "is this value a link"."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from engine.graph import as_link


class WorkflowFormatError(ValueError):
    """A workflow could not be read; the message is one line meant for the user."""


MAX_NODES = 10_000  # far above real workflows (hundreds of nodes); bounds conversion and validation time


class WorkflowTooLarge(WorkflowFormatError):
    """A workflow with more than :data:`MAX_NODES` nodes (counted while subgraphs expand)."""

    def __init__(self, count: int | None = None) -> None:
        found = f" (found {count})" if count is not None else " once its subgraphs are expanded"
        super().__init__(
            f"the workflow has more than {MAX_NODES} nodes{found}; Loom refuses workflows that "
            "large. Nested subgraphs multiply: check that no subgraph contains itself many times over"
        )


def check_node_count(count: int) -> None:
    if count > MAX_NODES:
        raise WorkflowTooLarge(count)


def is_link(value: Any) -> bool:
    """``[source_id, output_index]``: a link in API format (anything else is a constant)."""
    return as_link(value) is not None


def normalize_api(obj: Any) -> dict[str, Any]:
    """A checked, normalised copy of an API-format graph: string node ids, ``inputs`` always an
    object, links as ``[source_id: str, output_index: int]``. The argument is not modified."""
    if not isinstance(obj, Mapping) or not obj:
        raise WorkflowFormatError(
            f'expected an API-format workflow ({{id: {{"class_type", "inputs"}}}}); '
            f"found {json_kind(obj) if obj or not isinstance(obj, Mapping) else 'an empty object'}"
        )
    check_node_count(len(obj))
    ids = {str(k) for k in obj}
    out: dict[str, Any] = {}
    for raw_id, node in obj.items():
        node_id = str(raw_id)
        if not isinstance(node, Mapping):
            raise WorkflowFormatError(
                f'node {node_id!r}: expected an object with "class_type" and "inputs", '
                f"found {json_kind(node)}"
            )
        class_type = node.get("class_type")
        if not isinstance(class_type, str) or not class_type:
            raise WorkflowFormatError(
                f'node {node_id!r}: "class_type" must be a non-empty string, found {class_type!r:.60}'
            )
        inputs = node.get("inputs", {})
        if not isinstance(inputs, Mapping):
            raise WorkflowFormatError(
                f'node {node_id!r} ({class_type}): "inputs" must be an object, found {json_kind(inputs)}'
            )
        new_node = copy.deepcopy(dict(node))
        new_node["inputs"] = {str(name): _normalize_value(value, ids) for name, value in inputs.items()}
        meta = node.get("_meta")
        if meta is not None and not isinstance(meta, Mapping):
            raise WorkflowFormatError(
                f'node {node_id!r} ({class_type}): "_meta" must be an object, found {json_kind(meta)}'
            )
        out[node_id] = new_node
    return out


def _normalize_value(value: Any, ids: set[str]) -> Any:
    """A link written with an integer source id (``[4, 0]``) becomes ``["4", 0]``; a list value the
    frontend wrapped as ``{"__value__": [...]}`` (so it is not taken for a link) is unwrapped, as
    ComfyUI's server does."""
    if isinstance(value, Mapping) and set(value) == {"__value__"}:
        return copy.deepcopy(value["__value__"])
    if (
        isinstance(value, list)
        and len(value) == 2
        and isinstance(value[0], str | int)
        and not isinstance(value[0], bool)
        and isinstance(value[1], int)
        and not isinstance(value[1], bool)
        and str(value[0]) in ids
    ):
        return [str(value[0]), value[1]]
    return copy.deepcopy(value)


def json_kind(value: Any) -> str:
    names = {
        dict: "an object",
        list: "a list",
        str: "a string",
        bool: "a boolean",
        int: "a number",
        float: "a number",
        type(None): "null",
    }
    for kind, name in names.items():
        if isinstance(value, kind):
            return name
    if isinstance(value, Mapping):
        return "an object"
    return type(value).__name__


def some_keys(obj: Mapping[str, Any], limit: int = 5) -> str:
    keys = [repr(str(k)) for k in list(obj)[:limit]]
    return ", ".join(keys) + (", ..." if len(obj) > limit else "")
