"""What every loader node needs from the run's model folders: the folders themselves (a teaching
error when the run has none), whether pickled files may be read, and a model file's fingerprint
(the ``fingerprint`` a loader node gives the cache)."""

from __future__ import annotations

from typing import Any

from engine.context import Folders, ModelFiles, NodeContext
from nodes.core.tensors import ModelLoadError
from nodes.core.weights import fingerprint


def require_model_files(ctx: NodeContext) -> ModelFiles:
    """The run's model folders; a teaching error when it has none."""
    if ctx.folders.model_files is None:
        raise ModelLoadError("this run has no model folders; start Loom with --models-dir")
    return ctx.folders.model_files


def pickle_allowed(ctx: NodeContext) -> bool:
    return ctx.settings.allow_pickle


def file_fingerprint(folders: Folders, kind: str, name: Any) -> str | None:
    """The fingerprint of model file ``name`` in folder ``kind`` (a loader's ``fingerprint``), or None."""
    if folders.model_files is None or not isinstance(name, str):
        return None
    try:
        return fingerprint(folders.model_files.resolve(kind, name))
    except (OSError, ValueError):
        return None
