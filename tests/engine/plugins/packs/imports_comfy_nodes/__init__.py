"""A pack that reaches for a name of ComfyUI's own nodes module that Loom does not answer."""

import nodes

BASE = nodes.load_custom_node
NODE_CLASS_MAPPINGS = {}
