"""Stand-in for ComfyUI's ``server`` module: ``PromptServer.instance`` for plugin packs.

Packs use ``PromptServer.instance.send_sync(event, data, sid)`` to push websocket messages and
``@PromptServer.instance.routes.get("/my_pack/...")`` to add HTTP routes; the routes land in the
bound shim's ``routes`` table, which Loom's server mounts. Loom loads a fresh copy of this file per
:class:`nodes.compat.shim.ComfyShim`; ``PromptServer.instance`` is that copy's one piece of state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aiohttp import web

    from nodes.compat.shim import ComfyShim


class BinaryEventTypes:
    PREVIEW_IMAGE = 1
    UNENCODED_PREVIEW_IMAGE = 2
    TEXT = 3


class PromptServer:
    """What packs reach through ``PromptServer.instance``."""

    instance: PromptServer

    def __init__(self, shim: ComfyShim) -> None:
        self._shim = shim
        self.supports = ["custom_nodes_from_web"]

    @property
    def routes(self) -> web.RouteTableDef:
        return self._shim.routes

    @property
    def client_id(self) -> str | None:
        return self._shim.client_id

    @property
    def last_node_id(self) -> str | None:
        return self._shim.last_node_id

    def send_sync(self, event: str, data: Any, sid: str | None = None) -> None:
        self._shim.send_event(event, data, sid)

    async def send_json(self, event: str, data: Any, sid: str | None = None) -> None:
        self._shim.send_event(event, data, sid)

    async def send(self, event: str, data: Any, sid: str | None = None) -> None:
        self._shim.send_event(event, data, sid)

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(
            f"PromptServer.instance.{name} is not provided by Loom; plugins may use send_sync(event, data, "
            "sid), routes (an aiohttp RouteTableDef), client_id and last_node_id"
        )


def _bind(shim: ComfyShim) -> None:
    PromptServer.instance = PromptServer(shim)
