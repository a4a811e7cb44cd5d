"""Component kinds: one class per kind of module a family is made of (denoiser, text encoders,
VAE). A family composes instances of them; nodes and the sampler talk to the kinds, never to a
family by name."""

from nodes.families.components.unet import UNetDenoiser

__all__ = ["UNetDenoiser"]
