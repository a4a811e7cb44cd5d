"""Plugins on the server: ``GET /api/v1/plugins``, packs' own HTTP routes, and their
``PromptServer.instance.send_sync`` messages delivered over the websocket.

The plugin report comes from ``engine.plugins.loader`` (``runtime.plugin_report``); its
``environment`` is the ComfyUI compatibility shim the packs were loaded with.
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any

from aiohttp import web

from engine.jobs.records import JobEvent, Notice
from engine.node import contained
from engine.server.common import Handler, json_error, json_response
from engine.server.ws import WsHub

log = logging.getLogger("loom.server.plugins")


class PluginRoutes:
    def __init__(self, report: Any) -> None:
        self.report = report

    def routes(self) -> list[tuple[str, str, Handler]]:
        return [("GET", "/api/v1/plugins", self.plugins)]

    async def plugins(self, request: web.Request) -> web.Response:
        if self.report is None:
            return json_response({"enabled": False, "packs": []})
        return json_response({"enabled": True, **self.report.to_json()})


def pack_of(handler: Any) -> str:
    """The plugin pack a route handler comes from (its module is ``loom_plugin_<pack>_<digest>``)."""
    module = str(getattr(handler, "__module__", "") or "")
    found = re.match(r"loom_plugin_(.+)_[0-9a-f]{10}(\.|$)", module)
    return found.group(1) if found else module or "an unknown pack"


def contained_route(route: Any) -> Any:
    """A pack's route whose handler cannot end the server: ``sys.exit()``, ``KeyboardInterrupt`` or
    an exception in it become a JSON 500 that names the pack (a plugin's bug, not Loom's)."""
    if not isinstance(route, web.RouteDef):
        return route
    handler, pack = route.handler, pack_of(route.handler)

    async def guarded(request: web.Request) -> web.StreamResponse:
        try:
            with contained(f"the route {request.method} {request.path} of plugin pack {pack!r}"):
                return await handler(request)  # type: ignore[no-any-return]
        except web.HTTPException:
            raise
        except Exception as exc:
            log.exception("plugin pack %r failed on %s %s", pack, request.method, request.path)
            return json_error(
                500,
                "plugin_route_failed",
                f"the plugin pack {pack!r} failed on this request "
                f"({type(exc).__name__}: {exc}); the server is fine, the pack needs fixing",
            )

    return web.RouteDef(route.method, route.path, guarded, route.kwargs)


class PluginBridge:
    """Connects the shim to the running server: pack routes, custom messages, current node."""

    def __init__(self, report: Any, hub: WsHub) -> None:
        self.environment = getattr(report, "environment", None) if report is not None else None
        self.hub = hub
        self.loop: asyncio.AbstractEventLoop | None = None

    def mount(self, app: web.Application) -> None:
        routes = getattr(self.environment, "routes", None)
        if routes is not None and len(routes):
            app.add_routes([contained_route(r) for r in routes])

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        if self.environment is not None:
            self.environment.event_sink = self.send_sync

    def on_prompt(self, json_data: dict[str, Any]) -> Any:
        """A ``POST /prompt`` body through the packs' on-prompt handlers (the shim's), if any."""
        apply = getattr(self.environment, "apply_on_prompt", None)
        return apply(json_data) if callable(apply) else json_data

    def send_sync(self, event: str, data: Any, sid: str | None = None) -> None:
        """``PromptServer.instance.send_sync`` from any thread (nodes run on the worker thread)."""
        if self.loop is None or self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.hub.send_custom, event, data, sid)

    def __call__(self, notice: Notice) -> None:
        """A relay sink: keep ``client_id`` / ``last_node_id`` current, as ComfyUI's PromptServer does."""
        if self.environment is None or not isinstance(notice, JobEvent):
            return
        if notice.event.type == "executing":
            self.environment.client_id = notice.spec.client_id
            self.environment.last_node_id = notice.event.data().get("node")
