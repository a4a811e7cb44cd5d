"""The handle base: the light, immutable values that flow along MODEL / CLIP / VAE / CLIP_VISION links.

Every weighted module Loom loads is described by one :class:`WeightsHandle`: where its weights
live (:class:`WeightsSource`: file + fingerprint), what to build from them (``build``, per
subclass), and which patches apply (:class:`Patch`: LoRA, IP-Adapter, ToMe, DeepCache). It holds no
weights: ``ModelManager.use(handle)`` calls ``handle.load()`` when the weights are needed, and
``handle.to_device`` is the one device move and precision cast of every module (skipped when
nothing changes; ``dtype`` overrides the manager's per-kind policy). ``key`` is the content
identity the manager caches modules by; patches that act only through sampling hooks
(``changes_module = False``) are not part of it. Patching returns a new handle (``with_patch``),
so a cached output never changes behind the cache's back.

The checkpoint handles (MODEL, CLIP, VAE) and the functions that open files into them are in
``nodes.load.handles``; CLIP vision, the safety model, TAESD and the control models subclass
WeightsHandle in their modules.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

from nodes.core.empty_init import EMPTY_INIT_LOCK
from nodes.core.sampling_hooks import SamplingHooks


@runtime_checkable
class Patch(Protocol):
    """A change applied to a freshly built module (in place), e.g. a LoRA merged into weights."""

    @property
    def key(self) -> str:
        """Identity of the patch (file fingerprint, strengths): part of the handle's key."""
        ...

    def apply(self, module: Any, handle: Any) -> None:
        """Change the freshly built ``module`` of ``handle`` in place."""
        ...


def changes_module(patch: Patch) -> bool:
    """Whether ``patch.apply`` changes the built module (weights, added layers, replaced forwards).
    A patch that acts only through sampling hooks declares ``changes_module = False``: it is left
    out of the handle's ``key``, so the memory manager keeps using the module already loaded
    (a CFG patch must not make the UNet load again)."""
    return bool(getattr(patch, "changes_module", True))


@runtime_checkable
class HookedPatch(Patch, Protocol):
    """A patch that also acts while the sampler runs (see ``nodes.core.sampling_hooks``)."""

    def sampling_hooks(self, module: Any) -> SamplingHooks:
        """The hooks for the resident, patched ``module`` (they may keep state found on it)."""
        ...


@dataclass(frozen=True)
class WeightsSource:
    """A weights file (single-file checkpoint in the original layout, a component file) or a
    diffusers folder."""

    path: Path
    fingerprint: str
    format: str = "single_file"  # "single_file" | "diffusers"
    allow_pickle: bool = False

    @property
    def name(self) -> str:
        return self.path.name


@dataclass(frozen=True, kw_only=True)
class WeightsHandle:
    """One weighted module (see the module docstring). Subclasses implement ``build`` and, if
    more than the file identifies the module, ``recipe``."""

    kind: ClassVar[str] = "model"
    source: WeightsSource
    nbytes: int
    patches: tuple[Patch, ...] = ()
    dtype: str | None = None  # overrides the manager's dtype policy for this handle

    # --- identity -------------------------------------------------------------------------------
    @cached_property
    def key(self) -> str:
        ident = {
            "kind": self.kind,
            "file": self.source.fingerprint,
            "format": self.source.format,
            "recipe": self.recipe(),
            "patches": [p.key for p in self.patches if changes_module(p)],
        }
        digest = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]
        return f"{self.kind}:{self.source.name}:{digest}"

    def recipe(self) -> Any:
        """JSON-able description of what is built from the file (besides the file itself)."""
        return None

    @property
    def path(self) -> Path:
        return self.source.path

    def with_patch(self, patch: Patch) -> Any:
        """A new handle with ``patch`` appended (this one is unchanged)."""
        return replace(self, patches=(*self.patches, patch))

    # --- ModelHandleLike ------------------------------------------------------------------------
    def estimate_bytes(self) -> int:
        return self.nbytes

    def load(self) -> Any:
        with EMPTY_INIT_LOCK:  # patches may create parameters too (IP-Adapter): see EMPTY_INIT_LOCK
            module = self.build()
            for patch in self.patches:
                patch.apply(module, self)
        return module

    def build(self) -> Any:
        raise NotImplementedError(f"{type(self).__name__} does not say how to build its module")

    def to_device(self, module: Any, device: str, dtype: str) -> Any:
        import torch  # lazy: torch-heavy

        target_device, target_dtype = torch.device(device), getattr(torch, self.dtype or dtype)
        tensors = [*module.parameters(), *module.buffers()]
        if all(
            t.device == target_device and (t.dtype == target_dtype or not t.is_floating_point())
            for t in tensors
        ):
            return module
        # nn.Module.to, not diffusers' override (it warns on every cast of modules without fp32 parts)
        return torch.nn.Module.to(module, device=target_device, dtype=target_dtype)

    def to_device_within(
        self, module: Any, device: str, dtype: str, budget: Any, activation_bytes: int = 0
    ) -> tuple[Any, Any]:
        """``to_device`` within a device budget (``engine.memory.device_budget.DeviceBudget``) beside the
        run's estimated ``activation_bytes``: the blocks that do not fit stay in host memory as
        stored and stream in as they run (``nodes.core.module_streaming``). A module that is not a torch module
        moves whole."""
        import torch  # lazy: torch-heavy

        from nodes.core.module_streaming import place_within  # lazy: imports torch

        if not isinstance(module, torch.nn.Module):
            return self.to_device(module, device, dtype), None
        blocks = self.stream_blocks(module)
        return module, place_within(module, blocks, device, self.dtype or dtype, budget, activation_bytes)

    def activation_bytes(self, module: Any, run: Any, dtype: str) -> int:
        """Device memory the activations of ``run`` (``engine.memory.device_budget.RunShape``) need beside the
        weights, computing in ``dtype``; 0 here (no estimate: the budget's minimum applies)."""
        return 0

    def stream_blocks(self, module: Any) -> list[Any]:
        """The blocks streaming may keep off the device, in call order (generic: the items of the
        outermost module lists; a family's declared block stack where it has one)."""
        from nodes.core.module_streaming import stream_blocks  # lazy: imports torch

        return stream_blocks(module)

    def model_handles(self) -> list[Any]:
        return [self]
