"""Queue-side speed-ups that need no model code: request coalescing and next-job model prefetch.

**Coalescing.** Queued jobs whose workflows are equal once the inputs their nodes declare
batchable (``NodeSchema.batching.inputs``: seeds, prompt text) are masked out form a group. The
group's *batch points* — nodes downstream of a differing value whose schema names an
``input_is_list`` ``batching.variant`` (KSampler → KSamplerBatched) — run once for the whole
group in a merged workflow: each differing constant becomes a link to a
:class:`CoalescedValues` node that yields one value per job, and every batch point becomes its
variant, which returns one output item per job. Item ``j`` is then stored in the output cache
under the key job ``j``'s own batch point has when the job runs alone. Each job then runs as
usual, with its own prompt, events, PNG metadata and history entry; its batch point is a cache
hit, so only what comes after it (decode, save) runs per job. If anything goes wrong (or the
cache dropped an entry) the job just computes it itself: coalescing can only save work.

**Next-job prefetch.** Before job N runs, the model-free source nodes of job N+1 (loaders: no
links in, MODEL/CLIP/VAE out) are run quietly (they read file headers only), and the model
handles they produce are appended to every ``hint_upcoming`` the executor sends during job N, so
the memory manager reads job N+1's models into RAM while job N computes. That look-ahead runs on
a thread of its own with a bounded wait (``engine/jobs/look_ahead.py``): job N+1's files, hostile
or stalled, never hold up job N.
"""

from __future__ import annotations

import copy
import json
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from engine import events as ev
from engine.cache import canonical, is_nonce, make_key
from engine.context import InterruptFlag
from engine.executor import Executor, RunRequest
from engine.graph import as_link
from engine.jobs.look_ahead import LOOK_AHEAD_WAIT_S, LookAhead
from engine.jobs.spec import JobSpec
from engine.memory.device_policy import handles_in
from engine.node import Node
from engine.plan import Plan, cache_keys
from engine.schema import ANY, CLIP, MODEL, STRING, VAE, Input, NodeSchema, Output

log = logging.getLogger("loom.coalesce")
VALUES_NODE = "LoomCoalescedValues"
_MASK = "\u2063batched"  # stands in for a batchable value in a job's signature
MODEL_TYPES = frozenset({MODEL, CLIP, VAE})


@dataclass(frozen=True)
class CoalesceConfig:
    """``window_s``: how long a lone coalescable job waits for companions (never longer);
    ``max_batch``: the largest group (bigger backlogs are cut into chunks of this size)."""

    window_s: float = 0.05
    max_batch: int = 8


class CoalescedValues(Node):
    """The per-job values of one batchable input in a merged workflow (a list output)."""

    SCHEMA = NodeSchema(
        node_id=VALUES_NODE,
        display_name="Coalesced values",
        category="loom/internal",
        description="Internal: one value per coalesced job.",
        inputs=(Input("values_json", STRING, "JSON list, one value per job."),),
        outputs=(Output("values", ANY, "The values, one item per job.", is_list=True),),
    )

    def run(self, ctx: Any, *, values_json: str) -> tuple[list[Any]]:
        return (list(json.loads(values_json)),)


@dataclass(frozen=True)
class KeyedPlan:
    """A job's plan and the cache key each of its nodes has when the job runs alone."""

    plan: Plan
    keys: dict[str, str]


def plan_job(executor: Executor, prompt: dict[str, Any], outputs: Sequence[str] | None) -> KeyedPlan | None:
    """Validate the job as the executor will and key its plan; None if it is not valid."""
    validation = executor.validate(RunRequest(prompt=prompt, outputs=list(outputs) if outputs else None))
    if validation.plan is None:
        return None
    return KeyedPlan(validation.plan, cache_keys(validation.plan, executor.folders))


@dataclass
class CoalesceOutcome:
    jobs: list[str]
    batch_points: list[str] = field(default_factory=list)
    status: str = "skipped"
    seconds: float = 0.0


class Coalescer:
    """Groups compatible queued jobs and precomputes their batch points together."""

    def __init__(self, executor: Executor, config: CoalesceConfig | None = None) -> None:
        self.executor = executor
        self.config = config or CoalesceConfig()
        self.groups_run = 0
        self.jobs_coalesced = 0

    # --- grouping -----------------------------------------------------------------------------
    def signature(self, spec: JobSpec) -> str | None:
        """Hash of the job with batchable constants masked; None if nothing in it can batch."""
        masked: dict[str, Any] = {}
        has_variant = False
        for node_id, node in spec.prompt.items():
            node_def = (
                self.executor.registry.get(str(node.get("class_type"))) if isinstance(node, dict) else None
            )
            if node_def is None:
                return None
            batching = node_def.schema.batching
            inputs = dict(node.get("inputs") or {})
            if batching is not None:
                has_variant = has_variant or batching.variant is not None
                for name in batching.inputs:
                    if name in inputs and as_link(inputs[name]) is None:
                        inputs[name] = _MASK
            masked[str(node_id)] = {"class_type": node.get("class_type"), "inputs": inputs}
        if not has_variant:
            return None
        try:
            return make_key({"prompt": masked, "outputs": sorted(spec.outputs)})
        except TypeError:
            return None

    def has_work(self, spec: JobSpec) -> bool:
        """Whether a node of ``spec`` that could batch still has to compute (not in the cache).
        A job whose samplers are all cached (an identical resubmit) has nothing to coalesce and
        must not wait for companions."""
        plan = self._plan(spec)
        if plan is None:
            return False
        for node_id, key in plan.keys.items():
            batching = plan.plan[node_id].definition.schema.batching
            if (
                batching is not None
                and batching.variant is not None
                and (is_nonce(key) or key not in self.executor.cache)
            ):
                return True
        return False

    def companions(self, head: JobSpec, pending: Sequence[JobSpec]) -> list[JobSpec]:
        """The consecutive pending jobs right after ``head`` that can run with it (chunked)."""
        sig = self.signature(head)
        if sig is None:
            return []
        group: list[JobSpec] = []
        for spec in pending:
            if len(group) + 1 >= self.config.max_batch or self.signature(spec) != sig:
                break
            group.append(spec)
        return group

    # --- the merged run -------------------------------------------------------------------------
    def prefill(
        self, group: Sequence[JobSpec], forward: Callable[[ev.Event], None] | None = None
    ) -> CoalesceOutcome:
        """Run the group's batch points once, store each job's share in the cache."""
        started = time.perf_counter()
        outcome = CoalesceOutcome([s.prompt_id for s in group])
        plans = [self._plan(s) for s in group]
        if len(group) < 2 or any(p is None for p in plans):
            return outcome
        ready = [p for p in plans if p is not None]
        merged, points = self._merge(ready)
        if not points:
            return outcome
        todo = [
            i
            for i, p in enumerate(ready)
            if any(not is_nonce(p.keys[b]) and p.keys[b] not in self.executor.cache for b in points)
        ]
        if len(todo) < 2:
            return outcome
        members = [group[i].prompt_id for i in todo]
        if len(todo) < len(ready):
            ready = [ready[i] for i in todo]
            merged, points = self._merge(ready)
            if not points:
                return outcome
        side = self._side_executor(members, forward)
        request = RunRequest(prompt=merged, prompt_id=f"{group[0].prompt_id}.coalesced", outputs=points)
        validation = side.validate(request)
        if validation.plan is None:
            log.warning("coalesced workflow failed validation: %s", validation.node_errors_json())
            outcome.status = "invalid"
            return outcome
        merged_keys = cache_keys(validation.plan, side.folders)
        result = side.run(request, validation)
        outcome.status, outcome.batch_points = result.status, points
        if result.status == "success":
            self._split(side, merged_keys, ready, points)
            self.groups_run += 1
            self.jobs_coalesced += len(ready)
        outcome.seconds = time.perf_counter() - started
        log.info("coalesced %d jobs at %s: %s in %.2fs", len(ready), points, result.status, outcome.seconds)
        return outcome

    def _plan(self, spec: JobSpec) -> KeyedPlan | None:
        return plan_job(self.executor, spec.prompt, spec.outputs)

    def _merge(self, plans: Sequence[KeyedPlan]) -> tuple[dict[str, Any], list[str]]:
        """The merged workflow and its batch points (empty if the jobs share all values)."""
        base: dict[str, Any] = dict(plans[0].plan.prompt)
        merged: dict[str, Any] = copy.deepcopy(base)
        varied: set[str] = set()
        for node_id in base:
            node_def = self.executor.registry.get(str(base[node_id]["class_type"]))
            batching = node_def.schema.batching if node_def is not None else None
            for name in batching.inputs if batching is not None else ():
                values = [_constant(p, node_id, name) for p in plans]
                if (
                    node_id not in plans[0].plan.nodes
                    or name not in plans[0].plan[node_id].constants
                    or all(v == values[0] for v in values)
                ):
                    continue
                source = f"loom.coalesce.{node_id}.{name}"
                merged[source] = {"class_type": VALUES_NODE, "inputs": {"values_json": canonical(values)}}
                merged[node_id]["inputs"][name] = [source, 0]
                varied.add(node_id)
        points = []
        for node_id in _downstream(base, varied):
            node_def = self.executor.registry.get(str(base[node_id]["class_type"]))
            batching = node_def.schema.batching if node_def is not None else None
            variant = batching.variant if batching is not None else None
            if node_def is None or variant is None or variant not in self.executor.registry:
                continue
            if not node_def.schema.output_node:
                merged[node_id]["class_type"] = variant
                points.append(node_id)
        return merged, points

    def _side_executor(self, members: Sequence[str], forward: Callable[[ev.Event], None] | None) -> Executor:
        """An executor for the merged run whose progress shows as every member job's (each
        member's sampler is computing), and whose preview frames show as the first member's (the
        batch's first item is the one previewed)."""
        ex = self.executor
        bus = ev.EventBus()
        if forward is not None:

            def relabel(event: ev.Event) -> None:
                if isinstance(event, ev.Progress):
                    for prompt_id in members:
                        forward(ev.Progress(prompt_id, node=event.node, value=event.value, max=event.max))
                elif isinstance(event, ev.PreviewFrame):
                    forward(
                        ev.PreviewFrame(members[0], node=event.node, format=event.format, image=event.image)
                    )

            bus.subscribe(relabel)
        return Executor(
            ex.registry.extended([CoalescedValues]),  # the base registry untouched
            ex.cache,
            ex.folders,
            models=ex.models,
            bus=bus,
            interrupt=ex.interrupt,
            settings=ex.settings,
            image_guard=ex.image_guard,
            ram=ex.ram,
        )

    def _split(
        self, side: Executor, merged_keys: dict[str, str], plans: Sequence[KeyedPlan], points: Sequence[str]
    ) -> None:
        for point in points:
            entry = side.cache.get(merged_keys[point])
            if entry is None or any(len(slot) != len(plans) for slot in entry.outputs):
                log.warning(
                    "coalesced node %s gave no per-job outputs; the jobs compute it themselves", point
                )
                continue
            for j, plan in enumerate(plans):
                self.executor.cache.put(plan.keys[point], [[slot[j]] for slot in entry.outputs], None)


def _constant(keyed: KeyedPlan, node_id: str, name: str) -> Any:
    planned = keyed.plan.nodes.get(node_id)
    return planned.constants.get(name) if planned is not None else None


def _downstream(prompt: dict[str, Any], roots: set[str]) -> list[str]:
    """``roots`` and every node fed by them, in a stable order."""
    children: dict[str, list[str]] = {}
    for node_id, node in prompt.items():
        for value in (node.get("inputs") or {}).values():
            link = as_link(value)
            if link is not None:
                children.setdefault(link.source, []).append(node_id)
    seen, stack = set(roots), list(roots)
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in seen:
                seen.add(child)
                stack.append(child)
    return sorted(seen)


# --- next-job prefetch -------------------------------------------------------------------------
class AppendHints:
    """The executor's model manager, with another job's handles appended to every hint."""

    def __init__(self, inner: Any, extra: Sequence[Any]) -> None:
        self.inner, self.extra = inner, list(extra)

    def use(self, handle: Any) -> Any:
        return self.inner.use(handle)

    def plan_run(self, handle: Any, run: Any) -> None:
        self.inner.plan_run(handle, run)

    def hint_upcoming(self, handles: Sequence[Any]) -> None:
        self.inner.hint_upcoming([*handles, *self.extra])

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class NextJobPrefetch:
    """Finds the next job's model handles (running its loaders quietly) and hints them. That look
    ahead runs on its own thread and the current job waits for it at most ``wait_s`` seconds
    (:class:`~engine.jobs.look_ahead.LookAhead`): a queued job's file that hangs never holds up the
    job in front of it."""

    def __init__(self, executor: Executor, *, wait_s: float = LOOK_AHEAD_WAIT_S) -> None:
        self.executor = executor
        self.look_ahead = LookAhead(wait_s)

    def handles(self, spec: JobSpec, stop: InterruptFlag | None = None) -> list[Any]:
        """``spec``'s model handles, from its loaders (run now, quietly, if the cache lacks them;
        ``stop`` interrupts that run)."""
        ex = self.executor
        plan = plan_job(ex, spec.prompt, spec.outputs)
        if plan is None:
            return []
        loaders = [n for n in plan.plan.order if self._is_loader(plan, n)]
        if not loaders:
            return []
        missing = [n for n in loaders if plan.keys[n] not in ex.cache]
        if missing:  # read their headers now, quietly; the job itself will then hit the cache
            quiet = Executor(ex.registry, ex.cache, ex.folders, settings=ex.settings, interrupt=stop)
            quiet.run(RunRequest(prompt=spec.prompt, prompt_id=f"{spec.prompt_id}.prefetch", outputs=missing))
        found: list[Any] = []
        for node_id in loaders:
            entry = ex.cache.get(plan.keys[node_id])
            if entry is not None:
                found.extend(handles_in(item for slot in entry.outputs for item in slot))
        return found

    def _is_loader(self, plan: KeyedPlan, node_id: str) -> bool:
        planned = plan.plan[node_id]
        node_def = planned.definition
        if node_def.schema.output_node or node_def.schema.not_idempotent or is_nonce(plan.keys[node_id]):
            return False
        if planned.links:
            return False
        return any(o.type in MODEL_TYPES for o in node_def.schema.outputs)

    def prepare(
        self,
        next_spec: JobSpec | None,
        current: JobSpec | None,
        queued: Sequence[JobSpec],
        stop: InterruptFlag,
    ) -> list[Any]:
        """The look-ahead work, on the look-ahead thread: the handles to append to every hint."""
        return self.handles(next_spec, stop) if next_spec is not None else []

    def has_work(self, next_spec: JobSpec | None, current: JobSpec | None) -> bool:
        return next_spec is not None

    @contextmanager
    def during(
        self, next_spec: JobSpec | None, *, current: JobSpec | None = None, queued: Sequence[JobSpec] = ()
    ) -> Iterator[None]:
        """While inside, the executor's hints include ``next_spec``'s models. (``current`` and
        ``queued``, the running job and all waiting ones, are for ``engine.jobs.overlap``.)"""
        ex = self.executor
        extra: list[Any] = []
        if self.has_work(next_spec, current):
            about = next_spec if next_spec is not None else current
            assert about is not None
            found = self.look_ahead.run(
                f"reading ahead for job {about.prompt_id}",
                lambda stop: self.prepare(next_spec, current, queued, stop),
            )
            extra = found or []
        if not extra:
            yield
            return
        inner, ex.models = ex.models, AppendHints(ex.models, extra)
        try:
            yield
        finally:
            ex.models = inner
