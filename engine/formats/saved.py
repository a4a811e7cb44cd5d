"""Loom's saved format: the API graph plus the editor's layout, versioned and migrated on load."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from engine.formats.api import WorkflowFormatError, check_node_count, json_kind, normalize_api
from engine.formats.modes import apply_modes

SAVED_FORMAT_NAME = "loom.workflow"
SAVED_VERSION = 2


@dataclass(frozen=True)
class SavedWorkflow:
    """Loom's saved format, migrated to the current version."""

    prompt: dict[str, Any]
    layout: dict[str, Any]
    extra: dict[str, Any]
    loaded_version: int  # the version the file was written in (before migration)


def _migrate_v1(obj: dict[str, Any]) -> dict[str, Any]:
    """Version 1 → 2. Version 1 kept ``layout`` as ``{id: {"pos": {"x", "y"}, "size": {"width",
    "height"}, "title"?}}``, had no groups and no ``extra``."""
    nodes: dict[str, Any] = {}
    layout = obj.get("layout") or {}
    if not isinstance(layout, Mapping):
        raise WorkflowFormatError(
            f'saved format v1: "layout" must be an object ({{node id: {{"pos", "size"}}}}), found {json_kind(layout)}'
        )
    for node_id, entry in layout.items():
        if not isinstance(entry, Mapping):
            raise WorkflowFormatError(f"saved format v1: layout of node {node_id!r} must be an object")
        new: dict[str, Any] = {
            "pos": _v1_pair(entry, node_id, "pos", ("x", "y")),
            "size": _v1_pair(entry, node_id, "size", ("width", "height")),
        }
        if "title" in entry:
            new["title"] = entry["title"]
        nodes[str(node_id)] = new
    return {
        "format": SAVED_FORMAT_NAME,
        "version": 2,
        "prompt": obj.get("prompt"),
        "layout": {"nodes": nodes, "groups": []},
        "extra": {},
    }


def _v1_pair(entry: Mapping[str, Any], node_id: Any, key: str, names: tuple[str, str]) -> list[Any]:
    value = entry.get(key) or {}
    if not isinstance(value, Mapping):
        raise WorkflowFormatError(
            f'saved format v1: layout of node {node_id!r}: "{key}" must be an object '
            f'{{"{names[0]}", "{names[1]}"}}, found {json_kind(value)}'
        )
    return [value.get(names[0], 0), value.get(names[1], 0)]


# MIGRATIONS[n - 1] turns version n into version n + 1; the chain ends at SAVED_VERSION.
MIGRATIONS: tuple[Callable[[dict[str, Any]], dict[str, Any]], ...] = (_migrate_v1,)
assert len(MIGRATIONS) == SAVED_VERSION - 1


def migrate_saved(obj: Mapping[str, Any]) -> dict[str, Any]:
    """Bring a saved-format object of any known version up to :data:`SAVED_VERSION` (a copy)."""
    if obj.get("format") != SAVED_FORMAT_NAME:
        raise WorkflowFormatError(
            f'expected Loom\'s saved format ("format": {SAVED_FORMAT_NAME!r}), '
            f'found "format": {obj.get("format")!r}'
        )
    version = obj.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise WorkflowFormatError(
            f'saved format: "version" must be an integer from 1 to {SAVED_VERSION}, found {version!r}'
        )
    if version > SAVED_VERSION:
        raise WorkflowFormatError(
            f"saved format version {version} was written by a newer Loom; "
            f"this one reads versions 1 to {SAVED_VERSION}: upgrade Loom"
        )
    current = copy.deepcopy(dict(obj))
    for migrate in MIGRATIONS[version - 1 :]:
        current = migrate(current)
    return current


def to_saved(
    prompt: Mapping[str, Any], layout: Mapping[str, Any] | None = None, extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Loom's saved format (current version) for an API graph and an editor layout
    (``{"nodes": {id: {"pos", "size", ...}}, "groups": [...], ...}``)."""
    saved = {
        "format": SAVED_FORMAT_NAME,
        "version": SAVED_VERSION,
        "prompt": normalize_api(prompt),
        "layout": _check_layout(copy.deepcopy(dict(layout or {}))),
        "extra": copy.deepcopy(dict(extra or {})),
    }
    return saved


def from_saved(obj: Mapping[str, Any]) -> SavedWorkflow:
    """Read Loom's saved format (any version; older ones are migrated)."""
    if not isinstance(obj, Mapping):
        raise WorkflowFormatError(f"expected Loom's saved format (an object), found {json_kind(obj)}")
    loaded_version = obj.get("version")
    current = migrate_saved(obj)
    extra = current.get("extra") or {}
    if not isinstance(extra, Mapping):
        raise WorkflowFormatError(f'saved format: "extra" must be an object, found {json_kind(extra)}')
    layout = current.get("layout") or {}
    if not isinstance(layout, Mapping):
        raise WorkflowFormatError(
            f'saved format: "layout" must be an object ({{"nodes": {{...}}, "groups": [...]}}), '
            f"found {json_kind(layout)}"
        )
    return SavedWorkflow(
        prompt=normalize_api(current.get("prompt")),
        layout=_check_layout(dict(layout)),
        extra=dict(extra),
        loaded_version=int(loaded_version),  # type: ignore[arg-type]  # checked by migrate_saved
    )


def _check_layout(layout: dict[str, Any]) -> dict[str, Any]:
    nodes = layout.setdefault("nodes", {})
    groups = layout.setdefault("groups", [])
    if not isinstance(nodes, Mapping):
        raise WorkflowFormatError(f'saved format: layout "nodes" must be an object, found {json_kind(nodes)}')
    for node_id, entry in nodes.items():
        if not isinstance(entry, Mapping):
            raise WorkflowFormatError(f"saved format: layout of node {node_id!r} must be an object")
        for key, size in (("pos", 2), ("size", 2)):
            if key in entry and not _numbers(entry[key], size):
                raise WorkflowFormatError(
                    f'saved format: layout of node {node_id!r}: "{key}" must be '
                    f"[{size} numbers], found {entry[key]!r:.60}"
                )
        mode = entry.get("mode") or 0  # the editor writes it only when not 0
        if not isinstance(mode, int) or isinstance(mode, bool):
            raise WorkflowFormatError(
                f'saved format: layout of node {node_id!r}: "mode" must be 0 (runs), 2 (muted) or '
                f"4 (bypassed), found {mode!r:.60}"
            )
    layout["nodes"] = {str(k): v for k, v in nodes.items()}
    if not isinstance(groups, list):
        raise WorkflowFormatError(f'saved format: layout "groups" must be a list, found {json_kind(groups)}')
    for n, group in enumerate(groups):
        if not isinstance(group, Mapping) or not _numbers(group.get("bounding"), 4):
            raise WorkflowFormatError(
                f'saved format: group #{n} needs "bounding": [x, y, w, h], found {group!r:.60}'
            )
    subgraphs = layout.get("subgraphs")
    if subgraphs is not None and not (
        isinstance(subgraphs, list) and all(isinstance(d, Mapping) for d in subgraphs)
    ):
        raise WorkflowFormatError(
            f'saved format: layout "subgraphs" must be a list of subgraph definitions (objects), '
            f"found {subgraphs!r:.60}"
        )
    return layout


def _numbers(value: Any, count: int) -> bool:
    return (
        isinstance(value, list)
        and len(value) == count
        and all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)
    )


def saved_runnable(saved: SavedWorkflow, object_info: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The API graph a saved workflow runs. A graph holding subgraph instances runs the editor's
    flattened graph, which the editor writes next to it (``layout.runnable``: the instances'
    inner nodes as ``<instance id>:<inner id>``, exactly what it queues)."""
    definitions = {str(d.get("id")) for d in saved.layout.get("subgraphs") or []}  # checked by _check_layout
    instances = sorted(k for k, v in saved.prompt.items() if str(v.get("class_type")) in definitions)
    if not instances:
        return apply_modes(saved.prompt, saved.layout, object_info)
    runnable = saved.layout.get("runnable")
    if not isinstance(runnable, Mapping) or not runnable:
        raise WorkflowFormatError(
            f"saved format: nodes {', '.join(instances[:5])} are subgraph instances, but the "
            'file carries no flattened graph ("layout": {"runnable": ...}); open it in '
            "Loom's editor and save it again, or export it in ComfyUI's format"
        )
    flat = normalize_api(runnable)
    check_node_count(len(flat))
    return flat
