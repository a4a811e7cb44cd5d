"""Stand-in for ComfyUI's ``comfy_execution`` package: ``graph_utils`` (node expansion, blockers)."""
