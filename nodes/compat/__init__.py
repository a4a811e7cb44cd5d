"""ComfyUI compatibility for plugin packs: stand-ins for ComfyUI's small public modules.

``shim.ComfyShim`` binds them to one Loom instance and installs them while packs load and run.
"""
