"""Component kinds: one class per kind of module a family is made of. A family composes
instances of them (its ``denoiser``, ``vae`` and, per text encoder, a :class:`ClipText`); each
part of a handle names its kind, which owns the part's config-from-tensors, its key table in
both directions (``to_diffusers`` / ``to_original``) and its build (``empty`` for meta-device
construction, ``from_pretrained`` for diffusers folders). The text encoder kind also tokenizes
and encodes prompts; the denoiser kind also builds the forward's inputs for the sampler. Nodes
and the sampler talk to the kinds, never to a family by name."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from nodes.core.parts import ModuleKind
from nodes.families.components.unet import UNetDenoiser
from nodes.families.components.vae_kl import KLVae

if TYPE_CHECKING:
    from nodes.core.tensors import TensorIndex
    from nodes.families.latent_format import LatentFormat


class TextEncoderKind(ModuleKind, Protocol):
    """A text encoder kind also loads its tokenizer from the shipped files (``models/configs``)."""

    def load_tokenizer(self, name: str) -> Any: ...


class TextEncoderReader(Protocol):
    """How a family's text encoder spec reads a part: the kind for the encoder whose tensors start
    at ``prefix`` in ``index`` (some kinds take details from the file), and its config."""

    def kind_and_config(self, index: TensorIndex, prefix: str) -> tuple[Any, dict[str, Any]]: ...


class TransformerKind(ModuleKind, Protocol):
    """A diffusion transformer kind reads its config from the shapes under a prefix."""

    def config_from_tensors(self, index: TensorIndex, prefix: str) -> dict[str, Any]: ...


class VaeKind(ModuleKind, Protocol):
    """What a family and the standalone VAE loader ask a VAE kind. ``generic``: the kind reads any
    encoder/decoder pair (the KL VAE), so files are offered to it after the kinds with tensors of
    their own."""

    generic: ClassVar[bool]

    def present(self, index: TensorIndex, prefix: str) -> bool:
        """Whether a VAE of this kind is stored under ``prefix`` (an all-in-one checkpoint's)."""
        ...

    def file_prefix(self, index: TensorIndex) -> str | None:
        """Where a standalone VAE file of this kind keeps its tensors (None: not this kind's file)."""
        ...

    def file_config(self, index: TensorIndex, prefix: str) -> dict[str, Any]:
        """The config of a standalone VAE file of this kind."""
        ...

    def config_for(
        self, index: TensorIndex, prefix: str, latent: LatentFormat, sample_size: int
    ) -> dict[str, Any]:
        """The config of this kind's VAE under ``prefix`` for a model of ``latent`` and size."""
        ...

    def latent_channels(self, config: Mapping[str, Any]) -> int | None:
        """The channels of the latents the model sees (after the kind's own packing)."""
        ...


class ShapeConfiguredVae:
    """The :class:`VaeKind` methods of a kind whose config its tensors' shapes give whole (no latent
    scale or image size to pass in) and that has tensors of its own (not ``generic``)."""

    generic: ClassVar[bool] = False

    def config_from_tensors(self, index: TensorIndex, prefix: str) -> dict[str, Any]:
        raise NotImplementedError

    def file_config(self, index: TensorIndex, prefix: str) -> dict[str, Any]:
        return self.config_from_tensors(index, prefix)

    def config_for(
        self, index: TensorIndex, prefix: str, latent: LatentFormat, sample_size: int
    ) -> dict[str, Any]:
        return self.config_from_tensors(index, prefix)


@dataclass(frozen=True)
class EncoderFile:
    """How a standalone file of one text encoder (``title``, for messages) is recognised: its tensors
    start at ``prefix`` and ``marker`` is among them, ``unless`` (a tensor of a bigger encoder of the
    same layout) is not."""

    title: str
    prefix: str
    marker: str
    unless: str = ""

    def matches(self, index: TensorIndex) -> bool:
        return index.has(self.marker) and not (self.unless and index.has(self.unless))


__all__ = [
    "EncoderFile",
    "KLVae",
    "ModuleKind",
    "ShapeConfiguredVae",
    "TextEncoderKind",
    "TextEncoderReader",
    "TransformerKind",
    "UNetDenoiser",
    "VaeKind",
]
