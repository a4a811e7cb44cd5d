"""A job's declared tensors against the process RAM budget (engine/memory/plan_memory.py): sizes
declared by the nodes that make tensors from their widgets, added up along the plan's live outputs,
and a job that cannot fit refused before any node runs, naming the node, the size and the budget.
Stub nodes, exact byte counts (the process size is a function the test sets)."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path
from typing import Any

from engine.cache import OutputCache
from engine.context import Folders, NodeContext
from engine.executor import Executor, RunRequest
from engine.memory.plan_memory import estimate_plan
from engine.memory.process_ram import ProcessRam
from engine.memory.ram_budget import RamBudget
from engine.node import Node, OutputSizes, TensorSize
from engine.registry import NodeRegistry
from engine.schema import INT, Input, Output
from tests.engine.memory.test_ram_budget import Rss
from tests.engine.stub_nodes import STUBS, G, StubSettings, record, schema, scratch

BLOB = "BLOB"  # a tensor-like socket type of the stubs below


class Blob:
    """A stand-in tensor: ``nbytes`` as the output cache measures it, and weak-referenceable."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes


class MakeBlob(Node):
    """Declares its output from its widget, as EmptyImage does: ``count`` items of 4 bytes."""

    SCHEMA = schema(
        "MakeBlob",
        (Input("count", INT, "how many values", default=1, min=1, max=10**12),),
        (Output("BLOB", BLOB, "the blob"),),
    )

    @classmethod
    def estimate_outputs(cls, *, count: Any = None, **_: Any) -> OutputSizes:
        return (TensorSize((count,)) if isinstance(count, int) else None,)

    def run(self, ctx: NodeContext, *, count: int) -> tuple[Blob]:
        record(ctx, "MakeBlob")
        blob = Blob(4 * count)
        scratch(ctx).setdefault("made", []).append(weakref.ref(blob))
        return (blob,)


class Invert(Node):
    """Declares nothing: the engine takes its output as large as its blob input (an image op)."""

    SCHEMA = schema(
        "Invert", (Input("blob", BLOB, "the blob"),), (Output("BLOB", BLOB, "the blob, inverted"),)
    )

    def run(self, ctx: NodeContext, *, blob: Blob) -> tuple[Blob]:
        record(ctx, "Invert")
        return (Blob(blob.nbytes),)


class Measure(Node):
    """Reports which blobs made earlier in the run are still alive when it runs."""

    SCHEMA = schema("Measure", (Input("blob", BLOB, "the blob"),), (Output("INT", INT, "n"),))

    def run(self, ctx: NodeContext, *, blob: Blob) -> tuple[int]:
        gc.collect()
        scratch(ctx)["alive"] = [ref() is not None for ref in scratch(ctx).get("made", [])]
        return (blob.nbytes,)


def _executor(
    tmp_path: Path, budget: int, rss: Rss, cache: OutputCache | None = None
) -> tuple[Executor, ProcessRam]:
    registry = NodeRegistry()
    registry.register_all([*STUBS, MakeBlob, Invert, Measure])
    folders = Folders(tmp_path / "in", tmp_path / "out", tmp_path / "temp")
    folders.ensure()
    ram = ProcessRam(RamBudget(process_bytes=budget, rss=rss))
    if cache is not None:
        ram.add(cache)
    executor = Executor(registry, cache or OutputCache(0), folders, settings=StubSettings(), ram=ram)
    return executor, ram


def _chain(count: int) -> dict[str, Any]:
    """MakeBlob -> Invert -> Invert -> Show: the issue's EmptyImage -> ImageInvert -> ImageInvert."""
    g = G()
    made = g.add("MakeBlob", count=count)
    first = g.add("Invert", blob=g.out(made))
    second = g.add("Invert", blob=g.out(first))
    g.add("Show", value=g.out(second))
    return g.prompt


def test_declared_sizes_add_up_along_the_outputs_still_needed(tmp_path: Path) -> None:
    executor, _ = _executor(tmp_path, budget=10**9, rss=Rss(0))
    plan = executor.validate(RunRequest(prompt=_chain(250))).plan
    assert plan is not None
    estimate = {n.node_id: n for n in estimate_plan(plan).nodes}
    assert estimate["1"].sizes == (TensorSize((250,)),) and estimate["1"].output_bytes == 1000
    assert estimate["2"].output_bytes == 1000  # undeclared: as large as its largest BLOB input
    # while the first Invert runs it holds its input and its output; the second lets the first go
    assert [estimate[n].live_bytes for n in ("1", "2", "3", "4")] == [1000, 2000, 2000, 1000]
    assert estimate_plan(plan).peak_bytes == 2000


def test_a_job_that_cannot_fit_is_refused_before_any_node_runs(tmp_path: Path) -> None:
    executor, _ = _executor(tmp_path, budget=1500, rss=Rss(400))  # 1100 bytes left for a job
    validation = executor.validate(RunRequest(prompt=_chain(250)))  # 1000 bytes, then 2000 live
    assert not validation.ok
    error = validation.node_errors_json()["2"]
    assert error["class_type"] == "Invert" and error["dependent_outputs"] == ["4"]
    issue = error["errors"][0]
    assert issue["type"] == "exceeds_ram_budget"
    assert issue["extra_info"] == {
        "output_bytes": 1000,
        "live_bytes": 2000,
        "job_room_bytes": 1100,
        "process_budget_bytes": 1500,
    }
    assert issue["details"] == (
        "node 2 (Invert) would make 1000 bytes of tensors (250 values of 4 bytes); with the earlier "
        "outputs still needed the job would hold 2000 bytes at that point, but the process RAM budget "
        "of 1500 bytes leaves 1100 bytes for a job's tensors (the process itself holds 400 bytes it "
        "cannot give back). Lower the size or batch size of node 2 or of the nodes before it, or raise "
        "--ram-budget."
    )
    result = executor.run(RunRequest(prompt=_chain(250)))
    assert result.status == "invalid"
    assert executor.settings.record.get("calls", []) == []  # nothing ran, nothing was allocated


def test_the_first_node_that_does_not_fit_is_named_with_its_size(tmp_path: Path) -> None:
    executor, _ = _executor(tmp_path, budget=2**30, rss=Rss(0))
    huge = 2**30  # 4 GiB of declared values against a 1 GiB budget
    validation = executor.validate(RunRequest(prompt=_chain(huge)))
    issue = validation.node_errors_json()["1"]["errors"][0]
    assert (
        "node 1 (MakeBlob) would make 4.00 GiB of tensors (1073741824 values of 4 bytes)" in issue["details"]
    )
    assert "process RAM budget of 1.00 GiB leaves 1.00 GiB" in issue["details"]
    assert validation.error is not None and validation.error.details == issue["details"]


def test_a_job_that_fits_runs_after_the_cache_gives_room(tmp_path: Path) -> None:
    rss = Rss(0)
    cache = OutputCache(10_000)
    executor, _ = _executor(tmp_path, budget=3000, rss=rss, cache=cache)
    cache.put("old", [[Blob(1500)]], None)
    rss.value = 1500  # the cache's entry is all the process holds: the whole budget is the job's room
    result = executor.run(RunRequest(prompt=_chain(250)))
    assert result.status == "success"
    assert "old" not in cache  # given back so the job's 2000 live bytes fit under 3000


def test_an_output_lives_no_longer_than_its_last_consumer(tmp_path: Path) -> None:
    executor, _ = _executor(tmp_path, budget=10**9, rss=Rss(0))  # OutputCache(0): the cache keeps nothing
    g = G()
    made = g.add("MakeBlob", count=10)
    inverted = g.add("Invert", blob=g.out(made))
    g.add("Show", value=g.out(g.add("Measure", blob=g.out(inverted))))
    assert executor.run(RunRequest(prompt=g.prompt)).status == "success"
    assert executor.settings.record["alive"] == [False]  # MakeBlob's output was let go after Invert
