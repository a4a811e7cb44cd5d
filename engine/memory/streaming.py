"""Block streaming under a device budget: the generic part (no torch, no model code).

When a denoiser or a text encoder does not fit the memory the compute device offers, its
repeated blocks (transformer layers, UNet down/up blocks) are split once per run:

- **resident** blocks live on the device like the rest of the model (embeddings, norms, heads);
- **streamed** blocks stay in host memory in their stored precision and are copied to the device
  just before they run and dropped right after; while block *k* runs, the next streamed block is
  already being copied (at most two streamed blocks on the device at any time).

This module holds the three generic pieces; ``nodes/core/module_streaming.py`` glues them to torch modules:

- :class:`DeviceBudget`: how much device memory model weights may use (from the device's size,
  ``--reserve-vram``, ``--vram-budget`` and ComfyUI's ``--lowvram`` / ``--novram`` /
  ``--highvram``), :func:`budget_from_flags` that reads those flags, and :class:`RunShape`, what a
  sampling run asks of the device (all in ``engine/memory/device_budget.py``);
- :func:`plan_split` -> :class:`StreamPlan`: which blocks stay and which stream;
- :class:`DeviceAccount` (bytes on the device, with a hard limit: the simulated device on CPU is
  exactly this) and :class:`BlockStreamer` (fetch / prefetch / drop order, counted).

ComfyUI's meanings (``comfy/cli_args.py``, ``comfy/model_management.py``): ``--highvram`` (and
``--gpu-only``) keep models whole on the device (never split); ``--lowvram`` splits a model that
does not fit into resident and streamed parts, which ComfyUI's loader also does in normal mode, so
the split is the same for both; ``--novram`` keeps no block resident, every block streams;
``--reserve-vram GB`` leaves that much device memory to the OS and other programs (400 MB by
default). On the CPU these modes mean nothing (as in ComfyUI) unless ``--vram-budget`` sets a
simulated device.

**Activations.** What the weights may hold is the budget less the reserve less the memory the run's
activations need (:meth:`DeviceBudget.weights_for`). That need is an estimate the sampler asks for
before the run (``ModelManager.plan_run`` with a :class:`RunShape`: latent shape, how many
conditioning branches one model call batches, text tokens); the denoiser's family turns it into
bytes from its width, token count and compute precision (``activation_bytes`` of the denoiser
kinds in ``nodes/families``). As in ComfyUI (``load_models_gpu``: the larger of the model's
``memory_required`` and the 0.8 GiB minimum inference memory stays free), a real device keeps at
least ``working_bytes`` (0.8 GiB) for activations even when the estimate is smaller; a simulated
device has no floor, only the estimate. ComfyUI sizes its weights for one branch (its sampler
splits cond and uncond into separate calls when free memory runs short); Loom always batches the
branches a step evaluates, so its estimate counts them all (2 rows per latent row with CFG). A run whose estimate leaves too little room for even the
smallest streaming footprint is not refused: ComfyUI then keeps its minimum of weights on the
device and lets the run go on, so Loom streams every block one at a time (``over_budget`` in the
plan, and a warning); only weights that cannot fit the device at all are an error.

The split is chosen when the manager makes the model resident (``ModelManager._placed``) with the
estimate of the run announced for it, so once per run: every step uses one plan; a later run with
a different estimate re-chooses it before its first step.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from engine.memory.device_budget import (
    MIB,
    BudgetError,
    DeviceBudget,
)

log = logging.getLogger("loom.streaming")


@dataclass(frozen=True)
class StreamPlan:
    """Which blocks stay on the device and which stream, chosen once per residency."""

    block_bytes: tuple[int, ...]
    resident: tuple[int, ...]
    streamed: tuple[int, ...]
    fixed_bytes: int  # the non-block part of the model, always resident
    slots: int  # streamed blocks on the device at once: 2 with prefetch, 1 without
    budget_bytes: int | None  # what the weights may hold on the device in this run
    activation_bytes: int = 0  # the run's activation estimate the plan left room for
    over_budget: bool = False  # the estimate left too little room: every block streams (ComfyUI's way)

    @property
    def streaming(self) -> bool:
        return bool(self.streamed)

    @property
    def split(self) -> tuple[tuple[int, ...], tuple[int, ...], int]:
        """(resident, streamed, slots): what placing the module depends on."""
        return self.resident, self.streamed, self.slots

    @property
    def prefetch(self) -> bool:
        return self.slots >= 2 and len(self.streamed) >= 2

    @property
    def device_bytes(self) -> int:
        """The most weight bytes the plan holds on the device at once."""
        slot = sorted((self.block_bytes[i] for i in self.streamed), reverse=True)[: self.slots]
        return self.fixed_bytes + sum(self.block_bytes[i] for i in self.resident) + sum(slot)

    def next_streamed(self, index: int) -> int | None:
        """The streamed block that runs after block ``index`` (the first one again after the last:
        the next call starts over), or None when there is no other."""
        later = [i for i in self.streamed if i > index]
        if later:
            return later[0]
        first = self.streamed[0] if self.streamed else None
        return None if first is None or first == index else first

    def describe(self) -> dict[str, Any]:
        return {
            "blocks": len(self.block_bytes),
            "resident": len(self.resident),
            "streamed": len(self.streamed),
            "prefetch": self.prefetch,
            "device_bytes": self.device_bytes,
            "streamed_bytes": sum(self.block_bytes[i] for i in self.streamed),
            "budget_bytes": self.budget_bytes,
            "activation_bytes": self.activation_bytes,
            "over_budget": self.over_budget,
        }


def plan_split(
    block_bytes: Sequence[int], fixed_bytes: int, budget: DeviceBudget | None, activation_bytes: int = 0
) -> StreamPlan:
    """Keep as many blocks resident as fit beside the fixed part, the streaming slots (two blocks
    of the largest streamed size for prefetch, one when only one fits) and the run's activations
    (``activation_bytes``, see :meth:`DeviceBudget.weights_for`), in call order; stream the rest.
    Everything is resident when it all fits (or no budget limits). When the activations leave no
    room for any plan, every block streams one at a time (``over_budget``; see the module
    docstring); :class:`BudgetError` only when the weights cannot fit the device even so."""
    sizes = tuple(max(0, int(b)) for b in block_bytes)
    activation = max(0, int(activation_bytes))
    limit = None if budget is None else budget.weights_for(activation)
    whole = fixed_bytes + sum(sizes)
    force = budget is not None and budget.force_streaming
    if not sizes or (limit is None and not force) or (limit is not None and whole <= limit and not force):
        return StreamPlan(sizes, tuple(range(len(sizes))), (), fixed_bytes, 0, limit, activation)
    if limit is None:  # --novram without a size: stream everything, with prefetch
        return StreamPlan(sizes, (), tuple(range(len(sizes))), fixed_bytes, 2, None, activation)
    best: StreamPlan | None = None
    for slot in sorted(set(sizes)):  # the largest streamed block; larger ones must stay resident
        for slots in (2, 1):
            plan = _fill(sizes, fixed_bytes, limit, slot, slots, force)
            if plan is not None and (best is None or _better(plan, best)):
                best = plan
    if best is not None:
        return replace(best, activation_bytes=activation)
    assert budget is not None
    return _everything_streamed(sizes, fixed_bytes, budget, activation)


def _everything_streamed(
    sizes: tuple[int, ...], fixed: int, budget: DeviceBudget, activation: int
) -> StreamPlan:
    """The smallest footprint: every block streamed, one at a time, within the device less its
    reserve (what ComfyUI does when the run's memory estimate leaves its weights nothing)."""
    ceiling = budget.ceiling_bytes
    assert ceiling is not None
    need = fixed + max(sizes)
    if need > ceiling:
        raise BudgetError(
            f"the model needs {_mib(fixed)} for its non-block part plus {_mib(max(sizes))} for its largest "
            f"block on the device ({_mib(need)} at least), but the device budget less its reserve is "
            f"{_mib(ceiling)}; raise --vram-budget, lower --reserve-vram, or store the weights in fewer "
            f"bits (fp8 / GGUF)"
        )
    log.warning(
        "the run's activations need about %s and the model at least %s, more than the %s the device "
        "budget leaves: every block streams one at a time (as ComfyUI does), and the run may run out of "
        "device memory; a smaller image or batch, or a larger --vram-budget, avoids it",
        _mib(max(activation, budget.working_bytes)),
        _mib(need),
        _mib(ceiling),
    )
    everything = tuple(range(len(sizes)))
    return StreamPlan(sizes, (), everything, fixed, 1, ceiling, activation, over_budget=True)


def _fill(
    sizes: tuple[int, ...], fixed: int, limit: int, slot: int, slots: int, force: bool
) -> StreamPlan | None:
    """The plan whose streamed blocks are at most ``slot`` bytes, ``slots`` of them on the device
    at once: blocks above ``slot`` resident, then others in call order while they fit."""
    must = [i for i, size in enumerate(sizes) if size > slot]
    if force and must:
        return None
    room = limit - fixed - slots * slot - sum(sizes[i] for i in must)
    if room < 0:
        return None
    resident = set(must)
    if not force:
        for index, size in enumerate(sizes):
            if index not in resident and size <= room:
                resident.add(index)
                room -= size
    streamed = tuple(i for i in range(len(sizes)) if i not in resident)
    if not streamed or (slots == 2 and len(streamed) < 2):
        return None
    return StreamPlan(sizes, tuple(sorted(resident)), streamed, fixed, slots, limit)


def _better(plan: StreamPlan, than: StreamPlan) -> bool:
    """Prefetch first (a step never waits for a whole copy), then the fewest bytes to stream."""

    def score(p: StreamPlan) -> tuple[bool, int]:
        return p.prefetch, -sum(p.block_bytes[i] for i in p.streamed)

    return score(plan) > score(than)


def _mib(n: int) -> str:
    return f"{n / MIB:.2f} MiB"


class DeviceAccount:
    """Bytes held on the device, against a hard ``limit`` (None: only counted). Thread-safe."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self.held = 0
        self.peak = 0

    def charge(self, nbytes: int, what: str) -> None:
        with self._lock:
            if self.limit is not None and self.held + nbytes > self.limit:
                raise BudgetError(
                    f"putting {what} ({_mib(nbytes)}) on the device would hold "
                    f"{_mib(self.held + nbytes)}, over the budget of {_mib(self.limit)}"
                )
            self.held += nbytes
            self.peak = max(self.peak, self.held)

    def release(self, nbytes: int) -> None:
        with self._lock:
            self.held = max(0, self.held - nbytes)


class BlockMover(Protocol):
    """Moves one block's weights (``nodes/core/module_streaming.py`` has the torch one)."""

    def start(self, index: int) -> Any:
        """Begin copying block ``index`` to the device; returns what ``finish`` waits on."""
        ...

    def finish(self, index: int, pending: Any) -> None:
        """Wait for the copy and make the block compute with the device weights."""
        ...

    def drop(self, index: int) -> None:
        """Point the block back at its host weights, freeing the device copy."""
        ...


@dataclass
class StreamStats:
    fetches: int = 0  # copies made (prefetched or not)
    prefetch_hits: int = 0  # blocks already on their way when they were needed
    bytes_streamed: int = 0
    by_block: dict[int, int] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        return {
            "fetches": self.fetches,
            "prefetch_hits": self.prefetch_hits,
            "bytes_streamed": self.bytes_streamed,
        }


class BlockStreamer:
    """The fetch order of a :class:`StreamPlan`: ``before(k)`` when streamed block ``k`` is about to
    run (its copy is waited for or made, and the next streamed block's copy starts), ``after(k)``
    when it has run (its device copy is dropped). The account is charged for every device copy."""

    def __init__(self, plan: StreamPlan, mover: BlockMover, account: DeviceAccount) -> None:
        self.plan = plan
        self.mover = mover
        self.account = account
        self.stats = StreamStats()
        self._pending: dict[int, Any] = {}  # started copies not yet finished
        self._live: set[int] = set()  # blocks computing with device weights

    def before(self, index: int) -> None:
        for other in [i for i in self._live if i != index]:  # a block whose call raised (an interrupt)
            self.after(other)
        for other in [i for i in self._pending if i != index]:  # a prefetch the call order skipped
            self._discard(other)
        if index not in self._live:
            if index in self._pending:
                self.stats.prefetch_hits += 1
                pending = self._pending.pop(index)
            else:
                pending = self._start(index)
            self.mover.finish(index, pending)
            self._live.add(index)
        if self.plan.prefetch:
            following = self.plan.next_streamed(index)
            if following is not None and following not in self._live and following not in self._pending:
                self._pending[following] = self._start(following)

    def after(self, index: int) -> None:
        if index in self._live:
            self._live.discard(index)
            self.mover.drop(index)
            self.account.release(self.plan.block_bytes[index])

    def close(self) -> None:
        """Drop every device copy (the model leaves the device)."""
        for index in list(self._pending):
            self._discard(index)
        for index in list(self._live):
            self.after(index)

    def _start(self, index: int) -> Any:
        size = self.plan.block_bytes[index]
        self.account.charge(size, f"streamed block {index}")
        self.stats.fetches += 1
        self.stats.bytes_streamed += size
        self.stats.by_block[index] = self.stats.by_block.get(index, 0) + 1
        return self.mover.start(index)

    def _discard(self, index: int) -> None:
        pending = self._pending.pop(index)
        self.mover.finish(index, pending)
        self.mover.drop(index)
        self.account.release(self.plan.block_bytes[index])
