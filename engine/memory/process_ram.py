"""Everything in the process that holds RAM it can give back, under one whole-process budget.

The model RAM tier (``engine.memory.manager``), the output cache (``engine.cache``) and the job
images kept for the history (``engine.jobs.records.KeptImageStore``) are *parts*: each holds only
what the process budget (:class:`~engine.memory.ram_budget.RamBudget`) leaves once the rest of the
process is counted, and gives memory back when other memory grows. What no part can give back
(Python, torch, the running job's tensors) is the process's *fixed* memory. :class:`ProcessRam`
is the budget with its parts: it says how much a job's tensors may take (:meth:`ProcessRam.job_room`,
checked before a job runs, ``engine.memory.plan_memory``) and makes that room
(:meth:`ProcessRam.make_room`) by asking the parts, in the order they were added, to give back.

Default shares of the budget (``--cache-gb`` sets the cache's own cap; the budget bounds it anyway):
the output cache at most a quarter of it and never more than 4 GiB, kept job images at most a
sixteenth and never more than 1 GiB.
"""

from __future__ import annotations

import logging
import threading
from typing import Protocol, TypeVar

from engine.memory.ram_budget import GIB, RamBudget

log = logging.getLogger("loom.memory")

CACHE_SHARE, CACHE_MAX = 4, 4 * GIB  # the output cache: budget / 4, at most 4 GiB
KEPT_SHARE, KEPT_MAX = 16, GIB  # kept job images: budget / 16, at most 1 GiB


class RamPart(Protocol):
    """A part of the process that holds RAM it can give back."""

    def held_bytes(self) -> int:
        """The bytes it holds now (that it could give back)."""
        ...

    def give_back(self, nbytes: int) -> int:
        """Free about ``nbytes`` (least useful first); returns the bytes freed."""
        ...


Part = TypeVar("Part", bound=RamPart)


def gib_text(nbytes: int) -> str:
    """``1.50 GiB`` (``340 MiB`` below one GiB, ``1000 bytes`` below one MiB)."""
    if abs(nbytes) < 2**20:
        return f"{nbytes} bytes"
    if abs(nbytes) < GIB:
        return f"{nbytes / 2**20:.0f} MiB"
    return f"{nbytes / GIB:.2f} GiB"


class ProcessRam:
    """The process RAM budget and the parts that live inside it. Thread-safe."""

    def __init__(self, budget: RamBudget) -> None:
        self.budget = budget
        self._parts: list[RamPart] = []
        self._lock = threading.Lock()
        self._running = 0  # jobs between job_started and job_finished
        self._fixed_at_start = 0  # the fixed memory when the first of them started

    def add(self, part: Part) -> Part:
        """Count ``part`` as the process's; earlier parts give back first. Returns ``part``."""
        with self._lock:
            self._parts.append(part)
        return part

    def room(self, held_bytes: int) -> int:
        """What a part that holds ``held_bytes`` may hold now (the rest of the process counted)."""
        return self.budget.room_for(held_bytes)

    def parts_bytes(self) -> int:
        with self._lock:
            parts = list(self._parts)
        return sum(max(0, int(p.held_bytes())) for p in parts)

    def fixed_bytes(self) -> int:
        """What the process holds that no part can give back (Python, torch, running tensors)."""
        return max(0, self.budget.rss() - self.parts_bytes())

    def job_room(self) -> int:
        """How many bytes a job's tensors may take: the budget less the fixed memory (the parts
        give theirs back, :meth:`make_room`). While a job runs its own tensors are fixed memory, so a
        job submitted meanwhile is measured against the fixed memory from before that job started."""
        with self._lock:
            fixed = self._fixed_at_start if self._running else None
        return max(0, self.budget.process_bytes - (self.fixed_bytes() if fixed is None else fixed))

    def job_started(self) -> None:
        """A job starts running (the executor calls it; pair it with :meth:`job_finished`)."""
        fixed = self.fixed_bytes()
        with self._lock:
            if self._running == 0:
                self._fixed_at_start = fixed
            self._running += 1

    def job_finished(self) -> None:
        with self._lock:
            self._running = max(0, self._running - 1)

    def make_room(self, nbytes: int) -> int:
        """Ask the parts to give back until ``nbytes`` more fit under the budget; returns the
        bytes they freed (0 when the room was there already)."""
        need = nbytes - max(0, self.budget.process_bytes - self.budget.rss())
        freed = 0
        with self._lock:
            parts = list(self._parts)
        for part in parts:
            if need - freed <= 0:
                break
            freed += max(0, int(part.give_back(need - freed)))
        if freed:
            log.info("made room for a job's tensors: %s given back", gib_text(freed))
        return freed

    def cache_cap(self, asked_bytes: int | None = None) -> int:
        """The output cache's own cap: ``asked_bytes`` (``--cache-gb``), else the default share."""
        if asked_bytes is not None:
            return max(0, int(asked_bytes))
        return min(CACHE_MAX, self.budget.process_bytes // CACHE_SHARE)

    def kept_cap(self) -> int:
        """The cap of the job images kept in memory for the history (the default share)."""
        return min(KEPT_MAX, self.budget.process_bytes // KEPT_SHARE)

    def describe(self) -> str:
        return f"the process RAM budget of {gib_text(self.budget.process_bytes)}"
