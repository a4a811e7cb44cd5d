"""ComfyUI's family-specific nodes (Flux, Flux.2, SD3, Z-Image, Qwen-Image), over the model layer in nodes/families."""

# The modules of this station that declare nodes (each has ``NODES``), in registration order.
NODE_MODULES: tuple[str, ...] = (
    "flux_nodes",
    "sd3_nodes",
    "zimage_nodes",
    "qwen_image_nodes",
    "flux2_nodes",
)
