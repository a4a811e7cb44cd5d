"""Stand-in for ComfyUI's ``comfy_api`` package (installed as ``comfy_api`` while plugins load/run).

Only ``latest`` exists; the versioned names packs pin (``v0_0_2``, ``v0_0_3``) are the same module.
"""

from __future__ import annotations

from nodes.compat.comfy_api import latest

v0_0_2 = latest
v0_0_3 = latest

__all__ = ["latest", "v0_0_2", "v0_0_3"]
