"""The image station: load/save/preview, image and mask editing, filters, compositing, scaling, upscale models, safety checking, live previews."""

# The modules of this station that declare nodes (each has ``NODES``), in registration order.
NODE_MODULES: tuple[str, ...] = (
    "load_save",
    "safety",
    "upscale_model",
    "transforms",
    "filters",
    "compose",
    "scale",
    "files",
    "mask",
    "video",
    "video_edit",
    "save_advanced",
    "dataset_images",
    "bbox",
    "tiles",
    "color_space",
    "pad",
    "crop_to_mask",
    "bbox_ops",
    "video_cuts",
    "text_overlay",
    "color_transfer",
)
