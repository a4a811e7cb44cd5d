"""ComfyUI's model-library routes (the official frontend's Models sidebar) and ``view_metadata``,
over Loom's model folders:

``GET /api/experiment/models``  ``[{"name": kind, "folders": [paths]}]``
``GET /api/experiment/models/{folder}``  ``[{"name", "pathIndex", "modified", "created", "size"}]``
  (``pathIndex``: which of the kind's folders holds the file); an unknown kind is a 404
``GET /api/experiment/models/preview/{folder}/{path_index}/{filename}``  the picture kept beside a
  model file (``name.webp``/``.png``/``.jpg``/``.preview.png``); 404 when there is none
``GET /api/view_metadata/{folder}?filename=``  a ``.safetensors`` file's ``__metadata__``; 404
  when the file is unknown, not safetensors, or has no metadata
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from engine.model_meta import HeaderError, read_safetensors_metadata
from engine.server.common import ApiError, Handler, json_response
from engine.server.security import safe_path

HIDDEN_KINDS = frozenset({"configs", "custom_nodes"})
PREVIEW_SUFFIXES = (".webp", ".preview.webp", ".png", ".preview.png", ".jpg", ".jpeg")


class FrontendModelRoutes:
    """``kinds()``: the model folder kinds; ``model_files``: Loom's model look-up (``list``,
    ``resolve`` and, when it has them, ``folders(kind)``)."""

    def __init__(self, kinds: Callable[[], list[str]], model_files: Any) -> None:
        self.kinds = kinds
        self.model_files = model_files

    def routes(self) -> list[tuple[str, str, Handler]]:
        return [
            ("GET", "/experiment/models", self.folders_list),
            ("GET", "/experiment/models/{folder}", self.models_in),
            ("GET", "/experiment/models/preview/{folder}/{path_index}/{filename:.+}", self.preview),
            ("GET", "/view_metadata/{folder}", self.view_metadata),
        ]

    def folders_of(self, kind: str) -> list[Path]:
        folders = getattr(self.model_files, "folders", None)
        if not callable(folders):
            return []
        try:
            return [Path(p) for p in folders(kind)]
        except (KeyError, ValueError, OSError):
            return []

    def known(self, kind: str) -> str:
        if kind not in self.kinds() or kind in HIDDEN_KINDS:
            raise ApiError(404, "not_found", f"Folder not found: no model folder {kind[:60]!r}; see /models")
        return kind

    async def folders_list(self, request: web.Request) -> web.Response:
        def build() -> list[dict[str, Any]]:
            return [
                {"name": kind, "folders": [str(p) for p in self.folders_of(kind)]}
                for kind in self.kinds()
                if kind not in HIDDEN_KINDS
            ]

        return json_response(await asyncio.to_thread(build))

    def describe(self, kind: str) -> list[dict[str, Any]]:
        if self.model_files is None:
            return []
        roots = [p.resolve() for p in self.folders_of(kind)]
        try:
            names = list(self.model_files.list(kind))
        except (KeyError, ValueError, OSError):
            return []
        found: list[dict[str, Any]] = []
        for name in names:
            try:
                path = Path(self.model_files.resolve(kind, name))
                stat = path.stat()
            except (KeyError, ValueError, OSError):
                continue
            where = path.resolve()
            index = next((n for n, root in enumerate(roots) if where.is_relative_to(root)), 0)
            found.append(
                {
                    "name": name,
                    "pathIndex": index,
                    "modified": stat.st_mtime,
                    "created": stat.st_ctime,
                    "size": stat.st_size,
                }
            )
        return found

    async def models_in(self, request: web.Request) -> web.Response:
        kind = self.known(request.match_info["folder"])
        return json_response(await asyncio.to_thread(self.describe, kind))

    def find_preview(self, kind: str, index: int, filename: str) -> Path | None:
        folders = self.folders_of(kind)
        if not 0 <= index < len(folders):
            return None
        model = safe_path(folders[index], filename)
        if model is None:
            return None
        stem = model.with_suffix("") if model.suffix else model
        for suffix in PREVIEW_SUFFIXES:
            candidate = stem.parent / (stem.name + suffix)
            if candidate.is_file():
                return candidate
        return None

    async def preview(self, request: web.Request) -> web.StreamResponse:
        kind = self.known(request.match_info["folder"])
        raw_index = request.match_info["path_index"]
        if not raw_index.isdigit():
            raise ApiError(
                400, "invalid_request", f"path_index must be a folder number, got {raw_index[:20]!r}"
            )
        filename = request.match_info["filename"]
        path = await asyncio.to_thread(self.find_preview, kind, int(raw_index), filename)
        if path is None:
            raise ApiError(404, "not_found", f"no preview picture beside {filename[:200]!r}")
        return web.FileResponse(path)

    def metadata(self, kind: str, filename: str) -> dict[str, str] | None:
        try:
            path = Path(self.model_files.resolve(kind, filename))
            return read_safetensors_metadata(path) or None
        except (KeyError, ValueError, OSError, HeaderError):
            return None

    async def view_metadata(self, request: web.Request) -> web.Response:
        kind = self.known(request.match_info["folder"])
        filename = request.query.get("filename")
        if not filename:
            raise ApiError(400, "invalid_query", "give the model file as ?filename=<name>.safetensors")
        if not filename.endswith(".safetensors") or self.model_files is None:
            raise ApiError(404, "not_found", f"{filename[:200]!r} is not a .safetensors model file")
        found = await asyncio.to_thread(self.metadata, kind, filename)
        if found is None:
            raise ApiError(404, "not_found", f"no metadata in {filename[:200]!r} (or no such file in {kind})")
        return json_response(found)
