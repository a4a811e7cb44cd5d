"""Stand-in for ComfyUI's ``comfy_execution`` package: only ``graph_utils.ExecutionBlocker``."""
