"""Block streaming under a device budget: the generic part (no torch, no model code).

When a denoiser or a text encoder does not fit the memory the compute device offers, its
repeated blocks (transformer layers, UNet down/up blocks) are split once per residency:

- **resident** blocks live on the device like the rest of the model (embeddings, norms, heads);
- **streamed** blocks stay in host memory in their stored precision and are copied to the device
  just before they run and dropped right after; while block *k* runs, the next streamed block is
  already being copied (at most two streamed blocks on the device at any time).

This module holds the three generic pieces; ``nodes/streaming.py`` glues them to torch modules:

- :class:`DeviceBudget`: how much device memory model weights may use (from the device's size,
  ``--reserve-vram``, ``--vram-budget`` and ComfyUI's ``--lowvram`` / ``--novram`` /
  ``--highvram``), and :func:`budget_from_flags` that reads those flags;
- :func:`plan_split` -> :class:`StreamPlan`: which blocks stay and which stream;
- :class:`DeviceAccount` (bytes on the device, with a hard limit: the simulated device on CPU is
  exactly this) and :class:`BlockStreamer` (fetch / prefetch / drop order, counted).

ComfyUI's meanings (``comfy/cli_args.py``, ``comfy/model_management.py``): ``--highvram`` (and
``--gpu-only``) keep models whole on the device (never split); ``--lowvram`` splits a model that
does not fit into resident and streamed parts, which ComfyUI's loader also does in normal mode, so
the split is the same for both; ``--novram`` keeps no block resident, every block streams;
``--reserve-vram GB`` leaves that much device memory to the OS and other programs (400 MB by
default), and ComfyUI's minimum inference memory (0.8 GiB) stays free for activations. On the CPU
these modes mean nothing (as in ComfyUI) unless ``--vram-budget`` sets a simulated device.

The split is chosen when the manager makes the model resident (``ModelManager._placed``), so once
per residency: a sampling run, every step of it, uses one plan. Activation memory is a fixed
reserve (``working_bytes``), not yet estimated from the latent size and batch of the run.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

MIB = 1024**2
GIB = 1024**3
DEFAULT_RESERVE_BYTES = 400 * MIB  # what ComfyUI leaves to the OS by default (600 MB on Windows)
GPU_WORKING_BYTES = int(
    0.8 * GIB
)  # kept free for activations on a real device (ComfyUI's minimum inference memory)
VRAM_MODES = ("normal", "lowvram", "novram", "highvram")


class BudgetError(RuntimeError):
    """The model cannot run within the device budget, even fully streamed."""


@dataclass(frozen=True)
class DeviceBudget:
    """Device memory for model weights. ``total_bytes`` None: unbounded (plain CPU runs).

    ``working_bytes`` is kept free for activations (latents, attention); ``simulated`` marks a
    budget on a CPU "device" (tests, ``--vram-budget`` with ``--cpu``): copies are plain copies
    and the :class:`DeviceAccount` enforces the limit instead of the allocator.
    """

    total_bytes: int | None = None
    reserve_bytes: int = 0
    working_bytes: int = 0
    mode: str = "normal"
    simulated: bool = False

    def __post_init__(self) -> None:
        if self.mode not in VRAM_MODES:
            raise ValueError(f"unknown VRAM mode {self.mode!r}; expected one of {VRAM_MODES}")

    @property
    def weights_bytes(self) -> int | None:
        """Bytes the weights of one model may hold on the device; None: no limit."""
        if self.mode == "highvram" or self.total_bytes is None:
            return None
        return max(0, self.total_bytes - self.reserve_bytes - self.working_bytes)

    @property
    def force_streaming(self) -> bool:
        """``--novram``: stream every block, whatever fits."""
        return self.mode == "novram"

    def describe(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "total_bytes": self.total_bytes,
            "reserve_bytes": self.reserve_bytes,
            "working_bytes": self.working_bytes,
            "weights_bytes": self.weights_bytes,
            "simulated": self.simulated,
        }


def budget_from_flags(
    *,
    device: str,
    device_total: int | None,
    vram_budget_gb: float | None = None,
    reserve_vram_gb: float | None = None,
    lowvram: bool = False,
    novram: bool = False,
    highvram: bool = False,
) -> DeviceBudget | None:
    """The budget the command-line flags ask for, or None when nothing limits (CPU without
    ``--vram-budget``). ``device_total``: the device's memory in bytes (None on CPU)."""
    chosen = [name for name, on in (("lowvram", lowvram), ("novram", novram), ("highvram", highvram)) if on]
    if len(chosen) > 1:
        raise ValueError(f"--{' and --'.join(chosen)} contradict each other; give at most one")
    mode = chosen[0] if chosen else "normal"
    if vram_budget_gb is not None and vram_budget_gb <= 0:
        raise ValueError(f"--vram-budget must be a positive number of GiB, got {vram_budget_gb}")
    if reserve_vram_gb is not None and reserve_vram_gb < 0:
        raise ValueError(f"--reserve-vram must be 0 or more GiB, got {reserve_vram_gb}")
    simulated = device == "cpu"
    total = int(vram_budget_gb * GIB) if vram_budget_gb is not None else device_total
    if total is None:  # as in ComfyUI, the VRAM modes mean nothing to a CPU run
        return None
    if reserve_vram_gb is not None:
        reserve = int(reserve_vram_gb * GIB)
    else:  # a budget given explicitly is already what Loom may use; a device's size is not
        reserve = 0 if vram_budget_gb is not None or simulated else DEFAULT_RESERVE_BYTES
    return DeviceBudget(total, reserve, 0 if simulated else GPU_WORKING_BYTES, mode, simulated)


def add_budget_args(parser: Any) -> None:
    """ComfyUI's VRAM flags (one of ``--gpu-only --highvram --normalvram --lowvram --novram``),
    ``--reserve-vram`` and Loom's ``--vram-budget``, on an ``argparse`` parser."""
    modes = parser.add_mutually_exclusive_group()
    modes.add_argument(
        "--gpu-only", action="store_true", help="keep every model on the device (as --highvram here)"
    )
    modes.add_argument(
        "--highvram",
        action="store_true",
        help="keep models whole on the device; never split one into streamed blocks",
    )
    modes.add_argument(
        "--normalvram", action="store_true", help="split a model only when it does not fit (default)"
    )
    modes.add_argument(
        "--lowvram",
        action="store_true",
        help="split models that do not fit: resident blocks plus blocks streamed in each step",
    )
    modes.add_argument(
        "--novram",
        action="store_true",
        help="keep no blocks resident: every block streams in each step (when --lowvram is not enough)",
    )
    parser.add_argument(
        "--reserve-vram",
        type=float,
        default=None,
        metavar="GB",
        help="device memory left to the OS and other programs (default: 0.4 GB on a GPU)",
    )
    parser.add_argument(
        "--vram-budget",
        type=float,
        default=None,
        metavar="GB",
        help="device memory Loom's model weights may use, instead of the device's size (with --cpu: "
        "a simulated device budget, streamed with plain copies)",
    )


def budget_for(args: Any, device: str) -> DeviceBudget | None:
    """The budget of a parsed command line (see :func:`add_budget_args`) on ``device``."""
    return budget_from_flags(
        device=device,
        device_total=device_total_bytes(device),
        vram_budget_gb=getattr(args, "vram_budget", None),
        reserve_vram_gb=getattr(args, "reserve_vram", None),
        lowvram=bool(getattr(args, "lowvram", False)),
        novram=bool(getattr(args, "novram", False)),
        highvram=bool(getattr(args, "highvram", False) or getattr(args, "gpu_only", False)),
    )


def device_total_bytes(device: str) -> int | None:
    """The memory of a CUDA device in bytes; None for the CPU (and devices torch gives no size for)."""
    if not device.startswith("cuda"):
        return None
    import torch  # lazy: only a CUDA run asks

    return int(torch.cuda.mem_get_info(torch.device(device))[1])


@dataclass(frozen=True)
class StreamPlan:
    """Which blocks stay on the device and which stream, chosen once per residency."""

    block_bytes: tuple[int, ...]
    resident: tuple[int, ...]
    streamed: tuple[int, ...]
    fixed_bytes: int  # the non-block part of the model, always resident
    slots: int  # streamed blocks on the device at once: 2 with prefetch, 1 without
    budget_bytes: int | None

    @property
    def streaming(self) -> bool:
        return bool(self.streamed)

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
        }


def plan_split(block_bytes: Sequence[int], fixed_bytes: int, budget: DeviceBudget | None) -> StreamPlan:
    """Keep as many blocks resident as fit beside the fixed part and the streaming slots (two
    blocks of the largest streamed size for prefetch, one when only one fits), in call order;
    stream the rest. Everything is resident when it all fits (or no budget limits)."""
    sizes = tuple(max(0, int(b)) for b in block_bytes)
    limit = None if budget is None else budget.weights_bytes
    whole = fixed_bytes + sum(sizes)
    force = budget is not None and budget.force_streaming
    if not sizes or (limit is None and not force) or (limit is not None and whole <= limit and not force):
        return StreamPlan(sizes, tuple(range(len(sizes))), (), fixed_bytes, 0, limit)
    if limit is None:  # --novram without a size: stream everything, with prefetch
        return StreamPlan(sizes, (), tuple(range(len(sizes))), fixed_bytes, 2, None)
    best: StreamPlan | None = None
    for slot in sorted(set(sizes)):  # the largest streamed block; larger ones must stay resident
        for slots in (2, 1):
            plan = _fill(sizes, fixed_bytes, limit, slot, slots, force)
            if plan is not None and (best is None or _better(plan, best)):
                best = plan
    if best is None:
        smallest_need = fixed_bytes + max(sizes)
        raise BudgetError(
            f"the model needs {_mib(fixed_bytes)} for its non-block part plus {_mib(max(sizes))} for its largest "
            f"block on the device ({_mib(smallest_need)} at least), but the budget for weights is {_mib(limit)}; "
            f"raise --vram-budget, lower --reserve-vram, or store the weights in fewer bits (fp8 / GGUF)"
        )
    return best


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
    """Moves one block's weights (``nodes/streaming.py`` has the torch one)."""

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
