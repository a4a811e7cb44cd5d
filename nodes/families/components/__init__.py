"""Component kinds: one class per kind of module a family is made of. A family composes
instances of them (its ``denoiser``, ``vae`` and, per text encoder, a :class:`ClipText`); each
part of a handle names its kind, which owns the part's config-from-tensors, its key table in
both directions (``to_diffusers`` / ``to_original``) and its build (``empty`` for meta-device
construction, ``from_pretrained`` for diffusers folders). The text encoder kind also tokenizes
and encodes prompts; the denoiser kind also builds the forward's inputs for the sampler. Nodes
and the sampler talk to the kinds, never to a family by name."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from nodes.families.components.unet import UNetDenoiser
from nodes.families.components.vae_kl import KLVae


class ModuleKind(Protocol):
    """What building and saving a part needs from its kind."""

    @property
    def id(self) -> str:
        """Names the kind in handle keys and messages (``unet``, ``vae``, ``clip_text/open_clip``)."""
        ...

    def to_diffusers(self, sd: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
        """Inner single-file (original layout) keys → the module's ``state_dict`` names."""
        ...

    def to_original(self, sd: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
        """The module's ``state_dict`` → inner single-file keys (the inverse)."""
        ...

    def module_keys(self, sd: dict[str, Any]) -> dict[str, Any]:
        """Converted keys → the exact names of the module class (e.g. a nesting prefix)."""
        ...

    def empty(self, config: Mapping[str, Any]) -> Any:
        """The module from ``config`` (called under accelerate's empty-weights context)."""
        ...

    def from_pretrained(self, path: Path, safetensors: bool) -> Any:
        """The module from a diffusers/transformers subfolder."""
        ...


class TextEncoderKind(ModuleKind, Protocol):
    """A text encoder kind also loads its tokenizer from the shipped files (``models/configs``)."""

    def load_tokenizer(self, name: str) -> Any: ...


__all__ = ["KLVae", "ModuleKind", "TextEncoderKind", "UNetDenoiser"]
