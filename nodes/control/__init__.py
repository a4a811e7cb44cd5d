"""The control station: ControlNets, T2I-Adapters, model patches, IP-Adapter and image preprocessors."""

# The modules of this station that declare nodes (each has ``NODES``), in registration order.
NODE_MODULES: tuple[str, ...] = (
    "controlnet",
    "controlnet_union",
    "apply_variants",
    "preprocessors",
    "ipadapter",
    "model_patch",
)
