"""Stand-in for ComfyUI's ``comfy_api`` package (installed as ``comfy_api`` while plugins load/run).

Only ``latest`` exists (``nodes.compat.comfy_api_latest``, installed as ``comfy_api.latest``); the
versioned names packs pin (``v0_0_2``, ``v0_0_3``) are the same module.
"""

from __future__ import annotations

from nodes.compat import comfy_api_latest as latest

v0_0_2 = latest
v0_0_3 = latest

__all__ = ["latest", "v0_0_2", "v0_0_3"]
