"""Stand-in for ComfyUI's ``comfy_api.latest``: ``ComfyExtension``, ``io``/``IO`` and ``ui``/``UI``.

A V3 pack declares ``async def comfy_entrypoint() -> ComfyExtension``; Loom awaits it, then
``on_load()`` and ``get_node_list()``. Reference: Comfy-Org/ComfyUI ``comfy_api/latest/__init__.py``.
"""

from __future__ import annotations

from typing import Any

from nodes.compat.comfy_api_latest import io, ui

IO = io
UI = ui


class ComfyExtension:
    """Base of the object a pack's ``comfy_entrypoint()`` returns."""

    async def on_load(self) -> None:
        """Called once before ``get_node_list``."""

    async def get_node_list(self) -> list[type[Any]]:
        raise NotImplementedError(
            f"{type(self).__name__} must define async get_node_list() -> [node classes]"
        )


__all__ = ["IO", "UI", "ComfyExtension", "io", "ui"]
