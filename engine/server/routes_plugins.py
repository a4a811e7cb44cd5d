"""Plugins on the server: ``GET /api/v1/plugins``, packs' own HTTP routes, and their
``PromptServer.instance.send_sync`` messages delivered over the websocket.

The plugin report comes from ``engine.plugins`` (``runtime.plugin_report``); its
``environment`` is the ComfyUI compatibility shim the packs were loaded with.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import web

from engine.jobs import JobEvent, Notice
from engine.server.common import Handler, json_response
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


class PluginBridge:
    """Connects the shim to the running server: pack routes, custom messages, current node."""

    def __init__(self, report: Any, hub: WsHub) -> None:
        self.environment = getattr(report, "environment", None) if report is not None else None
        self.hub = hub
        self.loop: asyncio.AbstractEventLoop | None = None

    def mount(self, app: web.Application) -> None:
        routes = getattr(self.environment, "routes", None)
        if routes is not None and len(routes):
            app.add_routes(routes)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        if self.environment is not None:
            self.environment.event_sink = self.send_sync

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
