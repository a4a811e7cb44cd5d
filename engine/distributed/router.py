"""Model-affinity routing: which pending job goes to which idle worker, now.

Pure logic (no Ray, no threads, an injectable clock) so it is unit-tested on its own. The queue
calls :meth:`Router.plan` whenever something changed (a job was submitted, a worker became idle,
joined or died) with the pending jobs in queue order; the router answers with the jobs to start
now and marks those workers busy. The rules, for each pending job in order:

1. An idle worker that already has the job's first model resident takes it (no load at all).
2. Otherwise, if a busy worker has (or is loading) that model and its expected wait -- the rest of
   its current job plus the jobs already waiting for it in this plan -- is shorter than loading the
   model elsewhere, the job waits for that worker (jobs behind it may still start elsewhere).
3. Otherwise the idle worker that loses least takes it: one with nothing resident first, then one
   whose resident model no other pending job wants, then the least recently used resident model.

Estimates come from measurements the workers report after each job (:meth:`Router.finished`):
seconds spent loading each model (the memory manager's accounting) and seconds of work per job,
smoothed; before any measurement the defaults given to the constructor are used.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.graph import sort_key
from engine.registry import NodeRegistry
from engine.schema import COMBO, DynamicOptions

SMOOTHING = 0.3  # weight of a new measurement in the moving averages


@dataclass(frozen=True)
class Ticket:
    """A pending job as the router sees it: its id and the first model it needs (None: no model)."""

    job_id: str
    model: str | None


@dataclass(frozen=True)
class Assignment:
    job_id: str
    worker_id: str
    reason: str  # "resident", "empty", "lru", "no-model": why this worker


@dataclass
class WorkerSlot:
    """What the router believes about one worker."""

    worker_id: str
    resident: str | None = None  # the model its last job used (it stays resident)
    last_used: float = 0.0  # when the resident model last ran
    job_id: str | None = None  # running job, None when idle
    job_model: str | None = None
    job_started: float = 0.0

    @property
    def idle(self) -> bool:
        return self.job_id is None


@dataclass
class Estimates:
    """Smoothed seconds: per-model load time and per-model work time (a global one as fallback)."""

    default_load_s: float
    default_run_s: float
    load_s: dict[str, float] = field(default_factory=dict)
    run_s: dict[str, float] = field(default_factory=dict)
    any_run_s: float | None = None

    def load(self, model: str) -> float:
        return self.load_s.get(model, self.default_load_s)

    def run(self, model: str | None) -> float:
        if model is not None and model in self.run_s:
            return self.run_s[model]
        return self.any_run_s if self.any_run_s is not None else self.default_run_s

    def observe(self, model: str | None, *, run_s: float, load_s: float) -> None:
        self.any_run_s = _smooth(self.any_run_s, run_s)
        if model is None:
            return
        self.run_s[model] = _smooth(self.run_s.get(model), run_s)
        if load_s > 0:
            self.load_s[model] = _smooth(self.load_s.get(model), load_s)


def _smooth(old: float | None, new: float) -> float:
    return new if old is None else (1 - SMOOTHING) * old + SMOOTHING * new


class Router:
    """Decides placements; the caller reports starts implicitly (``plan``) and ends explicitly."""

    def __init__(
        self,
        *,
        default_load_s: float = 5.0,
        default_run_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.estimates = Estimates(default_load_s, default_run_s)
        self.clock = clock
        self._slots: dict[str, WorkerSlot] = {}

    # --- membership -------------------------------------------------------------------------------
    def add_worker(self, worker_id: str, *, resident: str | None = None) -> None:
        if worker_id in self._slots:
            raise ValueError(f"worker {worker_id!r} is already routed to; remove it first")
        self._slots[worker_id] = WorkerSlot(
            worker_id, resident=resident, last_used=self.clock() if resident else 0.0
        )

    def remove_worker(self, worker_id: str) -> str | None:
        """Forget a worker (it died or left); returns the job it was running, if any."""
        slot = self._slots.pop(worker_id, None)
        return slot.job_id if slot else None

    def workers(self) -> list[WorkerSlot]:
        return list(self._slots.values())

    def slot(self, worker_id: str) -> WorkerSlot | None:
        return self._slots.get(worker_id)

    def forget_resident(self, worker_id: str | None = None) -> None:
        """A worker (or all) unloaded its models (``/free``)."""
        for slot in self._slots.values():
            if worker_id is None or slot.worker_id == worker_id:
                slot.resident = None

    # --- decisions --------------------------------------------------------------------------------
    def plan(self, pending: Sequence[Ticket]) -> list[Assignment]:
        """Jobs to start now (marking their workers busy). Jobs not returned stay pending."""
        now = self.clock()
        waiting: dict[str, int] = {}  # worker id -> jobs that chose to wait for it in this plan
        later = Counter(t.model for t in pending if t.model is not None)  # models still wanted
        assignments: list[Assignment] = []
        for ticket in pending:
            if ticket.model is not None:
                later[ticket.model] -= 1
            idle = [s for s in self._slots.values() if s.idle]
            if not idle:
                break
            choice = self._choose(ticket, idle, waiting, now, {m for m, n in later.items() if n > 0})
            if choice is None:
                continue
            slot, reason = choice
            slot.job_id, slot.job_model, slot.job_started = ticket.job_id, ticket.model, now
            if ticket.model is not None:
                slot.resident, slot.last_used = ticket.model, now
            assignments.append(Assignment(ticket.job_id, slot.worker_id, reason))
        return assignments

    def _choose(
        self,
        ticket: Ticket,
        idle: list[WorkerSlot],
        waiting: dict[str, int],
        now: float,
        wanted_later: set[str],
    ) -> tuple[WorkerSlot, str] | None:
        model = ticket.model
        if model is None:
            return _least_valuable(idle, wanted_later), "no-model"
        for slot in sorted(idle, key=lambda s: s.worker_id):
            if slot.resident == model:
                return slot, "resident"
        holder = self._best_holder(model, waiting, now)
        if holder is not None:
            slot, wait_s = holder
            if wait_s < self.estimates.load(model):
                waiting[slot.worker_id] = waiting.get(slot.worker_id, 0) + 1
                return None
        target = _least_valuable(idle, wanted_later)
        return target, ("empty" if target.resident is None else "lru")

    def _best_holder(
        self, model: str, waiting: dict[str, int], now: float
    ) -> tuple[WorkerSlot, float] | None:
        """The busy worker with ``model`` that frees up first, and how long until it would start a
        job queued behind it now."""
        best: tuple[WorkerSlot, float] | None = None
        for slot in self._slots.values():
            if slot.idle or slot.resident != model:
                continue
            left = max(0.0, self.estimates.run(slot.job_model) - (now - slot.job_started))
            wait_s = left + waiting.get(slot.worker_id, 0) * self.estimates.run(model)
            if best is None or wait_s < best[1]:
                best = (slot, wait_s)
        return best

    # --- outcomes ---------------------------------------------------------------------------------
    def finished(self, worker_id: str, *, run_s: float, load_s: float, resident: str | None = None) -> None:
        """A worker finished its job: learn from the figures and mark it idle.

        ``run_s``: seconds of work excluding loads; ``load_s``: seconds the memory manager spent
        loading models for it (0 when the model was already resident). ``resident``: pass it when
        the worker reported what it holds now (otherwise the job's model is assumed resident).
        """
        slot = self._slots.get(worker_id)
        if slot is None:
            return
        self.estimates.observe(slot.job_model, run_s=max(0.0, run_s), load_s=max(0.0, load_s))
        if resident is not None:
            slot.resident = resident
        slot.last_used = self.clock()
        slot.job_id = slot.job_model = None

    def released(self, worker_id: str) -> None:
        """A job assigned by :meth:`plan` never started there (dispatch failed); no measurement."""
        slot = self._slots.get(worker_id)
        if slot is not None:
            slot.job_id = slot.job_model = None


def _least_valuable(idle: list[WorkerSlot], wanted: set[str]) -> WorkerSlot:
    """The idle worker whose resident model is worth least: none, not wanted again, then LRU."""

    def cost(slot: WorkerSlot) -> tuple[int, int, float, str]:
        return (slot.resident is not None, slot.resident in wanted, slot.last_used, slot.worker_id)

    return min(idle, key=cost)


# --- the first model of a job -------------------------------------------------------------------------
MODEL_SOURCES = ("checkpoints", "diffusers")


def first_model_finder(
    registry: NodeRegistry, sources: Sequence[str] = MODEL_SOURCES
) -> Callable[[dict[str, Any]], str | None]:
    """A ``model_of(prompt)`` for routing: the file chosen in the first loader node (by node id)
    whose schema has a COMBO input listing ``sources`` (e.g. ``checkpoints``), as
    ``"checkpoints/name"``; None when the workflow loads no such model. Generic: it reads only
    schemas, so plugin loaders that list the same folders count too."""
    wanted = frozenset(sources)

    def model_of(prompt: dict[str, Any]) -> str | None:
        for node_id in sorted(prompt, key=sort_key):
            node = prompt[node_id]
            node_def = registry.get(str(node.get("class_type"))) if isinstance(node, dict) else None
            if node_def is None:
                continue
            inputs = node.get("inputs") or {}
            for spec in node_def.schema.inputs:
                options = spec.options
                if spec.type == COMBO and isinstance(options, DynamicOptions) and options.source in wanted:
                    value = inputs.get(spec.name)
                    if isinstance(value, str):
                        return f"{options.source}/{value}"
        return None

    return model_of
