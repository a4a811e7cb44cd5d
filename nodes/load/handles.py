"""Model handles of a checkpoint's parts, and opening files into them.

The checkpoint parts are :class:`DenoiserHandle` (MODEL), :class:`TextEncodersHandle` (CLIP) and
:class:`VaeHandle` (VAE), each a :class:`ComponentHandle` built by the family's component kinds
from its parts; the handle base (``WeightsHandle``, ``WeightsSource``, ``Patch``) is
``nodes.core.handles``. The ``kind`` strings (``unet``, ``clip``, ``vae``, ...) are ComfyUI's
precision-flag vocabulary, which the manager's policy is keyed by.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, cast

import torch

from nodes.core.handles import HookedPatch, WeightsHandle, WeightsSource
from nodes.core.parts import Part
from nodes.core.sampling_hooks import SamplingHooks, merge_all
from nodes.core.tensors import ModelLoadError
from nodes.core.weights import fingerprint, read_index
from nodes.families.base import TextEncoderSpec
from nodes.families.build import build_from_diffusers, build_from_single_file
from nodes.families.catalog import (
    FamilyAdapter,
    detect_family,
    diffusers_family,
    family_for_clip_type,
    standalone_text_encoder,
    standalone_vae,
)
from nodes.families.components import TextEncoderKind
from nodes.families.components.clip_text import TextEncoders
from nodes.families.latent_format import LatentFormat
from nodes.families.prompt import TokenizerOptions

if TYPE_CHECKING:
    from nodes.diffusion.model_sampling import ModelSampling


@dataclass(frozen=True, kw_only=True)
class ComponentHandle(WeightsHandle):
    """A checkpoint part: built by the family's component kinds from ``parts`` (one module, or
    several text encoders)."""

    family: FamilyAdapter
    parts: tuple[Part, ...]

    def recipe(self) -> Any:
        return [
            [p.name, p.prefix, p.subfolder, p.config_json, *([p.file_id] if p.file else [])]
            for p in self.parts
        ]

    def build(self) -> Any:
        return self._assemble({p.name: self._build(p) for p in self.parts})

    def _build(self, part: Part) -> Any:
        if self.source.format == "diffusers":
            return build_from_diffusers(part, self.source.path, allow_pickle=self.source.allow_pickle)
        index = read_index(Path(part.file or self.source.path), allow_pickle=self.source.allow_pickle)
        return build_from_single_file(part, index)

    def _assemble(self, modules: dict[str, Any]) -> Any:
        (module,) = modules.values()
        return module

    def part(self, name: str) -> Part:
        for p in self.parts:
            if p.name == name:
                return p
        raise KeyError(f"{self.kind} handle has no part {name!r}")


@dataclass(frozen=True, kw_only=True)
class DenoiserHandle(ComponentHandle):
    """The MODEL value: the family's denoiser, how it predicts, how to sample it."""

    kind: ClassVar[str] = "unet"
    prediction: str = "epsilon"
    sampling_override: ModelSampling | None = field(default=None)  # with_model_sampling; not in ``key``

    @property
    def latent_format(self) -> LatentFormat:
        return self.family.latent_format

    @property
    def denoiser(self) -> Any:
        """The family's denoiser kind: ``conditioning``, ``forward``, ``check_conditioning``."""
        return self.family.denoiser

    @cached_property
    def model_sampling(self) -> ModelSampling:
        """The ModelSampling to sample with: the override, else the family's default for the
        checkpoint's prediction type. It does not change the weights, so it is not in ``key``."""
        if self.sampling_override is not None:
            return self.sampling_override
        return self.family.model_sampling(self.prediction)

    def with_model_sampling(self, model_sampling: ModelSampling) -> DenoiserHandle:
        """A new handle sampling with ``model_sampling`` (ModelSamplingDiscrete & co.)."""
        return replace(self, sampling_override=model_sampling)

    def stream_blocks(self, module: Any) -> list[Any]:
        """The denoiser's declared block stack (the one block-level step caches use) when its
        family declares one; otherwise the generic block list."""
        declared = getattr(self.denoiser, "block_stack", None)
        if callable(declared):
            return [block for block, _ in declared(module).blocks]
        return super().stream_blocks(module)

    def activation_bytes(self, module: Any, run: Any, dtype: str) -> int:
        """The denoiser kind's estimate for ``run`` on ``module`` (its width, heads and token count)
        in the compute ``dtype``; 0 for kinds that declare none (and modules without the config the
        kinds read their width from)."""
        estimate = getattr(self.denoiser, "activation_bytes", None)
        if not callable(estimate) or getattr(module, "config", None) is None:
            return 0
        element = torch.empty(0, dtype=getattr(torch, self.dtype or dtype)).element_size()
        return int(estimate(module, run, element))

    def resident_handles(self) -> list[Any]:
        """The handles this MODEL's patches need resident while it samples (a model patch's network,
        the VAE that encodes its image): a patch lists them as ``resident_handles``."""
        return [h for p in self.patches for h in getattr(p, "resident_handles", ())]

    def model_handles(self) -> list[Any]:
        return [self, *self.resident_handles()]

    def sampling_hooks(self, module: Any, resident: Mapping[str, Any] | None = None) -> SamplingHooks:
        """The hooks of this handle's patches for the resident ``module``, in patch order; a patch
        with ``resident_handles`` also gets ``resident`` (those handles' modules by handle key)."""
        return merge_all(
            [
                cast(Any, p).sampling_hooks(module, resident=resident)
                if getattr(p, "resident_handles", ())
                else p.sampling_hooks(module)
                for p in self.patches
                if isinstance(p, HookedPatch)
            ]
        )

    @property
    def default_resolution(self) -> int:
        return self.family.default_resolution(self.prediction)

    def scheduler_config(self) -> dict[str, Any]:
        return self.family.scheduler_config(self.prediction)


@dataclass(frozen=True, kw_only=True)
class TextEncodersHandle(ComponentHandle):
    """The CLIP value: the family's text encoder(s), loaded as one :class:`TextEncoders` module
    (``module["clip_l"]``, ``module.tokenizers``).

    ``layer`` is CLIPSetLastLayer's ``stop_at_clip_layer`` (None: the family's default);
    ``tokenizer_options`` are ComfyUI's ``set_tokenizer_option`` values (T5TokenizerOptions:
    ``("t5xxl_min_length", n)``...). Neither changes the weights, so neither is part of ``key``.
    """

    kind: ClassVar[str] = "clip"
    layer: int | None = None
    tokenizer_options: tuple[tuple[str, int], ...] = field(default=())
    dropped_layers: tuple[tuple[str, int], ...] = field(default=())  # diffusers folders may drop one
    # SetClipHooks' hooks (apply_to_conds): put on every conditioning encoded with this handle
    cond_hooks: Any = field(default=None)

    def _assemble(self, modules: dict[str, Any]) -> Any:
        # The tokenizers live with the loaded module (RAM tier included): building one costs ~1 s.
        # Each part's kind loads its own (CLIP BPE, T5 SentencePiece...).
        return TextEncoders(
            modules,
            {
                p.name: cast(TextEncoderKind, p.kind).load_tokenizer(self.family.spec(p.name).tokenizer)
                for p in self.parts
            },
        )

    def specs(self) -> tuple[TextEncoderSpec, ...]:
        return self.family.text_encoders

    def with_tokenizer_options(self, options: dict[str, int]) -> TextEncodersHandle:
        """A new handle with ``options`` (ComfyUI's flat names) set over the current ones."""
        return replace(
            self, tokenizer_options=tuple(sorted({**dict(self.tokenizer_options), **options}.items()))
        )

    def tokenizer_options_for(self, name: str) -> TokenizerOptions:
        """The tokenizer options of encoder ``name``."""
        return TokenizerOptions.from_flat(name, dict(self.tokenizer_options))

    def hidden_state_index(self, name: str) -> int:
        """Index into ``hidden_states`` (output_hidden_states=True) to use for encoder ``name``."""
        spec = self.family.spec(name)
        wanted = spec.default_layer if self.layer is None else self.layer
        dropped = dict(self.dropped_layers).get(name, 0)
        return min(-1, wanted + dropped)


@dataclass(frozen=True, kw_only=True)
class VaeHandle(ComponentHandle):
    """The VAE value."""

    kind: ClassVar[str] = "vae"


# --- opening files into handles ------------------------------------------------------------------
@dataclass(frozen=True)
class Checkpoint:
    """What a checkpoint loader returns: MODEL, CLIP and VAE handles."""

    unet: DenoiserHandle
    clip: TextEncodersHandle
    vae: VaeHandle


def open_checkpoint(path: Path, *, allow_pickle: bool = False) -> Checkpoint:
    """Handles for a single-file checkpoint (reads the header only; no weights)."""
    index = read_index(path, allow_pickle=allow_pickle)
    family = detect_family(index)
    parts = family.parts(index)
    source = WeightsSource(Path(path), fingerprint(path), "single_file", allow_pickle)

    def size(ps: tuple[Part, ...]) -> int:
        return sum(index.nbytes(p.prefix) for p in ps)

    prediction = family.prediction_type(index)
    return Checkpoint(
        DenoiserHandle(
            source=source,
            family=family,
            parts=parts["unet"],
            nbytes=size(parts["unet"]),
            prediction=prediction,
        ),
        TextEncodersHandle(source=source, family=family, parts=parts["clip"], nbytes=size(parts["clip"])),
        VaeHandle(source=source, family=family, parts=parts["vae"], nbytes=size(parts["vae"])),
    )


def open_diffusers(folder: Path, *, allow_pickle: bool = False) -> Checkpoint:
    """Handles for a diffusers folder (``model_index.json`` + component subfolders)."""
    folder = Path(folder)

    def config(sub: str) -> dict[str, Any]:
        path = folder / sub
        try:
            return dict(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError) as exc:
            raise ModelLoadError(
                f"{folder}: cannot read {sub} ({exc}); is this a diffusers model folder?"
            ) from exc

    unet = config("unet/config.json") if (folder / "unet").is_dir() else {}  # DiT pipelines have transformer/
    family = diffusers_family(folder, config("model_index.json"), unet)
    sched = config("scheduler/scheduler_config.json") if (folder / "scheduler").is_dir() else {}
    prediction = str(sched.get("prediction_type", "epsilon"))
    source = WeightsSource(folder, fingerprint(folder), "diffusers", allow_pickle)
    parts, dropped = family.diffusers_parts(config)

    def size(ps: tuple[Part, ...]) -> int:
        return sum(p.stat().st_size for part in ps for p in (folder / part.subfolder).glob("*.safetensors"))

    return Checkpoint(
        DenoiserHandle(
            source=source,
            family=family,
            parts=parts["unet"],
            nbytes=size(parts["unet"]),
            prediction=prediction,
        ),
        TextEncodersHandle(
            source=source,
            family=family,
            parts=parts["clip"],
            nbytes=size(parts["clip"]),
            dropped_layers=dropped,
        ),
        VaeHandle(source=source, family=family, parts=parts["vae"], nbytes=size(parts["vae"])),
    )


def open_vae(path: Path, *, allow_pickle: bool = False) -> VaeHandle:
    """A standalone VAE file: original layout with or without ``first_stage_model.``, or diffusers keys."""
    index = read_index(path, allow_pickle=allow_pickle)
    family, part = standalone_vae(index)
    source = WeightsSource(Path(path), fingerprint(path), "single_file", allow_pickle)
    return VaeHandle(source=source, family=family, parts=(part,), nbytes=index.nbytes(part.prefix))


def open_diffusion_model(
    path: Path, *, allow_pickle: bool = False, dtype: str | None = None
) -> DenoiserHandle:
    """A denoiser-only file (``models/diffusion_models``, UNETLoader): its family reads the part."""
    index = read_index(path, allow_pickle=allow_pickle)
    family = detect_family(index)
    part = family.denoiser_part(index)
    source = WeightsSource(Path(path), fingerprint(path), "single_file", allow_pickle)
    return DenoiserHandle(
        source=source,
        family=family,
        parts=(part,),
        nbytes=index.nbytes(part.prefix),
        prediction=family.prediction_type(index),
        dtype=dtype,
    )


def open_text_encoders(
    paths: list[Path], clip_type: str, *, allow_pickle: bool = False
) -> TextEncodersHandle:
    """Standalone text-encoder files (``models/text_encoders``; CLIPLoader, DualCLIPLoader) for the
    family of ComfyUI's ``type``; each file's encoder is recognised from its tensors."""
    indexes = [read_index(path, allow_pickle=allow_pickle) for path in paths]
    found = [standalone_text_encoder(index) for index in indexes]
    family = family_for_clip_type(clip_type, tuple(name for name, _ in found))
    parts: list[Part] = []
    nbytes = 0
    for path, index, (name, prefix) in zip(paths, indexes, found, strict=True):
        if any(p.name == name for p in parts):
            raise ModelLoadError(
                f"{path.name} is a second {name} text encoder; {family.title} takes one "
                f"of each of {[s.name for s in family.text_encoders]}"
            )
        if name not in [s.name for s in family.text_encoders]:
            raise ModelLoadError(
                f"{Path(path).name} is a {name} text encoder; {family.title} uses "
                f"{[s.name for s in family.text_encoders]}"
            )
        parts.append(family.text_encoder_part(family.spec(name), index, prefix).in_file(Path(path)))
        nbytes += index.nbytes(prefix)
    source = WeightsSource(Path(paths[0]), fingerprint(paths[0]), "single_file", allow_pickle)
    return TextEncodersHandle(source=source, family=family, parts=tuple(parts), nbytes=nbytes)
