"""Plugin packs: finding and loading them (``loader``), ComfyUI's two node styles adapted to
Loom's node definition (``comfy_v1``, ``comfy_v3``), and the report of what a workflow needs that
Loom lacks (``compat_check``)."""
