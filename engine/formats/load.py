"""Loading anything a user can hand us: API, saved or UI format JSON, or a PNG carrying a
workflow. Whatever is wrong comes back as one :class:`WorkflowFormatError` line saying what was
expected and what was found, never a traceback."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.formats.api import WorkflowFormatError, json_kind, normalize_api, some_keys
from engine.formats.png import PNG_SIGNATURE, read_bytes, read_png_workflow
from engine.formats.saved import SAVED_FORMAT_NAME, from_saved, saved_runnable, to_saved
from engine.formats.ui_import import convert_ui_to_api

FORMAT_API = "api"
FORMAT_SAVED = "loom"
FORMAT_UI = "ui"
FORMAT_PNG_PROMPT = "png-prompt"
FORMAT_PNG_WORKFLOW = "png-workflow"

_EXPECTED = (
    'expected ComfyUI API format ({id: {"class_type", "inputs"}}), Loom\'s saved format '
    '({"format": "loom.workflow", ...}) or ComfyUI UI format (an object with "nodes" and "links" lists)'
)


@dataclass(frozen=True)
class LoadedWorkflow:
    """A workflow ready for validation: the API-format ``prompt``, the editor JSON it came with
    (UI format or Loom's saved format; None for plain API files), and where it came from
    (``api``, ``loom``, ``ui``, ``png-prompt`` or ``png-workflow``)."""

    prompt: dict[str, Any]
    workflow: dict[str, Any] | None
    source_format: str


def detect_format(obj: Any) -> str:
    """``"api"``, ``"loom"`` or ``"ui"``; anything else raises :class:`WorkflowFormatError`."""
    if not isinstance(obj, Mapping):
        raise WorkflowFormatError(f"{_EXPECTED}; found {json_kind(obj)}")
    if obj.get("format") == SAVED_FORMAT_NAME:
        return FORMAT_SAVED
    if isinstance(obj.get("format"), str):  # never an API node (those are objects)
        raise WorkflowFormatError(
            f"unknown workflow format {obj['format']!r}; expected {SAVED_FORMAT_NAME!r} for a saved workflow"
        )
    if isinstance(obj.get("nodes"), list) and isinstance(obj.get("links"), list):
        return FORMAT_UI
    if not obj:
        raise WorkflowFormatError(f"the workflow is an empty object; {_EXPECTED}")
    if all(isinstance(v, Mapping) and "class_type" in v for v in obj.values()):
        return FORMAT_API
    if any(isinstance(v, Mapping) and "class_type" in v for v in obj.values()):
        bad = next(k for k, v in obj.items() if not (isinstance(v, Mapping) and "class_type" in v))
        raise WorkflowFormatError(
            f'API-format workflow: node {bad!r} should be an object with "class_type" and "inputs", '
            f"found {json_kind(obj[bad])}"
        )
    if isinstance(obj.get("nodes"), list):
        raise WorkflowFormatError(f'UI-format workflow without a "links" list; {_EXPECTED}')
    if isinstance(obj.get("prompt"), Mapping):
        raise WorkflowFormatError(
            f'{_EXPECTED}; found an object with a "prompt" key (a /prompt request body?): '
            'save only the value of "prompt"'
        )
    raise WorkflowFormatError(f"{_EXPECTED}; found an object with keys {some_keys(obj)}")


def load_workflow(obj: Any, object_info: Mapping[str, Mapping[str, Any]]) -> LoadedWorkflow:
    """An already-parsed JSON workflow of any supported format, as API format."""
    kind = detect_format(obj)
    if kind == FORMAT_API:
        return LoadedWorkflow(normalize_api(obj), None, FORMAT_API)
    if kind == FORMAT_SAVED:
        saved = from_saved(obj)
        return LoadedWorkflow(
            saved_runnable(saved, object_info),
            to_saved(saved.prompt, saved.layout, saved.extra),
            FORMAT_SAVED,
        )
    prompt = convert_ui_to_api(obj, object_info)
    if not prompt:
        raise WorkflowFormatError(
            "the UI-format workflow has no nodes that run (all are notes, muted or bypassed)"
        )
    return LoadedWorkflow(normalize_api(prompt), dict(obj), FORMAT_UI)


def load_workflow_file(path: str | Path, object_info: Mapping[str, Mapping[str, Any]]) -> LoadedWorkflow:
    """Load an API JSON, a saved-format JSON, a UI-format JSON (converted) or a PNG carrying a
    workflow (its ``prompt`` chunk preferred; else its ``workflow`` chunk converted).
    Every failure is a :class:`WorkflowFormatError` whose one line names the file."""
    path = Path(path)
    try:
        data = read_bytes(path)
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
            problem = f'its "prompt" chunk is not a valid API workflow ({exc})'
    if png.workflow is not None:
        try:
            loaded = load_workflow(png.workflow, object_info)
        except WorkflowFormatError as exc:
            raise WorkflowFormatError(f'the PNG\'s "workflow" chunk: {exc}') from exc
        return LoadedWorkflow(loaded.prompt, png.workflow, FORMAT_PNG_WORKFLOW)
    raise WorkflowFormatError(problem or 'the PNG carries no workflow (no "prompt" or "workflow" text chunk)')
