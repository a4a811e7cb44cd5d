"""The latent station: empty latents, VAE encode/decode, latent arithmetic, batches, operations and .latent files."""

# The modules of this station that declare nodes (each has ``NODES``), in registration order.
NODE_MODULES: tuple[str, ...] = (
    "vae",
    "transforms",
    "operations",
    "operation_blend",
    "batch",
    "files",
    "video_latents",
    "latent_size",
    "resolution_bucket",
)
