"""A pack built on ComfyUI's model internals."""

from comfy.sd import load_checkpoint_guess_config  # noqa: F401

NODE_CLASS_MAPPINGS = {}
