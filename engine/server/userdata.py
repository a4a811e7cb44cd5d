"""Per-user files as ComfyUI's editor expects them: ``/userdata`` (saved workflows and other
files), ``/settings`` and ``/users``. Single user: everything lives in ``USER_DIR/default``."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from aiohttp import web

from engine.atomic import write_atomic
from engine.server.common import ApiError, Handler, dumps, json_response, query_bool, read_json, read_object
from engine.server.security import safe_path

DEFAULT_USER = "default"
SETTINGS_FILE = "comfy.settings.json"


def file_info(path: Path, root: Path) -> dict[str, Any]:
    stat = path.stat()
    return {"path": path.relative_to(root).as_posix(), "size": stat.st_size, "modified": stat.st_mtime}


class UserdataRoutes:
    def __init__(self, user_dir: Path) -> None:
        self.root = user_dir / DEFAULT_USER
        self.root.mkdir(parents=True, exist_ok=True)
        self._settings_lock = threading.Lock()

    def routes(self) -> list[tuple[str, str, Handler]]:
        return [
            ("GET", "/userdata", self.list_files),
            ("GET", "/v2/userdata", self.list_entries),
            ("GET", "/userdata/{file}", self.get_file),
            ("POST", "/userdata/{file}", self.post_file),
            ("DELETE", "/userdata/{file}", self.delete_file),
            ("POST", "/userdata/{file}/move/{dest}", self.move_file),
            ("GET", "/settings", self.get_settings),
            ("POST", "/settings", self.post_settings),
            ("GET", "/settings/{id}", self.get_setting),
            ("POST", "/settings/{id}", self.post_setting),
            ("GET", "/users", self.get_users),
            ("POST", "/users", self.post_users),
        ]

    # --- files ------------------------------------------------------------------------------------
    def _path(self, raw: str) -> Path:
        name = unquote(raw)
        if not name.strip("/"):
            raise ApiError(400, "invalid_path", "give a file name relative to your user folder")
        path = safe_path(self.root, name)
        if path.resolve() == self.root.resolve():
            raise ApiError(400, "invalid_path", "that names the user folder itself")
        return path

    def _answer(self, path: Path, request: web.Request) -> web.Response:
        if query_bool(request, "full_info"):
            return json_response(file_info(path, self.root))
        return json_response(path.relative_to(self.root).as_posix())

    async def list_files(self, request: web.Request) -> web.Response:
        directory = request.query.get("dir")
        if not directory:
            raise ApiError(400, "missing_dir", "give ?dir=FOLDER (e.g. dir=workflows)")
        folder = safe_path(self.root, directory)
        recurse, full, split = (query_bool(request, k) for k in ("recurse", "full_info", "split"))
        return json_response(await asyncio.to_thread(self._listing, folder, directory, recurse, full, split))

    def _listing(self, folder: Path, directory: str, recurse: bool, full: bool, split: bool) -> Any:
        """``/userdata?dir=`` (a folder of thousands of workflows is walked off the event loop)."""
        if not folder.is_dir():
            raise ApiError(404, "not_found", f"no folder {directory!r} in your user data")
        real_root = os.path.realpath(folder)
        files = sorted(
            p
            for p in folder.glob("**/*" if recurse else "*")
            if p.is_file() and os.path.commonpath([os.path.realpath(p), real_root]) == real_root
        )
        if full:
            return [file_info(p, folder) for p in files]
        names = [p.relative_to(folder).as_posix() for p in files]
        if split:
            return [[n, *n.split("/")] for n in names]
        return names

    async def list_entries(self, request: web.Request) -> web.Response:
        """``/v2/userdata?path=FOLDER``: the folder's files and sub-folders (one level), each
        ``{name, path, type: "file"|"directory"}`` with ``size`` and ``modified`` for files."""
        raw = unquote(request.query.get("path", "")).strip("/")
        folder = safe_path(self.root, raw) if raw else self.root
        return json_response(await asyncio.to_thread(self._entries, folder, raw))

    def _entries(self, folder: Path, raw: str) -> list[dict[str, Any]]:
        if not folder.is_dir():
            raise ApiError(404, "not_found", f"no folder {raw!r} in your user data")
        entries: list[dict[str, Any]] = []
        for child in sorted(folder.iterdir(), key=lambda p: p.name):
            relative = child.relative_to(self.root).as_posix()
            if child.is_dir():
                entries.append({"name": child.name, "path": relative, "type": "directory"})
            elif child.is_file():
                stat = child.stat()
                entries.append(
                    {
                        "name": child.name,
                        "path": relative,
                        "type": "file",
                        "size": stat.st_size,
                        "modified": stat.st_mtime,
                    }
                )
        return entries

    async def get_file(self, request: web.Request) -> web.StreamResponse:
        path = self._path(request.match_info["file"])
        if not path.is_file():
            raise ApiError(404, "not_found", f"no user file {path.relative_to(self.root).as_posix()!r}")
        return web.FileResponse(path)

    async def post_file(self, request: web.Request) -> web.Response:
        path = self._path(request.match_info["file"])
        overwrite = query_bool(request, "overwrite", True)
        if path.exists() and not overwrite:
            raise ApiError(
                409,
                "file_exists",
                f"{path.relative_to(self.root).as_posix()!r} exists; add ?overwrite=true to replace it",
            )
        if path.is_dir():
            raise ApiError(400, "invalid_path", "that name is a folder")
        body = await request.read()
        path.parent.mkdir(parents=True, exist_ok=True)
        safe_path(self.root, path.relative_to(self.root).as_posix())  # parents created: check again
        await asyncio.to_thread(write_atomic, path, body)
        return self._answer(path, request)

    async def delete_file(self, request: web.Request) -> web.Response:
        path = self._path(request.match_info["file"])
        if not path.is_file():
            raise ApiError(404, "not_found", "no such user file")
        path.unlink()
        return web.Response(status=204)

    async def move_file(self, request: web.Request) -> web.Response:
        source = self._path(request.match_info["file"])
        dest = self._path(request.match_info["dest"])
        if not source.is_file():
            raise ApiError(404, "not_found", "no such user file to move")
        if dest.exists() and not query_bool(request, "overwrite", True):
            raise ApiError(409, "file_exists", "the destination exists; add ?overwrite=true to replace it")
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(source, dest)
        return self._answer(dest, request)

    # --- settings -------------------------------------------------------------------------------------
    def _load_settings(self) -> dict[str, Any]:
        path = self.root / SETTINGS_FILE
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _save_settings(self, settings: dict[str, Any]) -> None:
        write_atomic(self.root / SETTINGS_FILE, dumps(settings).encode())

    async def get_settings(self, request: web.Request) -> web.Response:
        return json_response(self._load_settings())

    async def post_settings(self, request: web.Request) -> web.Response:
        update = await read_object(request)
        with self._settings_lock:
            settings = self._load_settings()
            settings.update(update)
            self._save_settings(settings)
        return web.Response(status=200)

    async def get_setting(self, request: web.Request) -> web.Response:
        return json_response(self._load_settings().get(request.match_info["id"]))

    async def post_setting(self, request: web.Request) -> web.Response:
        value = await read_json(request)
        with self._settings_lock:
            settings = self._load_settings()
            settings[request.match_info["id"]] = value
            self._save_settings(settings)
        return web.Response(status=200)

    # --- users ----------------------------------------------------------------------------------------
    async def get_users(self, request: web.Request) -> web.Response:
        return json_response({"storage": "server", "migrated": True})

    async def post_users(self, request: web.Request) -> web.Response:
        raise ApiError(400, "single_user", "Loom runs in single-user mode; there are no users to create")
