"""Component kinds: one class per kind of module a family is made of. A family composes
instances of them (its ``denoiser``, ``vae`` and, per text encoder, a :class:`ClipText`); each
part of a handle names its kind, which owns the part's config-from-tensors, its key table in
both directions (``to_diffusers`` / ``to_original``) and its build (``empty`` for meta-device
construction, ``from_pretrained`` for diffusers folders). The text encoder kind also tokenizes
and encodes prompts; the denoiser kind also builds the forward's inputs for the sampler. Nodes
and the sampler talk to the kinds, never to a family by name."""

from __future__ import annotations

from typing import Any, Protocol

from nodes.core.parts import ModuleKind
from nodes.families.components.unet import UNetDenoiser
from nodes.families.components.vae_kl import KLVae


class TextEncoderKind(ModuleKind, Protocol):
    """A text encoder kind also loads its tokenizer from the shipped files (``models/configs``)."""

    def load_tokenizer(self, name: str) -> Any: ...


__all__ = ["KLVae", "ModuleKind", "TextEncoderKind", "UNetDenoiser"]
