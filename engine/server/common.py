"""Shared pieces of the server: configuration, JSON errors, request helpers, route registration."""

from __future__ import annotations

import json
import secrets
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


@dataclass(frozen=True)
class ServerConfig:
    """How the server listens and what it allows.

    ``token``: required from every client when set (``Authorization: Bearer``, ``?token=`` or the
    cookie the server sets after a ``?token=`` visit). ``allowed_hosts``: extra names accepted in
    ``Host``/``Origin`` headers besides loopback and ``host``. ``allow_remote_webhooks``: webhooks
    may target non-loopback hosts.
    """

    host: str = "127.0.0.1"
    port: int = 8188
    token: str | None = None
    insecure: bool = False
    allowed_hosts: tuple[str, ...] = ()
    max_upload_bytes: int = 50 * 1024 * 1024
    preview_fps: float = 10.0
    allow_remote_webhooks: bool = False
    version: str = "0.1.0"
    argv: tuple[str, ...] = ()
    extra_stats: dict[str, Any] = field(default_factory=dict)

    def token_matches(self, given: str | None) -> bool:
        return self.token is not None and given is not None and secrets.compare_digest(
            given.encode(), self.token.encode())


class ApiError(Exception):
    """Raised by handlers for a client's mistake; turned into ``{"error": {...}}`` with ``status``."""

    def __init__(self, status: int, kind: str, message: str, **details: Any) -> None:
        super().__init__(message)
        self.status, self.kind, self.message, self.details = status, kind, message, details

    def body(self) -> dict[str, Any]:
        return {"error": {"type": self.kind, "message": self.message, **self.details}}


def json_error(status: int, kind: str, message: str, **details: Any) -> web.Response:
    return web.json_response(ApiError(status, kind, message, **details).body(), status=status)


async def read_json(request: web.Request, *, allow_empty: bool = False) -> Any:
    """The request body as JSON, or a 400 that says what was wrong."""
    raw = await request.read()
    if not raw.strip():
        if allow_empty:
            return {}
        raise ApiError(400, "invalid_json", "the request body is empty; send a JSON object")
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, "invalid_json", f"the request body is not valid JSON: {exc}") from exc


async def read_object(request: web.Request, *, allow_empty: bool = False) -> dict[str, Any]:
    data = await read_json(request, allow_empty=allow_empty)
    if not isinstance(data, dict):
        raise ApiError(400, "invalid_json", f"expected a JSON object, got {type(data).__name__}")
    return data


def query_int(request: web.Request, name: str, default: int | None = None) -> int | None:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError as exc:
        raise ApiError(400, "invalid_query", f"query parameter {name!r} must be an integer, got {raw!r}") from exc


def query_bool(request: web.Request, name: str, default: bool = False) -> bool:
    raw = request.query.get(name)
    if raw is None:
        return default
    return raw.lower() in ("1", "true", "yes", "on", "")


def add_routes(app: web.Application, routes: Iterable[tuple[str, str, Handler]], *, comfy: bool = True) -> None:
    """Register ``(method, path, handler)``; ComfyUI routes also under ``/api``."""
    for method, path, handler in routes:
        app.router.add_route(method, path, handler)
        if comfy:
            app.router.add_route(method, "/api" + path, handler)
