"""The encode station: prompt encoding and conditioning editors, CLIP vision, style models, GLIGEN, unCLIP, InstructPix2Pix."""

# The modules of this station that declare nodes (each has ``NODES``), in registration order.
NODE_MODULES: tuple[str, ...] = (
    "conditioning",
    "conditioning_edit",
    "clip_vision",
    "style_model",
    "unclip",
    "ip2p",
    "gligen",
    "conditioning_props",
    "lotus",
    "conditioning_files",
)
