"""The ``prompt`` and ``workflow`` text chunks of PNG files: reading them, and preparing what
image-writing nodes embed (once per job, before it runs)."""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.formats.api import WorkflowFormatError
from engine.formats.saved import SAVED_FORMAT_NAME, SAVED_VERSION, from_saved
from engine.formats.ui_export import saved_to_ui

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@dataclass(frozen=True)
class PngWorkflow:
    """The ``prompt`` (API) and ``workflow`` (editor) JSON a PNG carries; None where absent."""

    prompt: dict[str, Any] | None
    workflow: dict[str, Any] | None


def read_png_workflow(source: str | Path | bytes) -> PngWorkflow:
    """The ``prompt`` and ``workflow`` tEXt/iTXt/zTXt chunks of a PNG, as ComfyUI writes them.
    A chunk that is missing or not a JSON object reads as None."""
    from PIL import Image, UnidentifiedImageError  # lazy: PIL (~50 ms); `import main` loads none

    data = source if isinstance(source, bytes) else read_bytes(Path(source))
    if not data.startswith(PNG_SIGNATURE):
        raise WorkflowFormatError("expected a PNG file, found other data")
    try:
        with Image.open(io.BytesIO(data)) as image:
            chunks = dict(getattr(image, "text", {}) or {})
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        raise WorkflowFormatError(f"could not read the PNG: {exc}") from exc
    return PngWorkflow(
        prompt=_json_object(chunks.get("prompt")), workflow=_json_object(chunks.get("workflow"))
    )


def _json_object(text: Any) -> dict[str, Any] | None:
    if not isinstance(text, str):
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError as exc:
        raise WorkflowFormatError("no such file") from exc
    except IsADirectoryError as exc:
        raise WorkflowFormatError("is a directory, expected a workflow file") from exc
    except OSError as exc:
        raise WorkflowFormatError(f"cannot read the file: {exc.strerror or exc}") from exc


def png_info(
    extra: Mapping[str, Any] | None, object_info: Callable[[], Mapping[str, Mapping[str, Any]]]
) -> dict[str, Any]:
    """What image-writing nodes embed: a Loom saved-format ``workflow`` becomes ComfyUI's UI format
    (so ComfyUI opens Loom's images), the saved format itself kept as ``loom_workflow``.
    ``object_info`` is called only when there is a saved-format workflow to convert."""
    if not extra:
        return {}
    workflow = extra.get("workflow")
    if not isinstance(workflow, Mapping) or workflow.get("format") != SAVED_FORMAT_NAME:
        return dict(extra)
    try:
        saved = from_saved(workflow)
    except WorkflowFormatError:
        return dict(extra)
    ui = saved_to_ui(
        {
            "prompt": saved.prompt,
            "layout": saved.layout,
            "format": SAVED_FORMAT_NAME,
            "version": SAVED_VERSION,
        },
        object_info(),
    )
    return {**extra, "workflow": ui, "loom_workflow": workflow}
