"""Stand-ins for ComfyUI's small internal modules that hold no state: ``comfy.samplers``' name lists,
``comfy.comfy_types``, ``comfy.cli_args``, ``node_helpers`` and ``latent_preview``.

``nodes.compat.shim.ComfyShim.module_table`` installs them under ComfyUI's names while plugin packs
load and run; the stateful ones (``comfy.utils``, ``comfy.model_management``) are bound copies of
``nodes/compat/comfy_utils.py`` and ``comfy_model_management.py``.
"""
