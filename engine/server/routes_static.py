"""The editors' files: one editor at ``/`` (Loom's ``web/`` or ComfyUI's official frontend), and
Loom's editor at a path of its own (``/loom/``) when the official frontend has ``/``.

Loom's editor finds the API next to its own page (as behind a reverse proxy at a sub-path), so
under its own path every request that is not one of its files is answered by the route the same
path has without the prefix: ``/loom/object_info`` as ``/object_info``, ``/loom/ws`` as ``/ws``.
"""

from __future__ import annotations

from pathlib import Path

from aiohttp import web
from yarl import URL

from engine.server.common import ApiError
from engine.server.security import safe_path

NO_EDITOR = (
    "Loom is running; the editor (web/index.html) is not installed. "
    "The API is at /prompt, /ws and /api/v1/openapi.json.\n"
)


class StaticRoutes:
    """An editor's folder served as it is, at ``/`` (``prefix=""``) or under ``prefix``."""

    def __init__(self, web_dir: Path | None, prefix: str = "") -> None:
        self.web_dir = web_dir if web_dir is not None and web_dir.is_dir() else None
        self.prefix = prefix.rstrip("/")

    def install(self, app: web.Application) -> None:
        if not self.prefix:
            app.router.add_get("/", self.index)
            app.router.add_get("/{path:.+}", self.file)
            return
        app.router.add_get(self.prefix, self.to_index)
        app.router.add_get(self.prefix + "/", self.index)
        app.router.add_route("*", self.prefix + "/{path:.+}", self.mounted)

    def found(self, name: str) -> Path | None:
        path = safe_path(self.web_dir, name) if self.web_dir is not None else None
        return path if path is not None and path.is_file() else None

    async def file(self, request: web.Request) -> web.StreamResponse:
        path = self.found(request.match_info["path"])
        if path is None:
            raise ApiError(404, "not_found", f"no such file: {request.path}")
        return web.FileResponse(path)

    async def index(self, request: web.Request) -> web.StreamResponse:
        if self.web_dir is None or not (self.web_dir / "index.html").is_file():
            return web.Response(text=NO_EDITOR)
        response = web.FileResponse(self.web_dir / "index.html")
        response.headers["Cache-Control"] = "no-cache"
        return response

    async def to_index(self, request: web.Request) -> web.StreamResponse:
        raise web.HTTPFound(URL(self.prefix + "/").with_query(request.query))

    async def mounted(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["path"]
        path = self.found(name) if request.method in ("GET", "HEAD") else None
        if path is not None:
            return web.FileResponse(path)
        # not one of the editor's files: the API route of the same path without the prefix
        inner = request.clone(rel_url=URL.build(path="/" + name, query_string=request.query_string))
        match = await request.app.router.resolve(inner)
        refused = match.http_exception
        if refused is not None or isinstance(getattr(match.handler, "__self__", None), StaticRoutes):
            status = refused.status if refused is not None else 404  # another editor's files: not here
            raise ApiError(
                status,
                "not_found" if status == 404 else "method_not_allowed",
                f"no file or route {request.method} {request.path} (Loom's editor is at {self.prefix}/)",
            )
        match.add_app(request.app)
        match.freeze()
        inner._match_info = match  # what aiohttp's own dispatch sets before calling a handler
        return await match.handler(inner)
