"""The sample station: KSampler and custom sampling, guiders, SAMPLER/SIGMAS nodes, model-sampling nodes, conditioning batching."""

# The modules of this station that declare nodes (each has ``NODES``), in registration order.
NODE_MODULES: tuple[str, ...] = (
    "ksampler",
    "batched",
    "sampler_nodes",
    "sigma_nodes",
    "custom_sampling",
    "model_sampling_nodes",
)
