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
        self.app = PackApp(shim)
        self.prompt_queue = PackPromptQueue()

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

    def send_progress_text(self, text: str, node_id: str, sid: str | None = None) -> None:
        """ComfyUI's text shown under a running node: a ``progress_text`` message to the client."""
        self._shim.send_event("progress_text", {"node_id": str(node_id), "text": str(text)}, sid)

    def add_on_prompt_handler(self, handler: Any) -> None:
        """``handler(json_data) -> json_data`` runs on every ``POST /prompt`` body before it is read,
        as in ComfyUI (rgthree, use-everywhere and Impact rewrite prompts there)."""
        self._shim.on_prompt_handlers.append(handler)

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(
            f"PromptServer.instance.{name} is not provided by Loom; plugins may use send_sync(event, data, "
            "sid), send_progress_text(text, node_id), routes (an aiohttp RouteTableDef), app.add_routes, "
            "add_on_prompt_handler(fn), prompt_queue, client_id and last_node_id"
        )


class PackRouter:
    """``PromptServer.instance.app.router`` as packs use it: never frozen while packs load; routes
    added here land in the shim's table, which Loom's server mounts."""

    frozen = False

    def __init__(self, shim: ComfyShim) -> None:
        self._shim = shim

    def add_route(self, method: str, path: str, handler: Any, **kwargs: Any) -> None:
        self._shim.routes.route(method, path, **kwargs)(handler)

    def add_get(self, path: str, handler: Any, **kwargs: Any) -> None:
        self.add_route("GET", path, handler, **kwargs)

    def add_post(self, path: str, handler: Any, **kwargs: Any) -> None:
        self.add_route("POST", path, handler, **kwargs)

    def add_static(self, prefix: str, path: Any, **kwargs: Any) -> None:
        self._shim.routes.static(prefix, str(path), **kwargs)


class PackApp:
    """``PromptServer.instance.app``: ``add_routes`` and ``router`` reach the shim's route table."""

    def __init__(self, shim: ComfyShim) -> None:
        self._shim = shim
        self.router = PackRouter(shim)

    def add_routes(self, routes: Any) -> None:
        for route in routes:
            if hasattr(route, "handler"):  # an aiohttp RouteDef
                self.router.add_route(route.method, route.path, route.handler, **route.kwargs)
            else:  # a StaticDef
                self.router.add_static(route.prefix, route.path, **route.kwargs)


class PackPromptQueue:
    """``PromptServer.instance.prompt_queue`` for the packs that peek at it: Loom's queue is its job
    queue (``/queue``), so this one reports nothing running or pending."""

    def get_current_queue(self) -> tuple[list[Any], list[Any]]:
        return [], []

    def get_tasks_remaining(self) -> int:
        return 0


def _bind(shim: ComfyShim) -> None:
    PromptServer.instance = PromptServer(shim)
