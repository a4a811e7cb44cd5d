"""Runs a validated workflow: cache look-ups, node calls, events, interrupt, per-node errors.

One :class:`Executor` per process (created in ``main.py``); the CLI and the server's queue
worker call :meth:`Executor.run` for one workflow at a time. The plan is the set of nodes the
requested outputs need, stopping at cache hits; it runs in deterministic topological order, and
lazy inputs pull their producers in only when the node asks for them (ComfyUI's
``check_lazy_status`` semantics).
"""

from __future__ import annotations

import bisect
import logging
import time
import traceback
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from engine import events as ev
from engine.attention import attention_scope
from engine.cache import OutputCache
from engine.context import (
    Folders,
    Interrupted,
    InterruptFlag,
    KeptImages,
    ModelAccess,
    ModelManagerLike,
    NodeContext,
    NoModels,
    RunSettings,
)
from engine.events import Preview
from engine.expansion import ExpansionError, Lineage, Pending, add_to_run, resolve
from engine.graph import sort_key
from engine.image_guard import ImageGuard
from engine.interruptible_models import InterruptibleModels
from engine.lists import NodeRun, call_mapped, first_blocker
from engine.memory.device_policy import handles_in
from engine.memory.plan_memory import (
    RanOutOfMemory,
    estimate_plan,
    out_of_memory_kind,
    out_of_memory_message,
    refuse_over_budget,
)
from engine.memory.process_ram import ProcessRam
from engine.node import NodeDef, contained
from engine.plan import Plan, PlannedNode, cache_keys
from engine.registry import NodeRegistry
from engine.schema import (
    HIDDEN_DYNPROMPT,
    HIDDEN_EXTRA_PNGINFO,
    HIDDEN_PROMPT,
    HIDDEN_UNIQUE_ID,
)
from engine.typecheck import output_problems
from engine.validate import Validation, validate_prompt

log = logging.getLogger("loom.executor")

Status = Literal["success", "error", "invalid", "interrupted"]
LOOKAHEAD = 16  # how many upcoming nodes the memory manager hears about


@dataclass
class RunRequest:
    """One workflow to run. ``outputs``: partial execution targets (default: all output nodes).
    ``keep_images``: image nodes also keep their encoded files in ``RunResult.images`` (previews
    are then not written to disk at all)."""

    prompt: dict[str, Any]
    prompt_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    outputs: list[str] | None = None
    extra_pnginfo: dict[str, Any] | None = None  # as image nodes embed it (engine.formats.png.png_info)
    client_id: str | None = None
    keep_images: bool = False


@dataclass
class RunResult:
    prompt_id: str
    status: Status
    executed: list[str] = field(default_factory=list)
    cached: list[str] = field(default_factory=list)
    outputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    node_errors: dict[str, Any] = field(default_factory=dict)
    error: dict[str, Any] | None = None
    timings: dict[str, Any] = field(default_factory=lambda: {"total_s": 0.0, "nodes": {}})
    memory: dict[str, Any] = field(default_factory=dict)
    images: dict[str, bytes] = field(default_factory=dict)  # KeptImages.key(ui entry) -> file bytes

    def to_json(self) -> dict[str, Any]:
        fields = ("prompt_id", "status", "executed", "cached", "outputs", "node_errors", "error", "timings")
        return {name: getattr(self, name) for name in (*fields, "memory")}


class NodeFailed(Exception):
    def __init__(self, node_id: str, class_type: str, cause: BaseException, inputs: dict[str, Any]) -> None:
        super().__init__(str(cause))
        self.node_id, self.class_type, self.cause, self.inputs = node_id, class_type, cause, inputs
        self.real_node_id = node_id  # the workflow's node whose expansion holds it (engine.expansion)


@dataclass
class _Run:
    """Per-run state: the plan, its cache keys, what is done."""

    plan: Plan
    keys: dict[str, str]
    order_index: dict[str, tuple[int, ...]]  # expanded nodes sort after their parent's key
    results: dict[str, list[list[Any]]] = field(default_factory=dict)
    pending: list[tuple[tuple[int, ...], str]] = field(default_factory=list)
    nodes: dict[str, PlannedNode] = field(default_factory=dict)  # the plan's, then expanded ones
    expanding: dict[str, Pending] = field(default_factory=dict)  # parents waiting for sub-graphs
    lineage: Lineage = field(default_factory=Lineage)
    queued: set[str] = field(default_factory=set)
    cached: list[str] = field(default_factory=list)  # cache hits that ended the walk upstream
    from_cache: list[str] = field(default_factory=list)  # every planned node whose output is cached
    cached_ui: dict[str, dict[str, Any]] = field(default_factory=dict)
    kept: KeptImages | None = None  # RunRequest.keep_images
    consumers: dict[str, int] = field(default_factory=dict)  # node -> planned consumers not yet run
    peak_bytes: int = 0  # the plan's declared tensors at their peak (engine.memory.plan_memory)


class Executor:
    """Executes workflows against a registry, a shared output cache and a model manager."""

    def __init__(
        self,
        registry: NodeRegistry,
        cache: OutputCache,
        folders: Folders,
        *,
        models: ModelManagerLike | None = None,
        bus: ev.EventBus | None = None,
        interrupt: InterruptFlag | None = None,
        settings: RunSettings | None = None,
        image_guard: ImageGuard | None = None,
        ram: ProcessRam | None = None,
    ) -> None:
        """``ram``: the process RAM budget with its parts; given it, a job whose declared tensors
        cannot fit is refused at validation, and room is made for them before it runs."""
        self.registry = registry
        self.cache = cache
        self.folders = folders
        self.models: ModelManagerLike = models if models is not None else NoModels()
        self.bus = bus if bus is not None else ev.EventBus()
        self.interrupt = interrupt if interrupt is not None else InterruptFlag()
        self.settings = settings if settings is not None else RunSettings()
        self.image_guard = image_guard  # engine.image_guard.ImageGuard under --safety enforce, else None
        self.ram = ram

    # --- public ---------------------------------------------------------------------------------
    def validate(self, request: RunRequest) -> Validation:
        validation = validate_prompt(request.prompt, self.registry, request.outputs)
        return validation if self.ram is None else refuse_over_budget(validation, self.ram)

    def run(self, request: RunRequest, validation: Validation | None = None) -> RunResult:
        """Validate (unless given) and run one workflow; never raises for a workflow's fault."""
        started = time.perf_counter()
        validation = validation if validation is not None else self.validate(request)
        result = RunResult(request.prompt_id, "success", node_errors=validation.node_errors_json())
        if not validation.ok:
            result.status = "invalid"
            result.error = validation.error.to_json() if validation.error else None
            return result
        self.interrupt.clear()
        self.models.reset_run_stats()
        assert validation.plan is not None, "a valid workflow has a plan"
        prompt = validation.plan.prompt
        plan: _Run | None = None
        self._emit(ev.ExecutionStart(request.prompt_id))
        if self.ram is not None:
            self.ram.job_started()  # a job submitted meanwhile is measured without this one's tensors
        try:
            plan = self._start(validation.plan)
            if self.ram is not None:
                plan.peak_bytes = estimate_plan(validation.plan).peak_bytes
                if plan.peak_bytes:
                    self.ram.make_room(plan.peak_bytes)  # the cache, kept images and RAM tier give way
            if request.keep_images:
                plan.kept = KeptImages(data=result.images)
            self._require(plan, validation.outputs)
            # always, as ComfyUI: every planned node whose output is in the cache, not only the
            # cache hits that stopped the walk (their producers are cached too)
            plan.from_cache = self._cached_nodes(plan)
            self._emit(ev.ExecutionCached(request.prompt_id, nodes=list(plan.from_cache)))
            self._send_cached_ui(request, plan, plan.cached, result)
            self._loop(request, plan, result)
            self._emit(ev.ExecutionSuccess(request.prompt_id))
        except Interrupted:
            result.status = "interrupted"
            node = self._current
            self._emit(
                ev.ExecutionInterrupted(
                    request.prompt_id,
                    node_id=node,
                    node_type=str(prompt[node]["class_type"]) if node else None,
                    executed=list(result.executed),
                )
            )
            result.error = {"type": "interrupted", "message": "Interrupted by the user", "node_id": node}
        except NodeFailed as failure:
            result.status = "error"
            if plan is not None:
                failure.real_node_id = plan.lineage.real_node_id(failure.node_id)
            if isinstance(failure.cause, RanOutOfMemory):
                self.cache.trim()  # what the cache may hold now that memory ran short
            event = self._error_event(request, failure, result)
            self._emit(event)
            result.error = event.data()
        finally:
            if self.ram is not None:
                self.ram.job_finished()
            self._current = None
            self._emit(ev.Executing(request.prompt_id, node=None))
            result.timings["total_s"] = round(time.perf_counter() - started, 6)
            result.memory = self.models.stats()
        return result

    _current: str | None = None

    # --- planning -------------------------------------------------------------------------------
    def _start(self, plan: Plan) -> _Run:
        run = _Run(plan, cache_keys(plan, self.folders), {n: (i,) for i, n in enumerate(plan.order)})
        run.nodes = dict(plan.nodes)
        for node_id in plan.order:
            for source in {link.source for link in plan[node_id].links.values()}:
                run.consumers[source] = run.consumers.get(source, 0) + 1
        return run

    @staticmethod
    def _release_inputs(plan: _Run, node_id: str) -> None:
        """Let go of the outputs whose last planned consumer ``node_id`` was (the cache may still
        hold them), so a job's tensors live no longer than needed (engine.memory.plan_memory)."""
        for source in {link.source for link in plan.nodes[node_id].links.values()}:
            plan.consumers[source] -= 1
            if plan.consumers[source] == 0:
                plan.results.pop(source, None)

    def _require(self, plan: _Run, node_ids: Iterable[str]) -> None:
        """Queue the nodes and, through their eager inputs, everything they need not cached."""
        stack = list(node_ids)
        while stack:
            node_id = stack.pop()
            if node_id in plan.queued or node_id in plan.results:
                continue
            entry = self.cache.get(plan.keys[node_id])
            if entry is not None:
                plan.results[node_id] = entry.outputs
                plan.cached.append(node_id)
                if entry.ui:
                    plan.cached_ui[node_id] = entry.ui
                continue
            plan.queued.add(node_id)
            bisect.insort(plan.pending, (plan.order_index[node_id], node_id))
            node_def = plan.nodes[node_id].definition
            lazy_hook = node_def.has_lazy_status
            for name, link in plan.nodes[node_id].links.items():
                spec = node_def.schema.input(name)
                if spec is not None and spec.lazy and lazy_hook:
                    continue
                stack.append(link.source)

    # --- running --------------------------------------------------------------------------------
    def _cached_nodes(self, plan: _Run) -> list[str]:
        hits = set(plan.cached)
        return [
            n
            for n in sorted(plan.order_index, key=plan.order_index.__getitem__)
            if n in hits or (n not in plan.queued and plan.keys[n] in self.cache)
        ]

    def _loop(self, request: RunRequest, plan: _Run, result: RunResult) -> None:
        result.cached.extend(plan.from_cache)
        while plan.pending:
            _, node_id = plan.pending.pop(0)
            plan.queued.discard(node_id)
            if node_id in plan.results:
                continue
            self._current = node_id
            if self.interrupt.is_set():
                raise Interrupted("interrupted between nodes")
            node_def = plan.nodes[node_id].definition
            display = plan.lineage.display_node_id(node_id)
            if node_id in plan.expanding:  # its sub-graph ran: its outputs are what the links name
                pending = plan.expanding.pop(node_id)
                outputs, ui = (
                    resolve(pending, [o.is_list for o in node_def.schema.outputs], plan.results),
                    pending.ui,
                )
            else:
                if node_def.has_lazy_status and self._pull_lazy(request, plan, node_id, node_def):
                    continue
                self._hint_models(plan)
                self._emit(ev.Executing(request.prompt_id, node=node_id, display_node=display))
                started = time.perf_counter()
                outputs, ui, calls = self._execute(request, plan, node_id, node_def)
                result.timings["nodes"][node_id] = round(time.perf_counter() - started, 6)
                if calls is not None:
                    self._expand(plan, node_id, Pending(calls, ui))
                    continue
            plan.results[node_id] = outputs
            result.executed.append(node_id)
            if plan.kept is None or node_id not in plan.kept.memory_only:  # its UI names no real file
                self.cache.put(plan.keys[node_id], outputs, ui)
            self._release_inputs(plan, node_id)
            if ui:
                result.outputs[node_id] = ui
                self._emit(ev.Executed(request.prompt_id, node=node_id, output=ui, display_node=display))
        newly = [n for n in plan.cached if n not in result.cached]
        result.cached.extend(newly)

    def _expand(self, plan: _Run, parent: str, pending: Pending) -> None:
        """Add the sub-graphs ``parent`` returned to the run; it resolves after them."""
        try:
            needed = add_to_run(plan, parent, pending, self.registry, self.folders)
        except ExpansionError as exc:
            raise NodeFailed(parent, plan.nodes[parent].class_type, exc, {}) from exc
        self._require(plan, needed)
        plan.queued.add(parent)
        bisect.insort(plan.pending, (plan.order_index[parent], parent))

    def _pull_lazy(self, request: RunRequest, plan: _Run, node_id: str, node_def: NodeDef) -> bool:
        """Ask the node which lazy inputs it needs; queue their producers. True if it must wait."""
        inputs = self._gather(request, plan, node_id, node_def, first_only=True)
        ctx = self._context(request, node_id, plan.kept)
        try:
            with contained(_who(node_id, node_def)):
                wanted = node_def.check_lazy_status(ctx, inputs)
        except Exception as exc:
            raise NodeFailed(node_id, node_def.schema.node_id, exc, inputs) from exc
        links = plan.nodes[node_id].links
        missing = [links[n].source for n in wanted if n in links and links[n].source not in plan.results]
        if not missing:
            return False
        before = len(plan.cached)
        self._require(plan, missing)
        if len(plan.cached) > before:
            fresh = plan.cached[before:]
            self._emit(ev.ExecutionCached(request.prompt_id, nodes=list(fresh)))
        bisect.insort(plan.pending, (plan.order_index[node_id], node_id))
        plan.queued.add(node_id)
        return True

    def _gather(
        self, request: RunRequest, plan: _Run, node_id: str, node_def: NodeDef, *, first_only: bool = False
    ) -> dict[str, Any]:
        """The node's inputs as lists of items (or first items with ``first_only``)."""
        inputs: dict[str, Any] = {}
        planned = plan.nodes[node_id]
        for name, value in planned.constants.items():
            inputs[name] = [value]
        for name, link in planned.links.items():
            produced = plan.results.get(link.source)
            inputs[name] = [None] if produced is None else produced[link.output_index]
        hidden = node_def.schema.hidden
        if HIDDEN_PROMPT in hidden:
            inputs["prompt"] = [request.prompt]
        if HIDDEN_DYNPROMPT in hidden:
            inputs["dynprompt"] = [request.prompt]
        if HIDDEN_UNIQUE_ID in hidden:
            inputs["unique_id"] = [node_id]
        if HIDDEN_EXTRA_PNGINFO in hidden:
            inputs["extra_pnginfo"] = [request.extra_pnginfo or None]
        if first_only:
            return {k: (v[0] if v else None) for k, v in inputs.items()}
        return inputs

    def _execute(
        self, request: RunRequest, plan: _Run, node_id: str, node_def: NodeDef
    ) -> tuple[list[list[Any]], dict[str, Any] | None, list[Any] | None]:
        inputs = self._gather(request, plan, node_id, node_def)
        n_out = len(node_def.schema.outputs)
        blocker = first_blocker(inputs)
        if blocker is not None:
            if blocker.message is not None:
                raise NodeFailed(node_id, node_def.schema.node_id, RuntimeError(blocker.message), {})
            return [[blocker] for _ in range(n_out)], None, None
        ctx = self._context(request, node_id, plan.kept)
        try:
            with contained(_who(node_id, node_def)), attention_scope(self.settings.attention):
                run = call_mapped(NodeRun(node_def, ctx, inputs))
        except Interrupted:
            raise
        except Exception as exc:
            kind = out_of_memory_kind(exc)
            if kind is not None:  # the job fails alone, saying what to change
                message = out_of_memory_message(
                    node_id, node_def.schema.node_id, exc, kind, self.ram, plan.peak_bytes
                )
                del inputs  # the failed call's tensors go with the job, not with its error report
                raise NodeFailed(node_id, node_def.schema.node_id, RanOutOfMemory(message), {}) from exc
            raise NodeFailed(node_id, node_def.schema.node_id, exc, inputs) from exc
        if (
            node_def.origin != "core" and run.expansions is None
        ):  # a plugin's wrong output is blamed on it, not on the node downstream
            problems = output_problems(node_def.schema.outputs, run.outputs)
            if problems:
                raise NodeFailed(node_id, node_def.schema.node_id, TypeError("; ".join(problems)), inputs)
        if run.expansions is not None:
            return run.outputs, run.ui, run.expansions
        return run.outputs, run.ui, None

    def _context(self, request: RunRequest, node_id: str, kept: KeptImages | None = None) -> NodeContext:
        models: ModelAccess = self.models
        if not self.settings.compile:  # hooks would break torch.compile's graphs: steps only there
            models = InterruptibleModels(self.models, self.interrupt, f"node {node_id}")
        return NodeContext(
            node_id=node_id,
            prompt_id=request.prompt_id,
            folders=self.folders,
            models=models,
            interrupt=self.interrupt,
            on_progress=lambda nid, value, total: self._emit(
                ev.Progress(request.prompt_id, node=nid, value=value, max=total)
            ),
            on_preview=lambda nid, preview: self._preview(request, nid, preview),
            settings=self.settings,
            image_guard=self.image_guard,
            kept_images=kept,
        )

    def _preview(self, request: RunRequest, node_id: str, preview: Preview) -> None:
        if self.image_guard is not None:  # --safety enforce: no unchecked frame leaves the process
            checked = self.image_guard.check_preview(preview)
            if checked is None:
                return
            preview = checked
        self._emit(
            ev.PreviewFrame(request.prompt_id, node=node_id, format=preview.format, image=preview.data)
        )

    def _hint_models(self, plan: _Run) -> None:
        """Tell the memory manager which values the next nodes will consume (it picks out handles)."""
        upcoming: list[Any] = []
        for _, node_id in plan.pending[:LOOKAHEAD] if plan.pending else []:
            for link in plan.nodes[node_id].links.values():
                produced = plan.results.get(link.source)
                if produced is not None:
                    upcoming.extend(produced[link.output_index])
        self.models.hint_upcoming(handles_in(upcoming))

    def _send_cached_ui(
        self, request: RunRequest, plan: _Run, nodes: Iterable[str], result: RunResult
    ) -> None:
        """Output nodes served from the cache re-send their UI output, as ComfyUI does."""
        for node_id in sorted(nodes, key=sort_key):
            ui = plan.cached_ui.get(node_id)
            if ui:
                result.outputs[node_id] = ui
                self._emit(ev.Executed(request.prompt_id, node=node_id, output=ui))

    def _error_event(self, request: RunRequest, failure: NodeFailed, result: RunResult) -> ev.ExecutionError:
        cause = failure.cause
        node_def = self.registry.get(failure.class_type)
        message = str(cause) or type(cause).__name__
        if node_def is not None and node_def.origin != "core":
            message = f"{message} (node {failure.class_type} from plugin pack '{node_def.origin}')"
        if failure.real_node_id != failure.node_id:
            message = f"{message} (in node {failure.node_id}, inside the sub-graph node {failure.real_node_id} expanded into)"
        log.error("node %s (%s) failed: %s", failure.node_id, failure.class_type, message)
        return ev.ExecutionError(
            request.prompt_id,
            node_id=failure.real_node_id,
            node_type=failure.class_type,
            executed=list(result.executed),
            exception_message=message,
            exception_type=type(cause).__name__,
            traceback=traceback.format_tb(cause.__traceback__),
            current_inputs=_describe(failure.inputs),
            current_outputs={},
        )

    def _emit(self, event: ev.Event) -> None:
        try:
            self.bus.emit(event)
        except Exception:  # a listener's bug must not fail the run
            log.exception("event listener failed on %s", event.type)


def _who(node_id: str, node_def: NodeDef) -> str:
    return f"node {node_id} ({node_def.schema.node_id})"  # _error_event adds the pack


def _describe(inputs: Mapping[str, Any]) -> dict[str, Any]:
    """Short text forms of a failing node's inputs for the error report."""
    described: dict[str, Any] = {}
    for name, value in inputs.items():
        text = repr(value)
        described[name] = text if len(text) <= 200 else text[:197] + "..."
    return described
