"""Workflow formats: ComfyUI's API format (what the engine executes), Loom's saved format (API
graph plus editor layout, versioned, migrated on load), ComfyUI's UI format (converted to API
format by :mod:`engine.workflow_ui`), and the ``prompt``/``workflow`` text chunks of PNG files.

Everything a user can hand us goes through :func:`load_workflow` / :func:`load_workflow_file`;
whatever is wrong with it comes back as one :class:`WorkflowFormatError` line saying what was
expected and what was found, never a traceback.
"""

from __future__ import annotations

import copy
import io
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FORMAT_API = "api"
FORMAT_SAVED = "loom"
FORMAT_UI = "ui"
FORMAT_PNG_PROMPT = "png-prompt"
FORMAT_PNG_WORKFLOW = "png-workflow"

SAVED_FORMAT_NAME = "loom.workflow"
SAVED_VERSION = 2
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

_EXPECTED = (
    "expected ComfyUI API format ({id: {\"class_type\", \"inputs\"}}), Loom's saved format "
    "({\"format\": \"loom.workflow\", ...}) or ComfyUI UI format (an object with \"nodes\" and \"links\" lists)"
)


class WorkflowFormatError(ValueError):
    """A workflow could not be read; the message is one line meant for the user."""


MAX_NODES = 10_000  # far above real workflows (hundreds of nodes); bounds conversion and validation time


class WorkflowTooLarge(WorkflowFormatError):
    """A workflow with more than :data:`MAX_NODES` nodes (counted while subgraphs expand)."""

    def __init__(self, count: int | None = None) -> None:
        found = f" (found {count})" if count is not None else " once its subgraphs are expanded"
        super().__init__(f"the workflow has more than {MAX_NODES} nodes{found}; Loom refuses workflows that "
                         "large. Nested subgraphs multiply: check that no subgraph contains itself many times over")


def check_node_count(count: int) -> None:
    if count > MAX_NODES:
        raise WorkflowTooLarge(count)


@dataclass(frozen=True)
class SavedWorkflow:
    """Loom's saved format, migrated to the current version."""

    prompt: dict[str, Any]
    layout: dict[str, Any]
    extra: dict[str, Any]
    loaded_version: int  # the version the file was written in (before migration)


@dataclass(frozen=True)
class PngWorkflow:
    """The ``prompt`` (API) and ``workflow`` (editor) JSON a PNG carries; None where absent."""

    prompt: dict[str, Any] | None
    workflow: dict[str, Any] | None


@dataclass(frozen=True)
class LoadedWorkflow:
    """A workflow ready for validation: the API-format ``prompt``, the editor JSON it came with
    (UI format or Loom's saved format; None for plain API files), and where it came from
    (``api``, ``loom``, ``ui``, ``png-prompt`` or ``png-workflow``)."""

    prompt: dict[str, Any]
    workflow: dict[str, Any] | None
    source_format: str


# --- format detection and API format ----------------------------------------------------------
def detect_format(obj: Any) -> str:
    """``"api"``, ``"loom"`` or ``"ui"``; anything else raises :class:`WorkflowFormatError`."""
    if not isinstance(obj, Mapping):
        raise WorkflowFormatError(f"{_EXPECTED}; found {_json_kind(obj)}")
    if obj.get("format") == SAVED_FORMAT_NAME:
        return FORMAT_SAVED
    if isinstance(obj.get("format"), str):  # never an API node (those are objects)
        raise WorkflowFormatError(f"unknown workflow format {obj['format']!r}; expected {SAVED_FORMAT_NAME!r} "
                                  "for a saved workflow")
    if isinstance(obj.get("nodes"), list) and isinstance(obj.get("links"), list):
        return FORMAT_UI
    if not obj:
        raise WorkflowFormatError(f"the workflow is an empty object; {_EXPECTED}")
    if all(isinstance(v, Mapping) and "class_type" in v for v in obj.values()):
        return FORMAT_API
    if any(isinstance(v, Mapping) and "class_type" in v for v in obj.values()):
        bad = next(k for k, v in obj.items() if not (isinstance(v, Mapping) and "class_type" in v))
        raise WorkflowFormatError(
            f"API-format workflow: node {bad!r} should be an object with \"class_type\" and \"inputs\", "
            f"found {_json_kind(obj[bad])}"
        )
    if isinstance(obj.get("nodes"), list):
        raise WorkflowFormatError(f"UI-format workflow without a \"links\" list; {_EXPECTED}")
    if isinstance(obj.get("prompt"), Mapping):
        raise WorkflowFormatError(
            f"{_EXPECTED}; found an object with a \"prompt\" key (a /prompt request body?): "
            "save only the value of \"prompt\""
        )
    raise WorkflowFormatError(f"{_EXPECTED}; found an object with keys {_some_keys(obj)}")


def normalize_api(obj: Any) -> dict[str, Any]:
    """A checked, normalised copy of an API-format graph: string node ids, ``inputs`` always an
    object, links as ``[source_id: str, output_index: int]``. The argument is not modified."""
    if not isinstance(obj, Mapping) or not obj:
        raise WorkflowFormatError(f"expected an API-format workflow ({{id: {{\"class_type\", \"inputs\"}}}}); "
                                  f"found {_json_kind(obj) if obj or not isinstance(obj, Mapping) else 'an empty object'}")
    check_node_count(len(obj))
    ids = {str(k) for k in obj}
    out: dict[str, Any] = {}
    for raw_id, node in obj.items():
        node_id = str(raw_id)
        if not isinstance(node, Mapping):
            raise WorkflowFormatError(f"node {node_id!r}: expected an object with \"class_type\" and \"inputs\", "
                                      f"found {_json_kind(node)}")
        class_type = node.get("class_type")
        if not isinstance(class_type, str) or not class_type:
            raise WorkflowFormatError(f"node {node_id!r}: \"class_type\" must be a non-empty string, "
                                      f"found {class_type!r:.60}")
        inputs = node.get("inputs", {})
        if not isinstance(inputs, Mapping):
            raise WorkflowFormatError(f"node {node_id!r} ({class_type}): \"inputs\" must be an object, "
                                      f"found {_json_kind(inputs)}")
        new_node = copy.deepcopy(dict(node))
        new_node["inputs"] = {str(name): _normalize_value(value, ids) for name, value in inputs.items()}
        meta = node.get("_meta")
        if meta is not None and not isinstance(meta, Mapping):
            raise WorkflowFormatError(f"node {node_id!r} ({class_type}): \"_meta\" must be an object, "
                                      f"found {_json_kind(meta)}")
        out[node_id] = new_node
    return out


def _normalize_value(value: Any, ids: set[str]) -> Any:
    """A link written with an integer source id (``[4, 0]``) becomes ``["4", 0]``; a list value the
    frontend wrapped as ``{"__value__": [...]}`` (so it is not taken for a link) is unwrapped, as
    ComfyUI's server does."""
    if isinstance(value, Mapping) and set(value) == {"__value__"}:
        return copy.deepcopy(value["__value__"])
    if (
        isinstance(value, list) and len(value) == 2
        and isinstance(value[0], str | int) and not isinstance(value[0], bool)
        and isinstance(value[1], int) and not isinstance(value[1], bool)
        and str(value[0]) in ids
    ):
        return [str(value[0]), value[1]]
    return copy.deepcopy(value)


# --- Loom's saved format ----------------------------------------------------------------------
def _migrate_v1(obj: dict[str, Any]) -> dict[str, Any]:
    """Version 1 → 2. Version 1 kept ``layout`` as ``{id: {"pos": {"x", "y"}, "size": {"width",
    "height"}, "title"?}}``, had no groups and no ``extra``."""
    nodes: dict[str, Any] = {}
    for node_id, entry in (obj.get("layout") or {}).items():
        if not isinstance(entry, Mapping):
            raise WorkflowFormatError(f"saved format v1: layout of node {node_id!r} must be an object")
        pos = entry.get("pos") or {}
        size = entry.get("size") or {}
        new: dict[str, Any] = {
            "pos": [pos.get("x", 0), pos.get("y", 0)],
            "size": [size.get("width", 0), size.get("height", 0)],
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


# MIGRATIONS[n - 1] turns version n into version n + 1; the chain ends at SAVED_VERSION.
MIGRATIONS: tuple[Callable[[dict[str, Any]], dict[str, Any]], ...] = (_migrate_v1,)
assert len(MIGRATIONS) == SAVED_VERSION - 1


def migrate_saved(obj: Mapping[str, Any]) -> dict[str, Any]:
    """Bring a saved-format object of any known version up to :data:`SAVED_VERSION` (a copy)."""
    if obj.get("format") != SAVED_FORMAT_NAME:
        raise WorkflowFormatError(f"expected Loom's saved format (\"format\": {SAVED_FORMAT_NAME!r}), "
                                  f"found \"format\": {obj.get('format')!r}")
    version = obj.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise WorkflowFormatError(f"saved format: \"version\" must be an integer from 1 to {SAVED_VERSION}, "
                                  f"found {version!r}")
    if version > SAVED_VERSION:
        raise WorkflowFormatError(f"saved format version {version} was written by a newer Loom; "
                                  f"this one reads versions 1 to {SAVED_VERSION}: upgrade Loom")
    current = copy.deepcopy(dict(obj))
    for migrate in MIGRATIONS[version - 1:]:
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
        raise WorkflowFormatError(f"expected Loom's saved format (an object), found {_json_kind(obj)}")
    loaded_version = obj.get("version")
    current = migrate_saved(obj)
    extra = current.get("extra") or {}
    if not isinstance(extra, Mapping):
        raise WorkflowFormatError(f"saved format: \"extra\" must be an object, found {_json_kind(extra)}")
    return SavedWorkflow(
        prompt=normalize_api(current.get("prompt")),
        layout=_check_layout(dict(current.get("layout") or {})),
        extra=dict(extra),
        loaded_version=int(loaded_version),  # type: ignore[arg-type]  # checked by migrate_saved
    )


def _check_layout(layout: dict[str, Any]) -> dict[str, Any]:
    nodes = layout.setdefault("nodes", {})
    groups = layout.setdefault("groups", [])
    if not isinstance(nodes, Mapping):
        raise WorkflowFormatError(f"saved format: layout \"nodes\" must be an object, found {_json_kind(nodes)}")
    for node_id, entry in nodes.items():
        if not isinstance(entry, Mapping):
            raise WorkflowFormatError(f"saved format: layout of node {node_id!r} must be an object")
        for key, size in (("pos", 2), ("size", 2)):
            if key in entry and not _numbers(entry[key], size):
                raise WorkflowFormatError(f"saved format: layout of node {node_id!r}: \"{key}\" must be "
                                          f"[{size} numbers], found {entry[key]!r:.60}")
    layout["nodes"] = {str(k): v for k, v in nodes.items()}
    if not isinstance(groups, list):
        raise WorkflowFormatError(f"saved format: layout \"groups\" must be a list, found {_json_kind(groups)}")
    for n, group in enumerate(groups):
        if not isinstance(group, Mapping) or not _numbers(group.get("bounding"), 4):
            raise WorkflowFormatError(f"saved format: group #{n} needs \"bounding\": [x, y, w, h], "
                                      f"found {group!r:.60}")
    return layout


def _numbers(value: Any, count: int) -> bool:
    return (isinstance(value, list) and len(value) == count
            and all(isinstance(v, int | float) and not isinstance(v, bool) for v in value))


# --- node modes of the saved format (as ComfyUI: 2 = muted, 4 = bypassed) ---------------------
MODE_MUTED = 2
MODE_BYPASSED = 4


def apply_modes(
    prompt: Mapping[str, Any], layout: Mapping[str, Any], object_info: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any]:
    """The graph that runs: muted nodes dropped (inputs reading them removed); a bypassed node's
    consumers read the bypassed node's first linked input of the output's type instead."""
    modes = {str(k): v.get("mode", 0) for k, v in (layout.get("nodes") or {}).items() if isinstance(v, Mapping)}
    muted = {n for n, m in modes.items() if m == MODE_MUTED and n in prompt}
    bypassed = {n for n, m in modes.items() if m == MODE_BYPASSED and n in prompt}
    if not muted and not bypassed:
        return dict(prompt)
    runnable = {k: copy.deepcopy(dict(v)) for k, v in prompt.items() if k not in muted and k not in bypassed}
    for node in runnable.values():
        inputs = node.get("inputs") or {}
        for name in list(inputs):
            value = inputs[name]
            if _is_link(value):
                target = _through_bypass(prompt, value, muted, bypassed, object_info)
                if target is None:
                    del inputs[name]
                else:
                    inputs[name] = target
    return runnable


def saved_runnable(saved: SavedWorkflow, object_info: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The API graph a saved workflow runs. A graph holding subgraph instances runs the editor's
    flattened graph, which the editor writes next to it (``layout.runnable``: the instances'
    inner nodes as ``<instance id>:<inner id>``, exactly what it queues)."""
    definitions = {str(d.get("id")) for d in saved.layout.get("subgraphs") or [] if isinstance(d, Mapping)}
    instances = sorted(k for k, v in saved.prompt.items() if str(v.get("class_type")) in definitions)
    if not instances:
        return apply_modes(saved.prompt, saved.layout, object_info)
    runnable = saved.layout.get("runnable")
    if not isinstance(runnable, Mapping) or not runnable:
        raise WorkflowFormatError(f"saved format: nodes {', '.join(instances[:5])} are subgraph instances, but the "
                                  "file carries no flattened graph (\"layout\": {\"runnable\": ...}); open it in "
                                  "Loom's editor and save it again, or export it in ComfyUI's format")
    flat = normalize_api(runnable)
    check_node_count(len(flat))
    return flat


def _is_link(value: Any) -> bool:
    return isinstance(value, list) and len(value) == 2 and isinstance(value[0], str) and isinstance(value[1], int)


def _through_bypass(
    prompt: Mapping[str, Any], link: list[Any], muted: set[str], bypassed: set[str],
    object_info: Mapping[str, Mapping[str, Any]],
) -> list[Any] | None:
    seen: set[str] = set()
    while link[0] in bypassed and link[0] not in seen:
        source = link[0]
        seen.add(source)
        node = prompt[source]
        info = object_info.get(str(node.get("class_type"))) or {}
        outputs = info.get("output") or []
        wanted = outputs[link[1]] if link[1] < len(outputs) else "*"
        declared = {**(info.get("input") or {}).get("required", {}), **(info.get("input") or {}).get("optional", {})}
        links = [(n, v) for n, v in (node.get("inputs") or {}).items() if _is_link(v)]
        ordered = links[link[1]:link[1] + 1] + links
        passed = next((v for n, v in ordered
                       if "*" in (_type_name(declared.get(n)), wanted) or _type_name(declared.get(n)) == wanted), None)
        if passed is None:
            return None
        link = passed
    if link[0] in muted or link[0] in seen:
        return None
    return list(link)


def _type_name(spec: Any) -> str:
    return spec[0] if isinstance(spec, list | tuple) and spec and isinstance(spec[0], str) else "?"


# --- UI format (see engine.workflow_ui) -------------------------------------------------------
def convert_ui_to_api(
    ui: Mapping[str, Any], object_info: Mapping[str, Mapping[str, Any]], problems: list[Any] | None = None
) -> dict[str, Any]:
    """ComfyUI UI format → API format; see :func:`engine.workflow_ui.convert_ui_to_api` (``problems``
    collects :class:`engine.workflow_widgets.ConversionProblem` entries)."""
    from engine.workflow_ui import convert_ui_to_api as convert

    return convert(ui, object_info, problems)


# --- PNG text chunks --------------------------------------------------------------------------
def read_png_workflow(source: str | Path | bytes) -> PngWorkflow:
    """The ``prompt`` and ``workflow`` tEXt/iTXt/zTXt chunks of a PNG, as ComfyUI writes them.
    A chunk that is missing or not a JSON object reads as None."""
    from PIL import Image, UnidentifiedImageError

    data = source if isinstance(source, bytes) else _read_bytes(Path(source))
    if not data.startswith(PNG_SIGNATURE):
        raise WorkflowFormatError("expected a PNG file, found other data")
    try:
        with Image.open(io.BytesIO(data)) as image:
            chunks = dict(getattr(image, "text", {}) or {})
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        raise WorkflowFormatError(f"could not read the PNG: {exc}") from exc
    return PngWorkflow(prompt=_json_object(chunks.get("prompt")), workflow=_json_object(chunks.get("workflow")))


def _json_object(text: Any) -> dict[str, Any] | None:
    if not isinstance(text, str):
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


# --- loading anything -------------------------------------------------------------------------
def load_workflow(obj: Any, object_info: Mapping[str, Mapping[str, Any]]) -> LoadedWorkflow:
    """An already-parsed JSON workflow of any supported format, as API format."""
    kind = detect_format(obj)
    if kind == FORMAT_API:
        return LoadedWorkflow(normalize_api(obj), None, FORMAT_API)
    if kind == FORMAT_SAVED:
        saved = from_saved(obj)
        return LoadedWorkflow(saved_runnable(saved, object_info), to_saved(saved.prompt, saved.layout, saved.extra),
                              FORMAT_SAVED)
    prompt = convert_ui_to_api(obj, object_info)
    if not prompt:
        raise WorkflowFormatError("the UI-format workflow has no nodes that run (all are notes, muted or bypassed)")
    return LoadedWorkflow(normalize_api(prompt), dict(obj), FORMAT_UI)


def load_workflow_file(path: str | Path, object_info: Mapping[str, Mapping[str, Any]]) -> LoadedWorkflow:
    """Load an API JSON, a saved-format JSON, a UI-format JSON (converted) or a PNG carrying a
    workflow (its ``prompt`` chunk preferred; else its ``workflow`` chunk converted).
    Every failure is a :class:`WorkflowFormatError` whose one line names the file."""
    path = Path(path)
    try:
        data = _read_bytes(path)
        if data.startswith(PNG_SIGNATURE):
            return _load_png(data, object_info)
        try:
            obj = json.loads(data.decode("utf-8-sig"))
        except UnicodeDecodeError as exc:
            raise WorkflowFormatError("not JSON (not UTF-8 text) and not a PNG") from exc
        except json.JSONDecodeError as exc:
            raise WorkflowFormatError(f"not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from exc
        return load_workflow(obj, object_info)
    except WorkflowFormatError as exc:
        raise WorkflowFormatError(f"{path}: {exc}") from exc
    except RecursionError as exc:
        raise WorkflowFormatError(f"{path}: the workflow is nested too deeply to read") from exc


def _load_png(data: bytes, object_info: Mapping[str, Mapping[str, Any]]) -> LoadedWorkflow:
    png = read_png_workflow(data)
    problem = None
    if png.prompt is not None:
        try:
            return LoadedWorkflow(normalize_api(png.prompt), png.workflow, FORMAT_PNG_PROMPT)
        except WorkflowFormatError as exc:
            problem = f"its \"prompt\" chunk is not a valid API workflow ({exc})"
    if png.workflow is not None:
        try:
            loaded = load_workflow(png.workflow, object_info)
        except WorkflowFormatError as exc:
            raise WorkflowFormatError(f"the PNG's \"workflow\" chunk: {exc}") from exc
        return LoadedWorkflow(loaded.prompt, png.workflow, FORMAT_PNG_WORKFLOW)
    raise WorkflowFormatError(problem or "the PNG carries no workflow (no \"prompt\" or \"workflow\" text chunk)")


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError as exc:
        raise WorkflowFormatError("no such file") from exc
    except IsADirectoryError as exc:
        raise WorkflowFormatError("is a directory, expected a workflow file") from exc
    except OSError as exc:
        raise WorkflowFormatError(f"cannot read the file: {exc.strerror or exc}") from exc


def _json_kind(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
             int: "a number", float: "a number", type(None): "null"}
    for kind, name in names.items():
        if isinstance(value, kind):
            return name
    if isinstance(value, Mapping):
        return "an object"
    return type(value).__name__


def _some_keys(obj: Mapping[str, Any], limit: int = 5) -> str:
    keys = [repr(str(k)) for k in list(obj)[:limit]]
    return ", ".join(keys) + (", ..." if len(obj) > limit else "")
