"""A job's tensors against the process RAM budget: refused before they are made, and a job that
runs out of memory anyway fails alone, saying what to change.

**Before a job runs.** Nodes that make large tensors from their widget values declare their
outputs' sizes (``Node.estimate_outputs``, :class:`~engine.node.TensorSize`); a node that declares
nothing is taken to make outputs as large as its largest input of the same type (an invert, a blur,
a sampler). :func:`estimate_plan` walks the plan in run order and adds up what is *live* while each
node runs: its own outputs plus the earlier outputs a later node still needs (the executor lets go
of an output once its last consumer has run). :func:`refuse_over_budget` turns a plan whose live
bytes exceed what the process budget leaves for a job (``ProcessRam.job_room``) into a validation
failure in ComfyUI's ``node_errors`` shape, naming the first node where it does not fit, the size
and the budget, before anything is allocated.

**While it runs.** :func:`out_of_memory_kind` recognises running out of memory (``MemoryError``,
torch's CPU allocator failing, a device's out-of-memory error); the executor then fails the job with
:func:`out_of_memory_message` and the process, the server and the next job carry on.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from engine.memory.process_ram import ProcessRam, gib_text
from engine.node import TensorSize, contained
from engine.plan import Plan, PlannedNode
from engine.validate import NodeErrors, Validation, ValidationIssue

log = logging.getLogger("loom.memory")

Sizes = tuple[TensorSize | None, ...]
OVER_BUDGET = "exceeds_ram_budget"  # the node error's type
DEVICE_MARKS = ("cuda out of memory", "hip out of memory", "mps backend out of memory", "xpu out of memory")
RAM_MARKS = ("can't allocate memory", "cannot allocate memory", "not enough memory", "out of memory")


@dataclass(frozen=True)
class NodeMemory:
    """One planned node: its outputs' declared sizes and what the job holds while it runs."""

    node_id: str
    class_type: str
    sizes: Sizes
    live_bytes: int  # its outputs plus the earlier outputs still needed

    @property
    def output_bytes(self) -> int:
        return sum(s.nbytes for s in self.sizes if s is not None)


@dataclass(frozen=True)
class PlanMemory:
    """The plan's nodes in run order, each with its :class:`NodeMemory`."""

    nodes: tuple[NodeMemory, ...]

    @property
    def peak_bytes(self) -> int:
        return max((n.live_bytes for n in self.nodes), default=0)

    def first_over(self, room: int) -> NodeMemory | None:
        return next((n for n in self.nodes if n.live_bytes > room), None)


def estimate_plan(plan: Plan) -> PlanMemory:
    """The declared sizes of every planned node and the live bytes while each runs (see the module)."""
    consumers: dict[str, int] = {}
    for node_id in plan.order:
        for source in {link.source for link in plan[node_id].links.values()}:
            consumers[source] = consumers.get(source, 0) + 1
    sizes: dict[str, Sizes] = {}
    live: dict[str, int] = {}
    found: list[NodeMemory] = []
    for node_id in plan.order:
        planned = plan[node_id]
        sizes[node_id] = node_sizes(planned, sizes)
        own = sum(s.nbytes for s in sizes[node_id] if s is not None)
        found.append(NodeMemory(node_id, planned.class_type, sizes[node_id], sum(live.values()) + own))
        for source in {link.source for link in planned.links.values()}:
            consumers[source] -= 1
            if consumers[source] == 0:
                live.pop(source, None)
        if consumers.get(node_id, 0) > 0 and own:
            live[node_id] = own
    return PlanMemory(tuple(found))


def node_sizes(planned: PlannedNode, known: Mapping[str, Sizes]) -> Sizes:
    """``planned``'s output sizes: its declaration from its widget values and its linked inputs'
    sizes, else each output as large as its largest same-typed input (None where unknown)."""
    definition = planned.definition
    linked: dict[str, TensorSize | None] = {}
    for name, link in planned.links.items():
        upstream = known.get(link.source, ())
        linked[name] = upstream[link.output_index] if 0 <= link.output_index < len(upstream) else None
    outputs = definition.schema.outputs
    try:
        with contained(f"node {planned.node_id} ({planned.class_type})"):
            declared = definition.estimate_outputs({**planned.constants, **linked})
    except Exception as exc:  # an estimate is advice: a failing hook leaves the sizes unknown
        log.debug("size estimate of node %s (%s) failed: %s", planned.node_id, planned.class_type, exc)
        declared = None
    if isinstance(declared, tuple) and len(declared) == len(outputs):
        return tuple(s if isinstance(s, TensorSize) else None for s in declared)
    passed: list[TensorSize | None] = []
    for output in outputs:
        same = [
            size
            for name, size in linked.items()
            if size is not None
            and (spec := definition.schema.input(name)) is not None
            and spec.type == output.type
        ]
        passed.append(max(same, key=lambda s: s.nbytes) if same else None)
    return tuple(passed)


def refuse_over_budget(validation: Validation, ram: ProcessRam) -> Validation:
    """``validation`` unchanged when its plan's tensors fit what ``ram`` leaves for a job; else a
    failed validation naming the first node that does not fit, the size and the budget."""
    plan = validation.plan
    if plan is None:
        return validation
    estimate = estimate_plan(plan)
    if estimate.peak_bytes == 0:
        return validation
    room = ram.job_room()
    over = estimate.first_over(room)
    if over is None:
        return validation
    details = over_budget_details(over, ram, room)
    issue = ValidationIssue(
        OVER_BUDGET,
        "Not enough memory for this job's tensors",
        details,
        {
            "output_bytes": over.output_bytes,
            "live_bytes": over.live_bytes,
            "job_room_bytes": room,
            "process_budget_bytes": ram.budget.process_bytes,
        },
    )
    node_errors = dict(validation.node_errors)
    node_errors[over.node_id] = NodeErrors(over.class_type, [issue], list(plan.outputs))
    top = ValidationIssue("prompt_outputs_failed_validation", "Prompt outputs failed validation", details)
    return Validation([], node_errors, top)


def over_budget_details(over: NodeMemory, ram: ProcessRam, room: int) -> str:
    made = ", ".join(s.describe() for s in over.sizes if s is not None) or "no declared outputs"
    held = (
        f"; with the earlier outputs still needed the job would hold {gib_text(over.live_bytes)} at that point"
        if over.live_bytes > over.output_bytes
        else ""
    )
    return (
        f"node {over.node_id} ({over.class_type}) would make {gib_text(over.output_bytes)} of tensors "
        f"({made}){held}, but {ram.describe()} leaves {gib_text(room)} for a job's tensors (the "
        f"process itself holds {gib_text(ram.fixed_bytes())} it cannot give back). Lower the size or batch size of node "
        f"{over.node_id} or of the nodes before it, or raise --ram-budget."
    )


def out_of_memory_kind(exc: BaseException) -> str | None:
    """``"device"`` or ``"ram"`` when ``exc`` says memory ran out, else None."""
    text = str(exc).lower()
    if type(exc).__name__ == "OutOfMemoryError" or any(mark in text for mark in DEVICE_MARKS):
        return "device"
    if isinstance(exc, MemoryError):
        return "ram"
    if isinstance(exc, RuntimeError) and any(mark in text for mark in RAM_MARKS):
        return "ram"
    return None


class RanOutOfMemory(MemoryError):
    """A node ran out of memory; the message says where, against what budget and what to change."""


def out_of_memory_message(
    node_id: str, class_type: str, exc: BaseException, kind: str, ram: ProcessRam | None, peak_bytes: int
) -> str:
    cause = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if kind == "device":
        return (
            f"node {node_id} ({class_type}) ran out of device memory ({cause}). Lower the image size or "
            "batch size, or let models stream in with --lowvram / --reserve-vram; only this job failed."
        )
    budget = ram.describe() if ram is not None else "the machine's memory"
    declared = f"; its declared tensors take about {gib_text(peak_bytes)}" if peak_bytes else ""
    return (
        f"node {node_id} ({class_type}) ran out of memory ({cause}) under {budget}{declared}. Lower the "
        "image size or batch size, free memory (POST /free) or raise --ram-budget; only this job failed."
    )
