"""A pack that reaches for a name of ComfyUI's own nodes module that Loom does not answer."""

import nodes

BASE = nodes.common_ksampler
NODE_CLASS_MAPPINGS = {}
