"""Shared pieces of the server: configuration, JSON errors, request helpers, route registration."""

from __future__ import annotations

import asyncio
import errno
import json
import math
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
    ``Host`` headers besides loopback and ``host``. ``allowed_origins``: web pages of other
    origins (``scheme://host:port``, or ``*``) that may use the API; by default only the server's
    own origin may. ``allow_remote_webhooks``: webhooks
    may target non-loopback hosts. ``folder_threads``: how many threads at most walk model folders
    and read model headers for the routes (off the event loop; other work has its own threads).
    """

    host: str = "127.0.0.1"
    port: int = 8188
    token: str | None = None
    insecure: bool = False
    allowed_hosts: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()  # pages of other origins allowed to use the API ("*": any)
    max_upload_bytes: int = 50 * 1024 * 1024
    preview_fps: float = 10.0
    max_waiting_previews: int = 1  # per client: previews still being sent before newer ones are dropped
    allow_remote_webhooks: bool = False
    folder_threads: int = 4
    version: str = "0.1.0"
    # the ComfyUI release whose HTTP API Loom answers; /system_stats reports it as comfyui_version
    # with Loom's own version as semver build metadata ("0.8.0+loom.0.1.0")
    comfyui_api_version: str = "0.8.0"
    argv: tuple[str, ...] = ()
    extra_stats: dict[str, Any] = field(default_factory=dict)
    front_end_root: str | None = None

    def token_matches(self, given: str | None) -> bool:
        return (
            self.token is not None
            and given is not None
            and secrets.compare_digest(given.encode(), self.token.encode())
        )


class ApiError(Exception):
    """Raised by handlers for a client's mistake; turned into ``{"error": {...}}`` with ``status``."""

    def __init__(self, status: int, kind: str, message: str, **details: Any) -> None:
        super().__init__(message)
        self.status, self.kind, self.message, self.details = status, kind, message, details

    def body(self) -> dict[str, Any]:
        return {"error": {"type": self.kind, "message": self.message, **self.details}}


LARGE_BODY = 64 * 1024
MAX_NAME_BYTES = 255  # one path segment, as file systems allow
MAX_JSON_DEPTH = 64  # ComfyUI's formats nest about 10 deep; far more is an attack or a bug
MAX_QUERY_INT = 2**53  # JavaScript's safe integers; larger query numbers mean nothing to Loom


def finite(value: Any) -> Any:
    """``value`` with every NaN or ±Infinity float replaced by None (what strict JSON can carry)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def dumps(value: Any) -> str:
    """Strict JSON (RFC 8259) for every response: never a bare NaN or Infinity, which browsers'
    ``JSON.parse`` refuses; non-finite numbers (from old records or plugins) become null."""
    try:
        return json.dumps(value, default=str, allow_nan=False)
    except ValueError:
        return json.dumps(finite(value), default=str, allow_nan=False)


def json_response(data: Any, *, status: int = 200, headers: Any = None) -> web.Response:
    return web.json_response(data, status=status, headers=headers, dumps=dumps)


async def json_response_built(build: Callable[[], Any], *, status: int = 200) -> web.Response:
    """A JSON response whose body is built and serialised off the event loop (large histories,
    the node catalogue): other clients are served meanwhile."""
    text = await asyncio.to_thread(lambda: dumps(build()))
    return web.Response(text=text, status=status, content_type="application/json")


def json_error(status: int, kind: str, message: str, **details: Any) -> web.Response:
    return json_response(ApiError(status, kind, message, **details).body(), status=status)


def os_error(exc: OSError) -> ApiError | None:
    """A client-facing answer for a file-system failure a request caused or met (None: a real bug)."""
    name = f" ({exc.filename})" if exc.filename else ""
    answers = {
        errno.ENOSPC: (
            507,
            "storage_full",
            f"the disk is full{name}; nothing was written. Free some space and retry",
        ),
        errno.EDQUOT: (507, "storage_full", f"the disk quota is exhausted{name}; nothing was written"),
        errno.EROFS: (507, "storage_read_only", f"the folder is on a read-only file system{name}"),
        errno.ENAMETOOLONG: (
            400,
            "name_too_long",
            f"a file name is too long{name}; names are limited to {MAX_NAME_BYTES} bytes",
        ),
        errno.EISDIR: (409, "is_a_folder", f"that name is a folder{name}; give a file name"),
        errno.ENOTDIR: (409, "not_a_folder", f"a part of that path is a file, not a folder{name}"),
        errno.EEXIST: (409, "exists", f"a file or folder of that name is in the way{name}"),
        errno.ENOTEMPTY: (409, "folder_not_empty", f"that folder is not empty{name}"),
        errno.EACCES: (403, "permission_denied", f"the server may not write there{name}"),
        errno.EPERM: (403, "permission_denied", f"the server may not write there{name}"),
    }
    answer = answers.get(exc.errno or -1)
    return ApiError(*answer) if answer else None


def storage_error(exc: BaseException) -> ApiError:
    """The answer while the job database cannot be written (a full disk): not the client's fault."""
    return ApiError(507, "storage_unavailable", f"{exc}. Nothing was queued; retry when space is free.")


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number; send finite numbers only")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]} is too large for a 64-bit float; send finite numbers only")
    return value


def json_depth(value: Any) -> int:
    """How deeply ``value`` nests lists and objects (iteratively: any depth is safe to measure)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def parse_json(raw: bytes | str) -> Any:
    """Strict, bounded JSON: NaN/Infinity and overflowing numbers are refused, and so is nesting
    deeper than :data:`MAX_JSON_DEPTH`. Raises ``ValueError`` with a message for the client."""
    try:
        value = json.loads(raw, parse_constant=_refuse_constant, parse_float=_finite_float)
    except RecursionError:
        raise ValueError(f"the JSON nests deeper than {MAX_JSON_DEPTH} levels") from None
    if json_depth(value) > MAX_JSON_DEPTH:
        raise ValueError(f"the JSON nests deeper than {MAX_JSON_DEPTH} levels")
    return value


async def read_json(request: web.Request, *, allow_empty: bool = False) -> Any:
    """The request body as JSON, or a 400 that says what was wrong."""
    raw = await request.read()
    if not raw.strip():
        if allow_empty:
            return {}
        raise ApiError(400, "invalid_json", "the request body is empty; send a JSON object")
    try:  # a large body is parsed off the event loop
        return parse_json(raw) if len(raw) < LARGE_BODY else await asyncio.to_thread(parse_json, raw)
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
        value = int(raw)
    except ValueError as exc:
        raise ApiError(
            400, "invalid_query", f"query parameter {name!r} must be an integer, got {raw[:40]!r}"
        ) from exc
    if abs(value) > MAX_QUERY_INT:
        raise ApiError(
            400, "invalid_query", f"query parameter {name!r} is out of range (at most {MAX_QUERY_INT})"
        )
    return value


def query_bool(request: web.Request, name: str, default: bool = False) -> bool:
    raw = request.query.get(name)
    if raw is None:
        return default
    return raw.lower() in ("1", "true", "yes", "on", "")


def add_routes(
    app: web.Application, routes: Iterable[tuple[str, str, Handler]], *, comfy: bool = True
) -> None:
    """Register ``(method, path, handler)``; ComfyUI routes also under ``/api``."""
    for method, path, handler in routes:
        app.router.add_route(method, path, handler)
        if comfy:
            app.router.add_route(method, "/api" + path, handler)
