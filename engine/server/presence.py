"""Which output files of a job are still on disk.

History outlives restarts, but its files may have been deleted, or the server restarted with
another ``--output-dir``. ``/history`` and the job resources mark each file entry that is gone with
``"missing": true`` (the key is absent otherwise, so ComfyUI's shape is unchanged), and the editor's
gallery shows a placeholder for it instead of requesting it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.context import Folders
from engine.server.common import ApiError
from engine.server.security import safe_path


class OutputPresence:
    def __init__(self, folders: Folders) -> None:
        self.folders = {"input": folders.input_dir, "output": folders.output_dir, "temp": folders.temp_dir}

    def exists(self, item: Mapping[str, Any]) -> bool:
        base = self.folders.get(str(item.get("type", "output")))
        if base is None:
            return True  # not a file of ours: nothing to say
        try:
            return safe_path(base, str(item.get("subfolder") or ""), str(item["filename"])).is_file()
        except (ApiError, OSError, ValueError):
            return False

    def annotate(self, outputs: Mapping[str, Any]) -> dict[str, Any]:
        """A copy of a job's UI outputs whose file entries that are gone carry ``missing: true``."""
        marked: dict[str, Any] = {}
        for node_id, ui in outputs.items():
            if not isinstance(ui, Mapping):
                marked[node_id] = ui
                continue
            marked[node_id] = {
                key: [self.mark(item) for item in value] if isinstance(value, list) else value
                for key, value in ui.items()
            }
        return marked

    def mark(self, item: Any) -> Any:
        if isinstance(item, Mapping) and isinstance(item.get("filename"), str) and not self.exists(item):
            return {**item, "missing": True}
        return item
