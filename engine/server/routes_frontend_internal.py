"""ComfyUI's ``/internal/`` routes the official frontend reads (its Console panel, missing-model
help and Assets "Imported" tab), and the in-memory log ring buffer behind the first three:

``GET /internal/logs``  the recent log text, one string
``GET /internal/logs/raw``  ``{"entries": [{"t": ISO time, "m": line}], "size": {"cols", "rows"}}``
``PATCH /internal/logs/subscribe``  ``{"clientId", "enabled"}``: new lines pushed to that websocket
  client as ``{"type": "logs", "data": {"entries": [...], "size": {...}}}``
``GET /internal/folder_paths``  ``{model folder kind: [folder paths]}``
``GET /internal/files/{input|output|temp}``  the folder's file names, newest first
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import threading
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiohttp import web

from engine.context import Folders
from engine.server.common import ApiError, Handler, json_response, read_object

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
Push = Callable[[str, dict[str, Any]], None]  # (client id, the logs message's data)


def terminal_size() -> dict[str, int]:
    size = shutil.get_terminal_size()
    return {"cols": size.columns, "rows": size.lines}


class LogRing(logging.Handler):
    """The last ``capacity`` log lines, kept in memory for the Console panel; each new line is also
    handed to ``push`` for every subscribed websocket client (set by the server)."""

    def __init__(self, capacity: int = 300) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter(LOG_FORMAT))
        self.entries: deque[dict[str, str]] = deque(maxlen=capacity)
        self.subscribers: set[str] = set()
        self.push: Push | None = None
        self._guard = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record) + "\n"
        except Exception:  # a record whose arguments do not format: logging's own policy
            self.handleError(record)
            return
        entry = {"t": datetime.fromtimestamp(record.created, UTC).isoformat(), "m": line}
        with self._guard:
            self.entries.append(entry)
            targets = list(self.subscribers) if self.push is not None else []
        for client_id in targets:
            if self.push is not None:
                self.push(client_id, {"entries": [entry], "size": terminal_size()})

    def snapshot(self) -> list[dict[str, str]]:
        with self._guard:
            return list(self.entries)

    def subscribe(self, client_id: str, enabled: bool) -> None:
        with self._guard:
            if enabled:
                self.subscribers.add(client_id)
            else:
                self.subscribers.discard(client_id)


class FrontendInternalRoutes:
    """``folder_kinds()``: the model folder kinds; ``model_folders(kind)``: where each kind's files live."""

    def __init__(
        self,
        logs: LogRing,
        folders: Folders,
        folder_kinds: Callable[[], list[str]],
        model_folders: Callable[[str], list[Path]] | None,
    ) -> None:
        self.logs = logs
        self.folders = folders
        self.folder_kinds = folder_kinds
        self.model_folders = model_folders

    def routes(self) -> list[tuple[str, str, Handler]]:
        return [
            ("GET", "/internal/logs", self.get_logs),
            ("GET", "/internal/logs/raw", self.get_raw_logs),
            ("PATCH", "/internal/logs/subscribe", self.subscribe_logs),
            ("GET", "/internal/folder_paths", self.folder_paths),
            ("GET", "/internal/files/{directory_type}", self.list_files),
        ]

    async def get_logs(self, request: web.Request) -> web.Response:
        return json_response("".join(entry["m"] for entry in self.logs.snapshot()))

    async def get_raw_logs(self, request: web.Request) -> web.Response:
        return json_response({"entries": self.logs.snapshot(), "size": terminal_size()})

    async def subscribe_logs(self, request: web.Request) -> web.Response:
        data = await read_object(request)
        client_id, enabled = data.get("clientId"), data.get("enabled")
        if not isinstance(client_id, str) or not client_id or not isinstance(enabled, bool):
            raise ApiError(
                400,
                "invalid_request",
                'expected {"clientId": "<websocket client id>", "enabled": true|false}',
            )
        self.logs.subscribe(client_id, enabled)
        return web.Response(status=200)

    def _folder_paths(self) -> dict[str, list[str]]:
        if self.model_folders is None:
            return {}
        found: dict[str, list[str]] = {}
        for kind in self.folder_kinds():
            try:
                found[kind] = [str(p) for p in self.model_folders(kind)]
            except (KeyError, ValueError, OSError):
                found[kind] = []
        return found

    async def folder_paths(self, request: web.Request) -> web.Response:
        return json_response(await asyncio.to_thread(self._folder_paths))

    async def list_files(self, request: web.Request) -> web.Response:
        kind = request.match_info["directory_type"]
        roots = {
            "input": self.folders.input_dir,
            "output": self.folders.output_dir,
            "temp": self.folders.temp_dir,
        }
        if kind not in roots:
            raise ApiError(
                400, "invalid_request", f"Invalid directory type {kind[:40]!r}: use input, output or temp"
            )
        return json_response(await asyncio.to_thread(newest_first, roots[kind]))


def newest_first(folder: Path) -> list[str]:
    """The names of the files directly in ``folder``, the most recently changed first."""
    if not folder.is_dir():
        return []
    files: list[tuple[float, str]] = []
    with os.scandir(folder) as entries:
        for entry in entries:
            try:
                if entry.is_file():
                    files.append((entry.stat().st_mtime, entry.name))
            except OSError:  # removed while listed
                continue
    return [name for _, name in sorted(files, key=lambda item: (-item[0], item[1]))]
