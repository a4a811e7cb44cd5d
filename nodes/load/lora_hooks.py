"""Weight hooks (ComfyUI's ``HOOKS``): LoRAs that act only while the conditionings carrying them run.

A :class:`HookGroup` holds :class:`LoraHook` values (a LoRA file and its model and clip strengths),
each with its own :class:`Keyframes`. Conditioning nodes put a group under an entry's
``extras["hooks"]`` (``nodes.core.cond``); the sampler starts the group for its run
(:meth:`HookGroup.start`) and, around every model call for the entries that carry it, adds the
LoRAs' changes to the denoiser's weights at the keyframe strength in force at that sigma, and puts
the weights back afterwards. Unhooked entries therefore run with the model as it was loaded.

Keyframes follow ComfyUI's ``HookKeyframeGroup``: sorted by ``start_percent``; the first one is in
force from the start; at each new sigma, once the current keyframe has had its ``guarantee_steps``
(0 for a keyframe that starts before the run's first sigma), the next keyframes whose start sigma
is at or above the current sigma take over, stopping at the first with guaranteed steps.

The changes are exact LoRA merges (``nodes.load.lora``), computed once per run at strength 1 and
scaled: W = W0 + Σ strength · mult · ΔW for the layers a LoRA changes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from nodes.load.lora import LoraPatch


@dataclass(frozen=True)
class Keyframe:
    """ComfyUI's ``HookKeyframe``: from ``start_percent`` on, the hook's strength times ``strength``."""

    strength: float
    start_percent: float = 0.0
    guarantee_steps: int = 1


@dataclass(frozen=True)
class Keyframes:
    """ComfyUI's ``HOOK_KEYFRAMES``: keyframes kept sorted by start (stable for equal starts)."""

    frames: tuple[Keyframe, ...] = ()

    def add(self, frame: Keyframe) -> Keyframes:
        return Keyframes(tuple(sorted((*self.frames, frame), key=lambda k: k.start_percent)))


class KeyframeClock:
    """The keyframe in force over one run (ComfyUI's ``prepare_current_keyframe``)."""

    def __init__(self, keyframes: Keyframes, percent_to_sigma: Callable[[float], float]) -> None:
        self.frames = keyframes.frames
        self.starts = [float(percent_to_sigma(k.start_percent)) for k in self.frames]
        self.index, self.used = 0, 0
        self.last_sigma: float | None = None
        self.max_sigma: float | None = None

    def _guaranteed(self, i: int) -> int:
        assert self.max_sigma is not None
        return 0 if self.starts[i] > self.max_sigma else self.frames[i].guarantee_steps

    def strength(self, sigma: float) -> float:
        if not self.frames:
            return 1.0
        if sigma != self.last_sigma:
            if self.max_sigma is None:
                self.max_sigma = sigma  # a run's first call is at its largest sigma
            if self.used >= self._guaranteed(self.index):
                for i in range(self.index + 1, len(self.frames)):
                    if self.starts[i] < sigma:
                        break
                    self.index, self.used = i, 0
                    if self._guaranteed(i) > 0:
                        break
            self.used += 1
            self.last_sigma = sigma
        return self.frames[self.index].strength


@dataclass(frozen=True)
class LoraHook:
    """One LoRA as a hook: the file's model and clip changes at their strengths, with keyframes."""

    model_patch: LoraPatch | None  # strength 1: the hook's strength is ``strength_model``
    clip_patch: LoraPatch | None
    strength_model: float
    strength_clip: float
    keyframes: Keyframes = field(default_factory=Keyframes)


@dataclass(frozen=True)
class HookGroup:
    """ComfyUI's ``HOOKS`` value: hooks applied together (``extras["hooks"]`` of cond entries)."""

    hooks: tuple[LoraHook, ...] = ()

    def combined(self, other: HookGroup | None) -> HookGroup:
        """Both groups' hooks (ComfyUI's ``clone_and_combine``; a hook already here is not repeated)."""
        if other is None:
            return self
        return HookGroup(self.hooks + tuple(h for h in other.hooks if h not in self.hooks))

    def with_keyframes(self, keyframes: Keyframes | None) -> HookGroup:
        """Every hook with ``keyframes`` (ComfyUI's ``set_keyframes_on_hooks``)."""
        return HookGroup(tuple(replace(h, keyframes=keyframes or Keyframes()) for h in self.hooks))

    def start(self, model: Any, percent_to_sigma: Callable[[float], float]) -> LoraHookRun:
        return LoraHookRun(self, model, percent_to_sigma)


def combine_all(groups: Sequence[HookGroup | None]) -> HookGroup:
    """ComfyUI's ``HookGroup.combine_all_hooks``: the given groups' hooks in order (None skipped)."""
    out = HookGroup()
    for g in groups:
        out = out.combined(g)
    return out


class LoraHookRun:
    """A :class:`HookGroup` bound to one sampling run of ``model`` (a MODEL handle)."""

    def __init__(self, group: HookGroup, model: Any, percent_to_sigma: Callable[[float], float]) -> None:
        self.group, self.model = group, model
        self.clocks = [KeyframeClock(h.keyframes, percent_to_sigma) for h in group.hooks]
        self.deltas: list[dict[str, torch.Tensor]] | None = (
            None  # per hook: parameter -> change at strength 1
        )

    def _changes(self, module: Any, patch: LoraPatch) -> dict[str, torch.Tensor]:
        params = dict(module.named_parameters())
        before = {n: p.detach().to(torch.float32, copy=True) for n, p in params.items()}
        patch.apply(module, self.model)
        changes = {}
        with torch.no_grad():
            for n, p in params.items():
                after = p.detach().to(torch.float32)
                if not torch.equal(after, before[n]):
                    changes[n] = after - before[n]
                p.copy_(before[n].to(p.dtype))
        return changes

    @contextmanager
    def applied(self, module: Any, sigma: float) -> Iterator[None]:
        if self.deltas is None:
            self.deltas = [
                {} if h.model_patch is None else self._changes(module, h.model_patch)
                for h in self.group.hooks
            ]
        params = dict(module.named_parameters())
        total: dict[str, torch.Tensor] = {}
        for hook, clock, delta in zip(self.group.hooks, self.clocks, self.deltas, strict=True):
            scale = hook.strength_model * clock.strength(sigma)
            for n, d in delta.items():
                total[n] = total[n] + scale * d if n in total else scale * d
        saved = {n: params[n].detach().clone() for n in total}
        try:
            with torch.no_grad():
                for n, d in total.items():
                    p = params[n]
                    p.copy_((saved[n].to(torch.float32) + d.to(p.device)).to(p.dtype))
            yield
        finally:
            with torch.no_grad():
                for n, w in saved.items():
                    params[n].copy_(w)
