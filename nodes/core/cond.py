"""The conditioning value: ``CONDITIONING`` in Loom is a ``list[CondEntry]``.

Each entry is one encoded prompt with ``embeds`` [1, T, D] (T a multiple of 77: one 77-token window
per chunk of a long prompt), ``pooled`` [1, P] or None (SDXL's projected clip_g output), an optional
``area`` and ``strength`` (ConditioningSetArea), and ``extras`` for what other nodes add. A sampler
averages the predictions of all entries of one side, weighted by strength over their area, as
ComfyUI does.

Two kinds of ``extras`` values act inside the denoiser's forward, and reach it as values, never as
imports of the station that made them:

- ``extras["control"]``: the control models applied to the entry (ControlNet apply nodes), an
  :class:`nodes.core.control_base.AppliedControl`;
- ``extras["gligen"]``: GLIGEN's boxes (GLIGENTextBoxApply), an :class:`EntryBlockPatches`: block
  patches (ComfyUI's per-conditioning ``middle_patch``) for the rows of the entries that carry it;
- ``extras["hooks"]``: weight hooks (ComfyUI's HOOKS: CreateHookLora, ConditioningSetProperties), an
  :class:`EntryWeightHooks`: weight changes in force only while the model calls for the entries
  carrying it run (entries with different hooks never share a call).

``extras["default"]`` (ConditioningSetDefaultCombine) marks an entry that applies only where the
branch's other entries leave weight uncovered.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

    from nodes.core.sampling_hooks import BlockPatch


@dataclass(frozen=True)
class CondEntry:
    """One encoded prompt (see the module docstring)."""

    embeds: torch.Tensor  # (1, T, D)
    pooled: torch.Tensor | None = None  # (1, P)
    area: tuple[int, int, int, int] | None = None  # (h, w, y, x) in latent cells (pixels / 8)
    strength: float = 1.0
    extras: Mapping[str, Any] = field(default_factory=dict)


Conditioning = list[CondEntry]


class EntryBlockPatches(Protocol):
    """A value in a cond entry's ``extras`` that patches the denoiser's blocks while the rows of the
    entries carrying it run (GLIGEN's boxes: ComfyUI's per-conditioning ``middle_patch``)."""

    def block_patches(self, x_in: torch.Tensor) -> tuple[BlockPatch, ...]:
        """The block patches for one forward call on the model-space input ``x_in`` (B, C, h, w)."""
        ...

    def check_denoiser(self, module: Any, name: str) -> None:
        """Raise a teaching ``ConditioningError`` unless the patches fit the resident denoiser
        ``module``; ``name`` is the branch (``positive``, ``negative``) for the message."""
        ...


class HookRun(Protocol):
    """Weight hooks bound to one sampling run (keyframe state lives here, one per run)."""

    def applied(self, module: Any, sigma: float) -> AbstractContextManager[None]:
        """The hooks' weights in ``module`` for one model call at ``sigma``; restored on exit."""
        ...


class EntryWeightHooks(Protocol):
    """A value in a cond entry's ``extras["hooks"]`` (see the module docstring)."""

    def start(self, model: Any, percent_to_sigma: Callable[[float], float]) -> HookRun:
        """The hooks bound to a sampling run of ``model`` (a MODEL handle)."""
        ...
