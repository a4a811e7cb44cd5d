"""The memory manager: one resident model on the compute device, a RAM tier, plan-aware prefetch.

Nodes never own weights. They hold light *handles* (``ModelHandleLike``) and ask
``with manager.use(handle) as module:``; the manager makes that model resident on the compute
device (evicting the previous one to the RAM tier first), locks it while the node computes, and
counts everything it does (loads, evictions, prefetch hits, bytes moved, seconds).

Tiers, fastest first::

    device  (at most one large model; CPU runs share memory with the RAM tier)
    RAM     (recently used modules in their stored precision, under the limit that
             ``engine.memory.ram_budget.RamBudget`` leaves; dropped furthest-needed-first, models on
             a local disk before others; text encoders as soon as no upcoming node needs them)
    disk    (the handle's files; safetensors are mmap-read again by ``handle.load()``)

The executor calls ``hint_upcoming(handles)`` before each node with the handles the rest of the
plan will use, in order; the manager reads the next one from disk into RAM on a background thread
while the current node runs, and when the RAM tier is over budget it drops the model needed
furthest ahead (Belady's rule; least recently used among the ones not needed again).

This module is generic: it imports no torch at import time and no model code. Device and dtype
are plain strings (``"cuda"``, ``"float16"``); handles translate them. Reference for the shape of
the API: InvokeAI ``backend/model_manager/load/load_base.py`` (``model_on_device`` context).
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from engine.memory.device_policy import (
    PRECISION_KINDS,
    DevicePolicy,
    ModelHandleLike,
    channels_last,
    module_bytes,
)
from engine.memory.device_streaming import DeviceStreaming
from engine.memory.entries import Entry, RunStats
from engine.memory.prefetch import Prefetcher
from engine.memory.ram_budget import DTYPE_BYTES, RamBudget, cheap_to_reload, fixed_tier_budget, stored_dtype

log = logging.getLogger("loom.memory")

GIB = 1024**3


class ModelManager(Prefetcher, DeviceStreaming):
    """Residency policy and accounting. One instance per process; thread-safe.

    ``use(handle)`` is the only way a node gets a module. ``hint_upcoming`` lets the executor
    share the plan; ``free`` drops everything not in use; ``stats`` reports what happened since
    ``reset_run_stats``. Reading ahead (and the late VAE) is
    :class:`~engine.memory.prefetch.Prefetcher`'s.
    """

    def __init__(
        self,
        policy: DevicePolicy | None = None,
        *,
        ram_budget_bytes: int | None = None,
        prefetch: bool = True,
        budget: RamBudget | None = None,
        drop_unneeded: frozenset[str] = frozenset({"clip"}),
    ) -> None:
        """``budget`` bounds the RAM tier by the whole process (default: the machine's memory less
        a reserve); ``ram_budget_bytes`` alone is a fixed tier limit. Kinds in ``drop_unneeded``
        go back to disk as soon as the upcoming handles (plan and queue) no longer include them."""
        self.policy = policy or DevicePolicy.cpu()
        if budget is None:
            budget = (
                RamBudget.for_machine() if ram_budget_bytes is None else fixed_tier_budget(ram_budget_bytes)
            )
        self.budget = budget
        self.drop_unneeded = drop_unneeded
        self.late_kinds: frozenset[str] = frozenset()  # see defer_late
        self.late_steps = 0
        self.event_log: list[tuple[str, str, str]] | None = None  # set to a list: every event, never reset
        self._progress: tuple[int, int] | None = None  # (done, total) of the model computing now
        self.prefetch_enabled = prefetch
        self._lock = threading.RLock()
        self._streams: dict[
            str, Any
        ] = {}  # handle key -> its streaming state (nodes.core.module_streaming.Streaming)
        self._runs: dict[str, Any] = {}  # handle key -> the run announced for it (plan_run)
        self._activations: dict[str, int] = {}  # handle key -> the estimate its placement left room for
        self._changed = threading.Condition(self._lock)
        self._resident: dict[str, Entry] = {}
        self._ram: OrderedDict[str, Entry] = OrderedDict()  # least recently used first
        self._pending: dict[str, Future[None]] = {}
        self._loading: set[str] = set()
        self._upcoming: list[ModelHandleLike] = []
        self._pool: ThreadPoolExecutor | None = None
        self._stats = RunStats()

    # --- the node-facing API --------------------------------------------------------------------
    @contextmanager
    def use(self, handle: ModelHandleLike) -> Iterator[Any]:
        """Make ``handle``'s model resident on the compute device and lock it while inside."""
        entry = self._acquire(handle)
        self._event("use", handle)
        try:
            yield entry.module
        finally:
            with self._lock:
                entry.locks -= 1
                self._event("release", handle)
                if entry.locks == 0 and self.policy.is_large(handle.kind):
                    self._progress = None
                self._changed.notify_all()
            if self.late_kinds:
                self._schedule_prefetch()  # a late model waited for this one to finish

    def hint_upcoming(self, handles: Sequence[ModelHandleLike]) -> None:
        """The handles the rest of the plan will use, next first; starts a prefetch if useful.
        Models of the ``drop_unneeded`` kinds that neither these nor the previous hint name go
        back to disk (the executor leaves out the node about to run: the previous hint had it)."""
        with self._lock:
            previous, self._upcoming = self._upcoming, list(handles)
            self._drop_unneeded({h.key for h in previous})
        self._schedule_prefetch()

    @property
    def ram_budget_bytes(self) -> int:
        """What the RAM tier may hold now (the process budget less what the process holds outside it)."""
        with self._lock:
            return self.budget.tier_limit(self._ram_bytes())

    def free(self) -> None:
        """Unload everything not currently locked by a running node (device and RAM tier)."""
        with self._lock:
            dropped = [self._resident.pop(k) for k, e in list(self._resident.items()) if e.locks == 0]
            dropped += [self._ram.pop(k) for k in list(self._ram)]
            for entry in dropped:
                self._stop_streaming(entry.handle.key)
                self._record_eviction(entry, "disk", "free")
            self._upcoming = []
        if dropped:
            del dropped
            gc.collect()
            self.policy.empty_cache()

    def held_bytes(self) -> int:
        """RAM the manager could give back now (``engine.memory.process_ram.RamPart``): the RAM
        tier, and models resident but not in use when the device is the CPU."""
        with self._lock:
            return self._ram_bytes() + sum(e.nbytes for e in self._idle_on_cpu())

    def give_back(self, nbytes: int) -> int:
        """Send models back to disk until about ``nbytes`` are freed: the RAM tier's first (the one
        needed furthest ahead first), then idle CPU residents; returns the bytes freed."""
        freed = 0
        with self._lock:
            while self._ram and freed < nbytes:
                victim = self._furthest_needed(exclude=None)
                if victim is None:
                    break
                freed += self._ram[victim].nbytes
                self._drop_from_ram(victim, "room for a job's tensors")
            for entry in self._idle_on_cpu():
                if freed >= nbytes:
                    break
                del self._resident[entry.handle.key]
                self._stop_streaming(entry.handle.key)
                self._record_eviction(entry, "disk", "room for a job's tensors")
                freed += entry.nbytes
        if freed:
            gc.collect()
        return freed

    def _idle_on_cpu(self) -> list[Entry]:
        if self.policy.device != "cpu":
            return []
        return [e for e in self._resident.values() if e.locks == 0]

    def stats(self) -> dict[str, Any]:
        with self._lock:
            s = self._stats
            return {
                "loads": [dict(x) for x in s.loads],
                "evictions": [dict(x) for x in s.evictions],
                "prefetch_hits": s.prefetch_hits,
                "bytes_moved": s.bytes_moved,
                "seconds": round(s.seconds, 4),
                "max_resident": s.max_resident,
                "resident": [self._describe(e) for e in self._resident.values()],
                "ram_tier": [self._describe(e) for e in self._ram.values()],
                "ram_tier_bytes": self._ram_bytes(),
                "max_ram_tier_bytes": s.max_ram_tier,
                "ram_budget_bytes": self.budget.tier_limit(self._ram_bytes()),
                "process_budget_bytes": self.budget.process_bytes,
                "events": list(s.events),
                "device": self.policy.device,
                "dtypes": {kind: self.policy.dtype_for(kind) for kind in PRECISION_KINDS},
                **self._streaming_stats(),
            }

    def reset_run_stats(self) -> None:
        """Start counting afresh (per workflow); what is resident stays resident."""
        with self._lock:
            self._stats = RunStats(max_resident=self._large_resident_count())

    def close(self) -> None:
        """Stop the prefetch thread and free everything."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        self.free()

    # --- acquisition ----------------------------------------------------------------------------
    def _acquire(self, handle: ModelHandleLike) -> Entry:
        key, kind = handle.key, handle.kind
        with self._lock:
            entry = self._resident.get(key)
            if entry is not None:
                if entry.locks == 0:
                    self._fit_run(entry)  # the split is chosen per run
                entry.locks += 1
                return entry
            if self.policy.is_large(kind):
                self._evict_resident_large()
            pending = self._pending.get(key)
        if pending is not None:
            pending.result()  # the background read finished or raised; either way go on
        while True:
            with self._lock:
                if key in self._resident:  # another thread made it resident meanwhile
                    entry = self._resident[key]
                    entry.locks += 1
                    return entry
                if key not in self._loading:
                    self._loading.add(key)
                    from_ram = self._ram.pop(key, None)
                    break
                self._changed.wait()
        try:
            entry = self._bring_in(handle, from_ram)
        finally:
            with self._lock:
                self._loading.discard(key)
                self._changed.notify_all()
        self._schedule_prefetch()
        return entry

    def _bring_in(self, handle: ModelHandleLike, from_ram: Entry | None) -> Entry:
        device, dtype = self.policy.device, self.policy.dtype_for(handle.kind)
        start = time.perf_counter()
        if from_ram is not None:
            source = "prefetch" if from_ram.prefetched else "ram"
            module, nbytes = from_ram.module, from_ram.nbytes
        else:
            source = "disk"
            self._event("read", handle)
            module, nbytes = handle.load(), max(0, int(handle.estimate_bytes()))
            self._event("read_done", handle)
        stored = from_ram.stored if from_ram is not None else stored_dtype(module)
        module = self._ready(handle, module, device, dtype)
        nbytes = module_bytes(module, nbytes)
        seconds = time.perf_counter() - start
        entry = Entry(handle, module, nbytes, locks=1, stored=stored)
        with self._lock:
            self._resident[handle.key] = entry
            s = self._stats
            if source == "prefetch":
                s.prefetch_hits += 1
            moved = nbytes if (source == "disk" or device != "cpu") else 0
            s.bytes_moved += moved
            s.seconds += seconds
            s.loads.append(
                {
                    "key": handle.key,
                    "kind": handle.kind,
                    "source": source,
                    "bytes": nbytes,
                    "seconds": round(seconds, 4),
                    "device": device,
                }
            )
            s.max_resident = max(s.max_resident, self._large_resident_count())
        log.info(
            "load %s %s from %s: %.1f MiB in %.2fs",
            handle.kind,
            handle.key[:12],
            source,
            nbytes / 2**20,
            seconds,
        )
        return entry

    def _ready(self, handle: ModelHandleLike, module: Any, device: str, dtype: str) -> Any:
        """``module`` cast to ``dtype`` on ``device``, in the memory order the policy wants (a
        module prepared so already passes through unchanged)."""
        module = self._placed(handle, module, device, dtype)
        if handle.kind in self.policy.channels_last:
            module = channels_last(module)
        return module

    def _evict_resident_large(self) -> None:
        """Move unlocked large residents to the RAM tier (caller holds the lock)."""
        for key in [
            k for k, e in self._resident.items() if e.locks == 0 and self.policy.is_large(e.handle.kind)
        ]:
            entry = self._resident.pop(key)
            self._stop_streaming(key)
            start = time.perf_counter()
            if self.policy.device != "cpu":
                entry.module = entry.handle.to_device(
                    entry.module, "cpu", self.policy.dtype_for(entry.handle.kind)
                )
                self._stats.bytes_moved += entry.nbytes
            entry.prefetched = False
            if entry.handle.kind in self.drop_unneeded and not self._is_upcoming(key):
                self._record_eviction(entry, "disk", "no longer needed")
                self._event("drop", entry.handle)
                continue
            self._to_stored(entry)
            self._stats.seconds += time.perf_counter() - start
            if entry.nbytes > self.budget.tier_limit(0):
                self._record_eviction(entry, "disk", "over RAM budget")
                continue
            self._ram[key] = entry  # it may be the one dropped: by next use, file place, recency
            self._record_eviction(entry, "ram", "swap")
            self._fit_ram_budget()
            self._note_ram_tier()
        if self.policy.device != "cpu":
            self.policy.empty_cache()

    # --- RAM tier -------------------------------------------------------------------------------
    def _ram_bytes(self) -> int:
        return sum(e.nbytes for e in self._ram.values())

    def _fits(self, incoming: int) -> bool:
        tier = self._ram_bytes()
        return tier + incoming <= self.budget.tier_limit(tier)

    def _fit_ram_budget(self, incoming: int = 0, protect: str | None = None) -> bool:
        """Drop RAM-tier entries, furthest-needed first, until ``incoming`` more bytes fit."""
        while self._ram and not self._fits(incoming):
            victim = self._furthest_needed(exclude=protect)
            if victim is None:
                return False
            self._drop_from_ram(victim, "RAM budget")
        return self._fits(incoming)

    def _furthest_needed(self, exclude: str | None) -> str | None:
        order = {h.key: i for i, h in reversed(list(enumerate(self._upcoming)))}
        never = len(order) + 1
        best: tuple[int, bool, int] | None = None
        victim = None
        for lru_rank, key in enumerate(self._ram):
            if key == exclude:
                continue
            # later use first; then one whose file is on a local disk (cheap to read again); then least recent
            score = (order.get(key, never), cheap_to_reload(self._ram[key].handle), -lru_rank)
            if best is None or score > best:
                best, victim = score, key
        return victim

    def _drop_from_ram(self, key: str, reason: str) -> None:
        entry = self._ram.pop(key)
        self._record_eviction(entry, "disk", reason)
        self._event("drop", entry.handle)

    def _is_upcoming(self, key: str) -> bool:
        return any(h.key == key for h in self._upcoming)

    def _drop_unneeded(self, keep: set[str]) -> None:
        """Drop RAM-tier models of the ``drop_unneeded`` kinds no upcoming node needs and not in
        ``keep`` (caller holds the lock); unlocked residents of those kinds go too."""

        def unneeded(key: str, entry: Entry) -> bool:
            return entry.handle.kind in self.drop_unneeded and key not in keep and not self._is_upcoming(key)

        for key in [k for k, e in self._ram.items() if unneeded(k, e)]:
            self._drop_from_ram(key, "no longer needed")
        for key, entry in list(self._resident.items()):
            if entry.locks == 0 and unneeded(key, entry):
                del self._resident[key]
                self._stop_streaming(key)
                self._record_eviction(entry, "disk", "no longer needed")
                self._event("drop", entry.handle)

    def _to_stored(self, entry: Entry) -> None:
        """Cast a module leaving the device back to the precision its file stores (exact: the
        compute precision is wider), so the RAM tier holds an fp16 file in fp16."""
        held = stored_dtype(entry.module)
        if (
            entry.stored is None
            or held is None
            or DTYPE_BYTES.get(entry.stored, 4) >= DTYPE_BYTES.get(held, 4)
        ):
            return
        entry.module = entry.handle.to_device(entry.module, "cpu", entry.stored)
        entry.nbytes = module_bytes(entry.module, entry.nbytes)

    def _note_ram_tier(self) -> None:
        self._stats.max_ram_tier = max(self._stats.max_ram_tier, self._ram_bytes())

    # --- accounting helpers ---------------------------------------------------------------------
    def _large_resident_count(self) -> int:
        return sum(1 for e in self._resident.values() if self.policy.is_large(e.handle.kind))

    def _event(self, what: str, handle: ModelHandleLike) -> None:
        with self._lock:
            self._stats.events.append((what, handle.kind, handle.key))
            if self.event_log is not None:
                self.event_log.append((what, handle.kind, handle.key))

    def _record_eviction(self, entry: Entry, to: str, reason: str) -> None:
        self._stats.evictions.append(
            {
                "key": entry.handle.key,
                "kind": entry.handle.kind,
                "to": to,
                "reason": reason,
                "bytes": entry.nbytes,
            }
        )
        log.info("evict %s %s to %s (%s)", entry.handle.kind, entry.handle.key[:12], to, reason)

    @staticmethod
    def _describe(entry: Entry) -> dict[str, Any]:
        return {"key": entry.handle.key, "kind": entry.handle.kind, "bytes": entry.nbytes}
