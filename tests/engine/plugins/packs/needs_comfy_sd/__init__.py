"""A pack built on ComfyUI's model internals."""

import comfy.sd  # noqa: F401

NODE_CLASS_MAPPINGS = {}
