"""Model handles: the light, immutable values that flow along MODEL / CLIP / VAE links.

A handle says where a component's weights live (file + fingerprint), how to build it (family,
parts with their configs) and which patches apply (LoRA, later IP-Adapter, ToMe). It holds no
weights: ``ModelManager.use(handle)`` calls ``handle.load()`` when the weights are needed.
Patching returns a new handle (``with_patch``), so a cached output never changes behind the
cache's back. ``key`` is the content identity the manager caches modules by.

The MODEL value is a :class:`UNetHandle` (it knows its family, prediction type and latent scale).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

from nodes.families import FamilyAdapter, Part, read_index
from nodes.families.base import CONFIGS_DIR, TextEncoderSpec
from nodes.families.build import build_from_diffusers, build_from_single_file
from nodes.families.latent_format import LatentFormat
from nodes.hooks import SamplingHooks, merge_all


@runtime_checkable
class Patch(Protocol):
    """A change applied to a freshly built module (in place), e.g. a LoRA merged into weights."""

    @property
    def key(self) -> str:
        """Identity of the patch (file fingerprint, strengths): part of the handle's key."""
        ...

    def apply(self, module: Any, handle: ComponentHandle) -> None: ...


@runtime_checkable
class HookedPatch(Patch, Protocol):
    """A patch that also acts while the sampler runs (see ``nodes.hooks``)."""

    def sampling_hooks(self, module: Any) -> SamplingHooks:
        """The hooks for the resident, patched ``module`` (they may keep state found on it)."""
        ...


@dataclass(frozen=True)
class WeightsSource:
    """A single-file checkpoint (original layout) or a diffusers folder."""

    path: Path
    fingerprint: str
    format: str  # "single_file" | "diffusers"
    allow_pickle: bool = False

    @property
    def name(self) -> str:
        return self.path.name


@dataclass(frozen=True)
class ComponentHandle:
    """Base of the handles. ``parts`` are the modules to build (one, or several text encoders)."""

    kind: ClassVar[str] = "model"
    source: WeightsSource
    family: FamilyAdapter
    parts: tuple[Part, ...]
    nbytes: int
    patches: tuple[Patch, ...] = ()
    dtype: str | None = None  # overrides the manager's dtype policy for this handle

    # --- identity -------------------------------------------------------------------------------
    @cached_property
    def key(self) -> str:
        ident = {
            "kind": self.kind, "file": self.source.fingerprint, "format": self.source.format,
            "parts": [[p.name, p.prefix, p.subfolder, p.config_json] for p in self.parts],
            "patches": [p.key for p in self.patches],
        }
        digest = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]
        return f"{self.kind}:{self.source.name}:{digest}"

    def with_patch(self, patch: Patch) -> Any:
        """A new handle with ``patch`` appended (this one is unchanged)."""
        return replace(self, patches=(*self.patches, patch))

    # --- ModelHandleLike ------------------------------------------------------------------------
    def estimate_bytes(self) -> int:
        return self.nbytes

    def load(self) -> Any:
        from nodes.families.build import EMPTY_INIT_LOCK

        with EMPTY_INIT_LOCK:  # patches may create parameters too (IP-Adapter): see EMPTY_INIT_LOCK
            modules = {p.name: self._build(p) for p in self.parts}
            module = self._assemble(modules)
            for patch in self.patches:
                patch.apply(module, self)
        return module

    def to_device(self, module: Any, device: str, dtype: str) -> Any:
        import torch

        target_device, target_dtype = torch.device(device), getattr(torch, self.dtype or dtype)
        tensors = [*module.parameters(), *module.buffers()]
        if all(t.device == target_device and (t.dtype == target_dtype or not t.is_floating_point()) for t in tensors):
            return module
        # nn.Module.to, not diffusers' override (it warns on every cast of modules without fp32 parts)
        return torch.nn.Module.to(module, device=target_device, dtype=target_dtype)

    # --- helpers --------------------------------------------------------------------------------
    def _build(self, part: Part) -> Any:
        if self.source.format == "diffusers":
            return build_from_diffusers(part, self.source.path, allow_pickle=self.source.allow_pickle)
        index = read_index(self.source.path, allow_pickle=self.source.allow_pickle)
        return build_from_single_file(part, index)

    def _assemble(self, modules: dict[str, Any]) -> Any:
        (module,) = modules.values()
        return module

    def part(self, name: str) -> Part:
        for p in self.parts:
            if p.name == name:
                return p
        raise KeyError(f"{self.kind} handle has no part {name!r}")

    def model_handles(self) -> list[Any]:
        return [self]


@dataclass(frozen=True)
class UNetHandle(ComponentHandle):
    """The MODEL value: a denoising UNet, its family and how it predicts."""

    kind: ClassVar[str] = "unet"
    prediction: str = "epsilon"
    sampling_override: Any = field(default=None)  # set by with_model_sampling; not part of ``key``

    @property
    def latent_format(self) -> LatentFormat:
        return self.family.latent_format

    @property
    def denoiser(self) -> Any:
        """The family's denoiser kind: ``conditioning``, ``forward``, ``check_conditioning``."""
        return self.family.denoiser

    @cached_property
    def model_sampling(self) -> Any:
        """The ModelSampling to sample with: the override, else the family's default for the
        checkpoint's prediction type. It does not change the weights, so it is not in ``key``."""
        if self.sampling_override is not None:
            return self.sampling_override
        return self.family.model_sampling(self.prediction)

    def with_model_sampling(self, model_sampling: Any) -> UNetHandle:
        """A new handle sampling with ``model_sampling`` (ModelSamplingDiscrete & co.)."""
        return replace(self, sampling_override=model_sampling)

    def sampling_hooks(self, module: Any) -> SamplingHooks:
        """The hooks of this handle's patches for the resident ``module``, in patch order."""
        return merge_all([p.sampling_hooks(module) for p in self.patches if isinstance(p, HookedPatch)])

    @property
    def default_resolution(self) -> int:
        return self.family.default_resolution(self.prediction)

    def scheduler_config(self) -> dict[str, Any]:
        return self.family.scheduler_config(self.prediction)


@dataclass(frozen=True)
class ClipHandle(ComponentHandle):
    """The CLIP value: the family's text encoder(s) as one module dict (``module["clip_l"]``).

    ``layer`` is CLIPSetLastLayer's ``stop_at_clip_layer`` (None: the family's default). It does
    not change the weights, so it is not part of ``key``.
    """

    kind: ClassVar[str] = "clip"
    layer: int | None = None
    dropped_layers: tuple[tuple[str, int], ...] = field(default=())  # diffusers SD2 drops one

    def _assemble(self, modules: dict[str, Any]) -> Any:
        import torch

        assembled = torch.nn.ModuleDict(modules)
        # The tokenizers live with the loaded module (RAM tier included): building one costs ~1 s.
        object.__setattr__(assembled, "tokenizers", self.tokenizers())
        return assembled

    def specs(self) -> tuple[TextEncoderSpec, ...]:
        return self.family.text_encoders

    def hidden_state_index(self, name: str) -> int:
        """Index into ``hidden_states`` (output_hidden_states=True) to use for encoder ``name``."""
        spec = self.family.spec(name)
        wanted = spec.default_layer if self.layer is None else self.layer
        dropped = dict(self.dropped_layers).get(name, 0)
        return min(-1, wanted + dropped)

    def tokenizers(self) -> dict[str, Any]:
        return {s.name: load_tokenizer(s.tokenizer) for s in self.specs()}


@dataclass(frozen=True)
class VAEHandle(ComponentHandle):
    kind: ClassVar[str] = "vae"


def load_tokenizer(name: str) -> Any:
    """A CLIP tokenizer from the shipped files: ``models/configs/clip_tokenizer`` vocabulary with
    the settings of ``models/configs/<name>/tokenizer_config.json`` (e.g. SDXL's pad ``!``)."""
    from transformers import CLIPTokenizer

    tokenizer = CLIPTokenizer.from_pretrained(CONFIGS_DIR / "clip_tokenizer", local_files_only=True)
    if name != "clip_tokenizer":
        settings = json.loads((CONFIGS_DIR / name / "tokenizer_config.json").read_text(encoding="utf-8"))
        # Set after loading: the pad id becomes 0 while a "!" typed in a prompt still tokenizes as
        # "!</w>" (256), as in OpenCLIP and ComfyUI. (Passed to from_pretrained, "!" would become
        # a special token and prompt text "!" would turn into padding, as in diffusers.)
        tokenizer.pad_token = settings.get("pad_token", tokenizer.pad_token)
    return tokenizer


# --- opening files into handles ------------------------------------------------------------------
@dataclass(frozen=True)
class Checkpoint:
    """What a checkpoint loader returns: MODEL, CLIP and VAE handles."""

    unet: UNetHandle
    clip: ClipHandle
    vae: VAEHandle


def open_checkpoint(path: Path, *, allow_pickle: bool = False) -> Checkpoint:
    """Handles for a single-file checkpoint (reads the header only; no weights)."""
    from nodes.families import detect_family
    from nodes.families.files import fingerprint

    index = read_index(path, allow_pickle=allow_pickle)
    family = detect_family(index)
    parts = family.parts(index)
    source = WeightsSource(Path(path), fingerprint(path), "single_file", allow_pickle)

    def size(ps: tuple[Part, ...]) -> int:
        return sum(index.nbytes(p.prefix) for p in ps)

    prediction = family.prediction_type(index)
    return Checkpoint(
        UNetHandle(source, family, parts["unet"], size(parts["unet"]), prediction=prediction),
        ClipHandle(source, family, parts["clip"], size(parts["clip"])),
        VAEHandle(source, family, parts["vae"], size(parts["vae"])),
    )


def open_diffusers(folder: Path, *, allow_pickle: bool = False) -> Checkpoint:
    """Handles for a diffusers folder (``model_index.json`` + component subfolders)."""
    from nodes.families import FAMILIES, ModelLoadError
    from nodes.families.files import fingerprint

    folder = Path(folder)

    def config(sub: str) -> dict[str, Any]:
        path = folder / sub
        try:
            return dict(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"{folder}: cannot read {sub} ({exc}); is this a diffusers model folder?") from exc

    model_index, unet_cfg = config("model_index.json"), config("unet/config.json")
    family = next((cls() for cls in FAMILIES if cls.detect_diffusers(model_index, unet_cfg)), None)
    if family is None:
        raise ModelLoadError(f"{folder}: pipeline {model_index.get('_class_name')!r} is not SD1.x, SD2.x or SDXL")
    sched = config("scheduler/scheduler_config.json") if (folder / "scheduler").is_dir() else {}
    prediction = str(sched.get("prediction_type", "epsilon"))
    source = WeightsSource(folder, fingerprint(folder), "diffusers", allow_pickle)

    def size(sub: str) -> int:
        return sum(p.stat().st_size for p in (folder / sub).glob("*.safetensors"))

    unet = Part.make("unet", "unet", "unet", family.unet_prefix, "unet", unet_cfg)
    vae = Part.make("vae", "vae", "vae", family.vae_prefix, "vae", config("vae/config.json"))
    clips, dropped = [], []
    for spec in family.text_encoders:
        cfg = config(f"{spec.subfolder}/config.json")
        builder = "clip_projection" if "WithProjection" in str(cfg.get("architectures", "")) else "clip"
        clips.append(Part.make(spec.name, builder, spec.layout, spec.prefix, spec.subfolder, cfg))
        if spec.layout == "open_clip" and family.name == "sd2" and cfg.get("num_hidden_layers") == 23:
            dropped.append((spec.name, 1))  # diffusers' SD2 folders drop ViT-H's last layer
    return Checkpoint(
        UNetHandle(source, family, (unet,), size("unet"), prediction=prediction),
        ClipHandle(source, family, tuple(clips), sum(size(s.subfolder) for s in family.text_encoders),
                   dropped_layers=tuple(dropped)),
        VAEHandle(source, family, (vae,), size("vae")),
    )


def open_vae(path: Path, *, allow_pickle: bool = False) -> VAEHandle:
    """A standalone VAE file: original layout with or without ``first_stage_model.``, or diffusers keys."""
    from nodes.families import SD15, ModelLoadError, arch
    from nodes.families.files import fingerprint
    from nodes.families.keys import looks_like_diffusers_vae

    index = read_index(path, allow_pickle=allow_pickle)
    family = SD15()  # the VAE architecture is shared; the latent scale belongs to the MODEL
    keys = list(index.tensors)
    if looks_like_diffusers_vae(keys):
        cfg, prefix = arch.vae_config_diffusers_keys(index, family.latent_format.scale_factor, 512), ""
    else:
        prefix = "first_stage_model." if index.any_with("first_stage_model.") else ""
        if not index.has(f"{prefix}encoder.conv_in.weight") or not index.has(f"{prefix}decoder.conv_out.weight"):
            from nodes.families.base import describe_unknown

            raise ModelLoadError(f"{path}: not a VAE (no encoder/decoder tensors): {describe_unknown(index)}")
        cfg = arch.vae_config(index, prefix, family.latent_format.scale_factor, 512)
    part = Part.make("vae", "vae", "vae", prefix, "vae", cfg)
    source = WeightsSource(Path(path), fingerprint(path), "single_file", allow_pickle)
    return VAEHandle(source, family, (part,), index.nbytes(prefix))
