"""Plan-aware prefetch for :class:`~engine.memory.manager.ModelManager`, and the late start of the VAE.

While a node computes, :class:`Prefetcher` reads the next model the plan uses (the first upcoming
handle neither resident, in the RAM tier nor loading) from disk into the RAM tier on one background
thread, cast and laid out for computing, after making room in the tier for it. Models of the
*late* kinds (the VAE, :meth:`Prefetcher.defer_late`) wait until the large model computing is in
its last steps (:meth:`Prefetcher.note_progress`), so they are not held while it runs.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from engine.memory.device_policy import DevicePolicy, ModelHandleLike, module_bytes
from engine.memory.entries import Entry, RunStats
from engine.memory.ram_budget import stored_dtype

log = logging.getLogger("loom.memory")


class Prefetcher:
    """The prefetch half of :class:`~engine.memory.manager.ModelManager`, which builds the state."""

    policy: DevicePolicy
    late_kinds: frozenset[str]
    late_steps: int
    event_log: list[tuple[str, str, str]] | None
    prefetch_enabled: bool
    _progress: tuple[int, int] | None
    _lock: threading.RLock
    _changed: threading.Condition
    _resident: dict[str, Entry]
    _ram: OrderedDict[str, Entry]
    _pending: dict[str, Future[None]]
    _loading: set[str]
    _upcoming: list[ModelHandleLike]
    _pool: ThreadPoolExecutor | None
    _stats: RunStats

    if TYPE_CHECKING:  # defined by ModelManager

        def _fit_ram_budget(self, incoming: int = 0, protect: str | None = None) -> bool: ...
        def _ready(self, handle: ModelHandleLike, module: Any, device: str, dtype: str) -> Any: ...
        def _event(self, what: str, handle: ModelHandleLike) -> None: ...
        def _note_ram_tier(self) -> None: ...

    # --- the late kinds (the VAE) ---------------------------------------------------------------
    def defer_late(self, kinds: frozenset[str], steps: int = 2) -> None:
        """Prefetch models of ``kinds`` (the VAE) only in the last ``steps`` steps of the model
        computing (``note_progress``) or once it is done, so they are not held meanwhile."""
        with self._lock:
            self.late_kinds, self.late_steps = kinds, steps

    def note_progress(self, done: int, total: int) -> None:
        """Steps done of the model computing now (the sampler's progress): in its last
        ``late_steps`` steps the ``late_kinds`` models start reading."""
        with self._lock:
            self._progress = (done, total)
            if self.event_log is not None:
                self.event_log.append(("progress", "", f"{done}/{total}"))
        if self.late_kinds and total - done <= self.late_steps:
            self._schedule_prefetch()

    # --- prefetch -------------------------------------------------------------------------------
    def _schedule_prefetch(self) -> None:
        if not self.prefetch_enabled:
            return
        with self._lock:
            if self._pending:
                return  # one read at a time; the next is scheduled when it finishes
            target = self._next_to_prefetch()
            if target is None:
                return
            nbytes = max(0, int(target.estimate_bytes()))
            if not self._fit_ram_budget(incoming=nbytes):
                return
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="loom-prefetch")
            key = target.key
            self._event("prefetch", target)
            self._loading.add(key)
            self._pending[key] = self._pool.submit(self._prefetch, target, nbytes)

    def _next_to_prefetch(self) -> ModelHandleLike | None:
        for handle in self._upcoming:
            key = handle.key
            if key in self._resident or key in self._ram or key in self._loading:
                continue
            if handle.kind in self.late_kinds and not self._late_window():
                continue
            return handle
        return None

    def _late_window(self) -> bool:
        """Whether a late kind may be prefetched now: only in the last steps of a large model
        computing (otherwise ``use`` reads it when it is needed)."""
        if not any(e.locks and self.policy.is_large(e.handle.kind) for e in self._resident.values()):
            return False
        return self._progress is not None and self._progress[1] - self._progress[0] <= self.late_steps

    def _prefetch(self, handle: ModelHandleLike, nbytes: int) -> None:
        key = handle.key
        start = time.perf_counter()
        stored = None
        try:
            # built and made ready for computing (cast, memory order) here, off the critical path:
            # it is the next model the plan uses; the move to a GPU waits for use()
            self._event("read", handle)
            module = handle.load()
            stored = stored_dtype(module)
            module = self._ready(handle, module, "cpu", self.policy.dtype_for(handle.kind))
            self._event("read_done", handle)
        except Exception as exc:  # the real use() will raise it again with the node's context
            log.warning("prefetch of %s %s failed: %s", handle.kind, key[:12], exc)
            module = None
        seconds = time.perf_counter() - start
        with self._lock:
            self._loading.discard(key)
            self._pending.pop(key, None)
            if module is not None:
                nbytes = module_bytes(module, nbytes)
                self._ram[key] = Entry(handle, module, nbytes, prefetched=True, stored=stored)
                self._stats.bytes_moved += nbytes
                self._stats.seconds += seconds
                self._fit_ram_budget(protect=key)
                self._note_ram_tier()
                log.info(
                    "prefetched %s %s: %.1f MiB in %.2fs", handle.kind, key[:12], nbytes / 2**20, seconds
                )
            self._changed.notify_all()
        if module is not None:
            self._schedule_prefetch()
