"""Plan-aware overlap of model reads with compute, for the job queue.

:class:`PlanAwarePrefetch` is the queue's prefetch (``LocalJobQueue(prefetch=...)``). Before a job
runs it

1. **encodes every prompt the job and the queued jobs need in one text-encoder residency**: the
   *encode nodes* of each (a node with a CLIP input and a CONDITIONING output whose upstream nodes
   only pass model handles and constants: loaders, CLIPSetLastLayer, LoRA loaders) run once,
   together, in a quiet side run that stores their outputs in the shared output cache; the jobs
   then find them there. Afterwards no upcoming node needs the text encoders, so the memory
   manager drops them (``ModelManager.drop_unneeded``);
2. **reads the denoiser while the text encoder runs**: the side run hints the job's other models
   (loader outputs) after the encoders, so the manager's prefetch thread reads the denoiser from
   disk while the prompts are being encoded;
3. **starts the VAE read during the last steps**: the sampler's progress events reach
   ``ModelManager.note_progress``, and the manager reads ``late_kinds`` (the VAE) only in the last
   ``late_steps`` steps, so the VAE is not held in RAM during the whole sampling.

Everything here only moves work earlier or drops what is no longer needed: each job computes
anything the side run did not store (a failure there is logged, never raised), and images are the
same as without it. Steps 1 and 2 run on the look-ahead thread (``engine/jobs/look_ahead.py``): the
current job waits for them at most ``wait_s`` seconds, so a queued job's file that hangs or is
huge never holds up the job in front of it. The engine stays free of model code: nodes are recognised by their schema's
port types, models by the handles they produce.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from engine import events as ev
from engine.cache import is_nonce
from engine.context import InterruptFlag
from engine.executor import Executor, RunRequest
from engine.graph import as_link
from engine.jobs.coalesce import AppendHints, KeyedPlan, NextJobPrefetch, plan_job
from engine.jobs.look_ahead import LOOK_AHEAD_WAIT_S
from engine.jobs.spec import JobSpec
from engine.schema import CLIP, CONDITIONING, IMAGE, LATENT, MASK

log = logging.getLogger("loom.overlap")

DATA_TYPES = frozenset({LATENT, IMAGE, MASK, CONDITIONING})  # tensors: their producers compute
ENCODE_AHEAD_JOBS = 16  # how many waiting jobs' prompts are encoded ahead (each costs a validation)


class PlanAwarePrefetch(NextJobPrefetch):
    """Next-job prefetch, plus one text-encoder residency for the queue's prompts and late VAE reads."""

    def __init__(self, executor: Executor, *, late_steps: int = 2, wait_s: float = LOOK_AHEAD_WAIT_S) -> None:
        super().__init__(executor, wait_s=wait_s)
        self.late_steps = late_steps
        self._unsubscribe = executor.bus.subscribe(self._on_event)
        setter = getattr(executor.models, "defer_late", None)
        if callable(setter):
            setter(frozenset({"vae"}), late_steps)

    def close(self) -> None:
        self._unsubscribe()

    def _on_event(self, event: ev.Event) -> None:
        if isinstance(event, ev.Progress) and event.max > 0:
            note = getattr(self.executor.models, "note_progress", None)
            if callable(note):
                note(event.value, event.max)

    def has_work(self, next_spec: JobSpec | None, current: JobSpec | None) -> bool:
        return current is not None or next_spec is not None

    def prepare(
        self,
        next_spec: JobSpec | None,
        current: JobSpec | None,
        queued: Sequence[JobSpec],
        stop: InterruptFlag,
    ) -> list[Any]:
        """On the look-ahead thread: the prompts encoded ahead, then the next job's handles."""
        if current is not None:
            try:
                self.encode_ahead([current, *queued[:ENCODE_AHEAD_JOBS]], stop)
            except Exception as exc:  # saves work only: each job still encodes its own prompts
                log.warning("encoding the queued prompts ahead of job %s failed: %s", current.prompt_id, exc)
        return super().prepare(next_spec, current, queued, stop)

    # --- one text-encoder residency -------------------------------------------------------------
    def encode_ahead(self, specs: Sequence[JobSpec], stop: InterruptFlag | None = None) -> list[str]:
        """Run the encode nodes of ``specs`` (current job first) that the cache lacks, grouped by
        text encoder, in side runs that keep the encoders still needed hinted and the first job's
        other models after them; returns the prompt ids encoded. ``stop`` (the look-ahead's flag)
        ends the side runs and skips those not started."""
        ex = self.executor
        later = self._still_needed(self.handles(specs[0], stop)) if specs else []
        todo = [
            (spec, nodes, self._encoders(spec, stop)) for spec in specs if (nodes := self.encode_nodes(spec))
        ]
        groups: dict[tuple[str, ...], int] = {}
        for _, _, encoders in todo:
            groups.setdefault(tuple(h.key for h in encoders), len(groups))
        todo.sort(key=lambda item: groups[tuple(h.key for h in item[2])])  # stable: the current job first
        done: list[str] = []
        for i, (spec, nodes, _) in enumerate(todo):
            if stop is not None and stop.is_requested():
                return done  # abandoned: the running job no longer waits for these
            still = [h for _, _, encoders in todo[i:] for h in encoders]
            quiet = Executor(
                ex.registry,
                ex.cache,
                ex.folders,
                models=AppendHints(ex.models, [*still, *later]),
                settings=ex.settings,
                interrupt=stop,
            )
            result = quiet.run(
                RunRequest(prompt=spec.prompt, prompt_id=f"{spec.prompt_id}.encode", outputs=nodes)
            )
            if result.status == "success":
                done.append(spec.prompt_id)
        if todo:
            ex.models.hint_upcoming(later)  # nothing left to encode: the text encoders go
        return done

    def _encoders(self, spec: JobSpec, stop: InterruptFlag | None = None) -> list[Any]:
        dropped: frozenset[str] = getattr(self.executor.models, "drop_unneeded", frozenset())
        return [h for h in super().handles(spec, stop) if h.kind in dropped]

    def handles(self, spec: JobSpec, stop: InterruptFlag | None = None) -> list[Any]:
        """The next job's model handles, less its text encoders once its prompts are encoded."""
        found = super().handles(spec, stop)
        return found if self.encode_nodes(spec) else self._still_needed(found)

    def _still_needed(self, handles: list[Any]) -> list[Any]:
        dropped: frozenset[str] = getattr(self.executor.models, "drop_unneeded", frozenset())
        return [h for h in handles if h.kind not in dropped]

    def encode_nodes(self, spec: JobSpec) -> list[str]:
        """``spec``'s encode nodes whose output is not cached yet (see the module docstring)."""
        ex = self.executor
        plan = plan_job(ex, {str(k): v for k, v in spec.prompt.items()}, list(spec.outputs) or None)
        if plan is None:
            return []
        return [
            node_id
            for node_id in plan.plan.order
            if node_id in plan.keys and self._is_encode(plan, node_id) and plan.keys[node_id] not in ex.cache
        ]

    def _is_encode(self, plan: KeyedPlan, node_id: str) -> bool:
        schema = self._schema(plan, node_id)
        if schema is None or not any(o.type == CONDITIONING for o in schema.outputs):
            return False
        if not any(i.type == CLIP for i in schema.inputs) or any(i.type in DATA_TYPES for i in schema.inputs):
            return False
        return self._handles_only_upstream(plan, node_id)

    def _handles_only_upstream(self, plan: KeyedPlan, node_id: str) -> bool:
        stack, seen = [node_id], {node_id}
        while stack:
            current = stack.pop()
            schema = self._schema(plan, current)
            if schema is None or schema.not_idempotent or is_nonce(plan.keys.get(current, "")):
                return False
            if current != node_id and (
                schema.output_node
                or any(o.type in DATA_TYPES for o in schema.outputs)
                or any(i.type in DATA_TYPES for i in schema.inputs)
            ):
                return False
            for value in (plan.plan.prompt[current].get("inputs") or {}).values():
                link = as_link(value)
                if link is not None and str(link.source) not in seen:
                    seen.add(str(link.source))
                    stack.append(str(link.source))
        return True

    def _schema(self, plan: KeyedPlan, node_id: str) -> Any:
        node = plan.plan.nodes.get(node_id)
        return None if node is None else node.definition.schema
