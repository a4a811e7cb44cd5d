"""A pack that reaches for ComfyUI's own nodes module."""

import nodes

BASE = nodes.NODE_CLASS_MAPPINGS["KSampler"]
NODE_CLASS_MAPPINGS = {}
