"""A compatibility report for a workflow, before running it: every node type it uses that Loom
lacks (marked ComfyUI core or custom, with the pack that provides a custom one when the file
says: ``properties.cnr_id`` / ``aux_id``), and every conversion problem, all collected rather
than stopping at the first.

Used by ``python main.py check WF``, ``POST /api/v1/workflows/check`` and the editor's load path.
Only ``object_info`` is consulted (what Loom has); the list of ComfyUI's core node names is data
(``engine/plugins/comfyui_core_nodes.json``, its source named inside).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from engine.formats import (
    ConversionProblem,
    WorkflowFormatError,
    convert_ui_to_api,
    detect_format,
    from_saved,
    normalize_api,
    read_png_workflow,
)
from engine.formats.load import FORMAT_PNG_PROMPT, FORMAT_PNG_WORKFLOW, FORMAT_SAVED, FORMAT_UI
from engine.formats.saved import saved_runnable
from engine.formats.ui_parse import group_node_definitions, subgraph_definitions

CORE_NODES_FILE = Path(__file__).parent / "comfyui_core_nodes.json"
CORE_PACK_IDS = frozenset({"comfy-core"})
GROUP_NODE_PREFIXES = ("workflow>", "workflow/")


@lru_cache(maxsize=1)
def core_node_names() -> frozenset[str]:
    """ComfyUI's core node class names (read once from the shipped data file)."""
    data = json.loads(CORE_NODES_FILE.read_text(encoding="utf-8"))
    return frozenset(data["nodes"])


@lru_cache(maxsize=1)
def frontend_only_names() -> frozenset[str]:
    data = json.loads(CORE_NODES_FILE.read_text(encoding="utf-8"))
    return frozenset(data["frontend_only"])


@dataclass
class MissingNode:
    """A node type the workflow uses that Loom lacks."""

    class_type: str
    kind: str  # "core" (ComfyUI core) or "custom"
    pack: str | None = None  # the custom node pack, when the file names it
    repository: str | None = None  # aux_id, e.g. "ltdrdata/ComfyUI-Impact-Pack"
    node_ids: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "class_type": self.class_type,
            "kind": self.kind,
            "pack": self.pack,
            "repository": self.repository,
            "node_ids": self.node_ids,
        }

    def line(self) -> str:
        where = f"node{'s' if len(self.node_ids) > 1 else ''} {', '.join(self.node_ids)}"
        if self.kind == "core":
            return f"{self.class_type} (ComfyUI core node Loom does not have yet; {where})"
        source = self.pack or self.repository
        pack = (
            f"from the custom node pack {source}"
            + (f" ({self.repository})" if self.pack and self.repository else "")
            if source
            else "custom node, pack unknown"
        )
        return f"{self.class_type} ({pack}; {where})"


@dataclass
class CompatReport:
    """What ``check`` found. ``ok``: every node type is available and nothing blocks conversion."""

    source_format: str
    node_count: int = 0
    missing: list[MissingNode] = field(default_factory=list)
    problems: list[ConversionProblem] = field(default_factory=list)
    error: str | None = None  # the workflow could not be read or converted at all

    @property
    def ok(self) -> bool:
        return not self.missing and self.error is None

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "source_format": self.source_format,
            "node_count": self.node_count,
            "missing": [m.to_json() for m in self.missing],
            "missing_core": sum(m.kind == "core" for m in self.missing),
            "missing_custom": sum(m.kind == "custom" for m in self.missing),
            "problems": [p.to_json() for p in self.problems],
            "error": self.error,
        }

    def lines(self) -> list[str]:
        if self.error is not None:
            return [f"cannot read the workflow: {self.error}"]
        out = [
            f"{self.node_count} nodes ({self.source_format} format): "
            + (
                "every node type is available"
                if not self.missing
                else f"{len(self.missing)} node type(s) missing"
            )
        ]
        for kind, title in (("core", "missing ComfyUI core nodes:"), ("custom", "missing custom nodes:")):
            entries = [m for m in self.missing if m.kind == kind]
            if entries:
                out.append(title)
                out += [f"  {m.line()}" for m in entries]
        if self.problems:
            out.append("conversion problems:")
            out += [f"  [{p.level}] {p}" for p in self.problems]
        return out


# --- collecting node types --------------------------------------------------------------------
@dataclass(frozen=True)
class _Use:
    node_id: str
    class_type: str
    properties: Mapping[str, Any]


def _ui_uses(ui: Mapping[str, Any]) -> Iterator[_Use]:
    """Every node of a UI-format file: top level, subgraph definitions and group nodes, with the
    subgraph instances and group nodes themselves left out (their content is listed)."""
    subgraphs = subgraph_definitions(ui)  # each reader raises WorkflowFormatError naming the bad entry
    groups = group_node_definitions(ui)

    def walk(nodes: Any, prefix: str) -> Iterator[_Use]:
        for node in nodes if isinstance(nodes, list) else []:
            if not isinstance(node, Mapping) or not isinstance(node.get("type"), str):
                continue
            type_ = node["type"]
            if type_ in subgraphs or type_.startswith(GROUP_NODE_PREFIXES):
                continue
            props = node.get("properties")
            yield _Use(
                f"{prefix}{node.get('id', node.get('index', '?'))}",
                type_,
                props if isinstance(props, Mapping) else {},
            )

    yield from walk(ui.get("nodes"), "")
    for sub_id, sub in subgraphs.items():
        yield from walk(sub["nodes"], f"{sub.get('name') or sub_id}:")
    for name, group in groups.items():
        yield from walk(group.get("nodes"), f"{name}:")


def _api_uses(prompt: Mapping[str, Any]) -> Iterator[_Use]:
    for node_id, node in prompt.items():
        yield _Use(str(node_id), str(node.get("class_type")), {})


def _missing(uses: list[_Use], object_info: Mapping[str, Any]) -> list[MissingNode]:
    found: dict[str, MissingNode] = {}
    core, frontend = core_node_names(), frontend_only_names()
    for use in uses:
        if use.class_type in object_info or use.class_type in frontend:
            continue
        entry = found.get(use.class_type)
        if entry is None:
            pack, repo = use.properties.get("cnr_id"), use.properties.get("aux_id")
            is_core = use.class_type in core or pack in CORE_PACK_IDS
            entry = found[use.class_type] = MissingNode(
                use.class_type,
                "core" if is_core else "custom",
                None if is_core or not isinstance(pack, str) else pack,
                None if is_core or not isinstance(repo, str) else repo,
            )
        entry.node_ids.append(use.node_id)
    return sorted(found.values(), key=lambda m: (m.kind != "core", m.class_type))


# --- the report -------------------------------------------------------------------------------
def check_workflow(
    obj: Any, object_info: Mapping[str, Any], source_format: str | None = None
) -> CompatReport:
    """The report for an already-parsed workflow (API, Loom saved or ComfyUI UI format)."""
    try:
        kind = detect_format(obj)
    except WorkflowFormatError as exc:
        return CompatReport(source_format or "unknown", error=str(exc))
    report = CompatReport(source_format or kind)
    try:
        if kind == FORMAT_UI:
            uses = list(_ui_uses(obj))
            report.missing = _missing(uses, object_info)
            convert_ui_to_api(obj, object_info, report.problems)
        elif kind == FORMAT_SAVED:
            saved = from_saved(obj)
            uses = list(_api_uses(saved.prompt))
            report.missing = _missing(uses, object_info)
            saved_runnable(saved, object_info)  # what would run (modes applied): raises what blocks it
        else:
            uses = list(_api_uses(normalize_api(obj)))
            report.missing = _missing(uses, object_info)
    except WorkflowFormatError as exc:
        report.error = str(exc)
        return report
    except RecursionError:
        report.error = "the workflow is nested too deeply"
        return report
    frontend = frontend_only_names()
    report.node_count = sum(u.class_type not in frontend for u in uses)
    return report


def check_file(path: str | Path, object_info: Mapping[str, Any]) -> CompatReport:
    """The report for a workflow file: JSON of any format, or a PNG with ComfyUI's text chunks
    (its editor workflow when present, else its API prompt)."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        return CompatReport("unknown", error=f"cannot read {path}: {exc.strerror or exc}")
    if data.startswith(b"\x89PNG"):
        try:
            png = read_png_workflow(data)
        except WorkflowFormatError as exc:
            return CompatReport(FORMAT_PNG_WORKFLOW, error=str(exc))
        if png.workflow is not None:
            return check_workflow(png.workflow, object_info, FORMAT_PNG_WORKFLOW)
        if png.prompt is not None:
            return check_workflow(png.prompt, object_info, FORMAT_PNG_PROMPT)
        return CompatReport(FORMAT_PNG_WORKFLOW, error=f"{path.name} carries no ComfyUI workflow or prompt")
    try:
        obj = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        return CompatReport("unknown", error=f"{path.name} is not JSON ({exc})")
    return check_workflow(obj, object_info)
