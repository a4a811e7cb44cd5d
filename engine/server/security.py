"""Who may talk to the server, and which files a request may touch.

- A non-loopback bind needs an access token unless ``insecure`` was chosen explicitly
  (:func:`check_bind`).
- ``Host`` must name this server (loopback, the bound host or an allowed name): a page that
  re-binds its own DNS name to 127.0.0.1 is refused.
- A request carrying a foreign ``Origin`` (another web site open in the user's browser) is
  refused, whatever its method: it can neither queue work, open the websocket nor read files.
  Pages of origins ``--allow-origin`` admits get CORS headers on every answer and their
  preflight ``OPTIONS`` answered (ComfyUI's ``--enable-cors-header``).
- Paths from requests are joined under their folder only (:func:`safe_path`): no ``..``, no
  absolute paths, no symlinks leading out.
- Every failure is a JSON ``{"error": {...}}`` response; an unexpected exception becomes a 500
  JSON response, is logged and counted (tests assert the count stays zero).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from aiohttp import web

from engine.jobs.store import StorageError
from engine.node import PluginExit, describe_exit
from engine.server.common import (
    LOOPBACK_HOSTS,
    MAX_NAME_BYTES,
    ApiError,
    Handler,
    ServerConfig,
    json_error,
    json_response,
    os_error,
    storage_error,
)

log = logging.getLogger("loom.server")
TOKEN_COOKIE = "loom_token"


class InsecureBindError(RuntimeError):
    """Refusal to listen on a non-loopback address without an access token."""


@dataclass
class ErrorCounter:
    """Unexpected exceptions turned into 500 responses (should stay 0)."""

    count: int = 0


ERRORS = web.AppKey("loom_errors", ErrorCounter)


def is_loopback(host: str) -> bool:
    host = host.strip("[]")
    if host in LOOPBACK_HOSTS:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(config: ServerConfig) -> None:
    """Raise :class:`InsecureBindError` unless the bind address is safe or explicitly allowed."""
    if is_loopback(config.host) or config.token or config.insecure:
        return
    raise InsecureBindError(
        f"refusing to listen on {config.host}: anyone who can reach this address could run workflows "
        "and read your files. Give an access token (--token SECRET; clients send 'Authorization: Bearer "
        "SECRET' or '?token=SECRET'), bind to 127.0.0.1, or pass --insecure if you really mean it."
    )


def _hostname(value: str) -> str:
    """The host part of a ``Host`` header or an origin URL, without port and brackets."""
    if "://" in value:
        return (urlsplit(value).hostname or "").lower()
    value = value.strip()
    if value.startswith("["):
        return value[1 : value.find("]")].lower() if "]" in value else value.lower()
    if value.count(":") == 1:
        value = value.split(":", 1)[0]
    return value.lower()


def origin_key(origin: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) of an origin URL, the port filled in from the scheme's default."""
    parts = urlsplit(origin.strip().lower())
    try:
        port = parts.port
    except ValueError:
        return (parts.scheme, "", None)
    default = {"http": 80, "https": 443}.get(parts.scheme)
    return (parts.scheme, (parts.hostname or "").strip("[]"), port if port is not None else default)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


CORS_METHODS = "POST, GET, DELETE, PUT, PATCH, OPTIONS"
CORS_HEADERS = "Content-Type, Authorization"


class RequestGuard:
    """The HTTP middlewares that guard every request (host, origin, token; errors as JSON), holding
    only the configuration they check against. (Images leaving Loom are guarded by
    ``engine.image_guard.ImageGuard``, a different thing.)"""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        names = {h.lower() for h in config.allowed_hosts}
        if config.host not in ("0.0.0.0", "::", ""):
            names.add(config.host.lower().strip("[]"))
        self.allowed_names = frozenset(names)
        self.open_bind = not is_loopback(config.host)

    def host_allowed(self, host: str) -> bool:
        if not host:
            return False
        if is_loopback(host) or host in self.allowed_names:
            return True
        # Bound to a LAN address on purpose: IP literals cannot be DNS-rebound.
        return self.open_bind and _is_ip(host)

    @web.middleware
    async def errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            response = await handler(request)
            if response.status >= 400 and isinstance(response, web.Response) and not response.body:
                kind = (response.reason or "error").lower().replace(" ", "_")
                return json_error(response.status, kind, response.reason or kind, path=request.path)
            return response
        except ApiError as exc:
            return json_response(exc.body(), status=exc.status)
        except (
            StorageError
        ) as exc:  # the job database cannot be written (a full disk): not the client's fault
            error = storage_error(exc)
            return json_response(error.body(), status=error.status)
        except (asyncio.CancelledError, ConnectionResetError):
            raise
        except OSError as exc:  # a full disk, a name too long, a folder where a file was meant ...
            answer = os_error(exc)
            if answer is None:
                return self._bug(request, exc)
            return json_response(answer.body(), status=answer.status)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            kind = (exc.reason or "error").lower().replace(" ", "_")
            message = exc.text if exc.text and not exc.text.startswith(f"{exc.status}:") else exc.reason
            return json_error(exc.status, kind, message or kind, path=request.path)
        except Exception as exc:
            return self._bug(request, exc)
        except (SystemExit, KeyboardInterrupt) as exc:  # code under a handler must never end the server
            return self._bug(request, PluginExit(f"{request.method} {request.path} {describe_exit(exc)}"))

    @staticmethod
    def _bug(request: web.Request, exc: Exception) -> web.Response:
        request.app[ERRORS].count += 1
        log.exception("unexpected error handling %s %s", request.method, request.path, exc_info=exc)
        return json_error(
            500,
            "internal_error",
            f"the server failed on this request ({type(exc).__name__}); "
            "this is a bug in Loom: the log has the details",
        )

    @web.middleware
    async def access(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if self._admitted_preflight(request):
            return web.Response(status=200)  # headers: add_cors_headers, as for every response
        token_from_query = False
        if self.config.token is not None:
            given = request.query.get("token")
            token_from_query = self.config.token_matches(given)
            header = request.headers.get("Authorization", "")
            bearer = header[7:].strip() if header.lower().startswith("bearer ") else None
            if not (
                token_from_query
                or self.config.token_matches(bearer)
                or self.config.token_matches(request.cookies.get(TOKEN_COOKIE))
            ):
                raise ApiError(
                    401,
                    "unauthorized",
                    "this server requires an access token: send "
                    "'Authorization: Bearer TOKEN' or add '?token=TOKEN' to the URL",
                )
        else:
            host = _hostname(request.headers.get("Host", ""))
            if not self.host_allowed(host):
                raise ApiError(
                    403,
                    "host_not_allowed",
                    f"Host {host!r} is not this server's name; "
                    f"use http://127.0.0.1, or start the server with --allow-host {host} "
                    "to accept that name",
                )
        origin = request.headers.get("Origin")
        if origin is not None and not self._origin_allowed(origin, request):
            raise ApiError(
                403,
                "cross_origin",
                f"requests from the web page at {origin!r} are refused: "
                "only pages served by this server may use its API; to allow that page, start the "
                f"server with --allow-origin {origin}",
            )
        if (
            origin is None
            and request.headers.get("Sec-Fetch-Site") == "cross-site"
            and request.method not in ("GET", "HEAD")
        ):
            raise ApiError(403, "cross_origin", "cross-site requests are refused")
        response = await handler(request)
        if token_from_query and self.config.token and not response.prepared:
            response.set_cookie(TOKEN_COOKIE, self.config.token, httponly=True, samesite="Strict")
        return response

    def _admitted_preflight(self, request: web.Request) -> bool:
        """A browser's CORS preflight from a page ``--allow-origin`` admits (it carries no token,
        so it is answered before the token check; the Host rule still holds without a token)."""
        origin = request.headers.get("Origin")
        if (
            request.method != "OPTIONS"
            or not self.config.allowed_origins
            or origin is None
            or "Access-Control-Request-Method" not in request.headers
        ):
            return False
        host_ok = self.config.token is not None or self.host_allowed(
            _hostname(request.headers.get("Host", ""))
        )
        return host_ok and self._origin_allowed(origin, request)

    async def add_cors_headers(self, request: web.Request, response: web.StreamResponse) -> None:
        """``on_response_prepare``: with ``--allow-origin``, every answer to an admitted page (errors
        and streams included) says so, as ComfyUI's ``--enable-cors-header`` does; the origin is
        echoed, so several origins (or ``*``) work with credentials."""
        origin = request.headers.get("Origin")
        if not self.config.allowed_origins or origin is None or not self._origin_allowed(origin, request):
            return
        response.headers["Access-Control-Allow-Origin"] = origin
        response.headers["Access-Control-Allow-Methods"] = CORS_METHODS
        response.headers["Access-Control-Allow-Headers"] = CORS_HEADERS
        response.headers["Access-Control-Allow-Credentials"] = "true"
        vary = response.headers.get("Vary")
        if vary is None:
            response.headers["Vary"] = "Origin"
        elif "origin" not in vary.lower():
            response.headers["Vary"] = f"{vary}, Origin"

    def _origin_allowed(self, origin: str, request: web.Request) -> bool:
        """The page's origin must be this server's own (host and port, as the ``Host`` header names
        them; ComfyUI's rule) or one of ``allowed_origins`` (``--allow-origin``; ``*`` for any)."""
        if origin == "null" or not _hostname(origin):
            return False
        wanted = origin_key(origin)
        if "*" in self.config.allowed_origins or wanted in {
            origin_key(o) for o in self.config.allowed_origins
        }:
            return True
        scheme = "https" if request.secure else "http"
        return wanted == origin_key(f"{scheme}://{request.headers.get('Host', '')}")


def safe_path(base: Path, *parts: str) -> Path:
    """``base/parts...``, refusing traversal, absolute paths and symlinks that lead out of ``base``."""
    segments: list[str] = []
    for part in parts:
        if not isinstance(part, str):
            raise ApiError(400, "invalid_path", "path parts must be strings")
        if "\x00" in part:
            raise ApiError(400, "invalid_path", "path contains a NUL byte")
        if part.startswith(("/", "\\")) or os.path.isabs(part) or (len(part) > 1 and part[1] == ":"):
            raise ApiError(
                400,
                "invalid_path",
                f"absolute paths are refused: {part!r}; give a name relative to the folder",
            )
        for seg in part.replace("\\", "/").split("/"):
            if seg == "..":
                raise ApiError(
                    400, "invalid_path", f"'..' is refused in {part!r}: paths stay inside their folder"
                )
            if len(seg.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
                raise ApiError(
                    400,
                    "name_too_long",
                    f"the name {seg[:40]!r}... is longer than {MAX_NAME_BYTES} "
                    "bytes, which file systems refuse; give a shorter name",
                )
            if seg not in ("", "."):
                segments.append(seg)
    candidate = base.joinpath(*segments)
    real_base = os.path.realpath(base)
    real = os.path.realpath(candidate)
    if os.path.commonpath([real, real_base]) != real_base:
        raise ApiError(403, "path_outside_folder", "this path leads outside its folder (a symlink?); refused")
    return candidate
