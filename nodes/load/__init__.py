"""The load station: checkpoint, component, LoRA, merge, save and stored-precision loader nodes, and the model handles they return."""

# The modules of this station that declare nodes (each has ``NODES``), in registration order.
NODE_MODULES: tuple[str, ...] = (
    "checkpoint_loaders",
    "component_loaders",
    "model_merge",
    "model_save",
    "lora_extract",
    "quant_loaders",
    "hook_nodes",
    "lora_bypass",
    "prompt_loras",
)
