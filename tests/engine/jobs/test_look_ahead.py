"""The queue's look-ahead runs off the running job's path (engine/jobs/look_ahead.py): a queued job
whose model file never finishes reading does not hold up the job in front of it; the look-ahead's
failures are one log line; an abandoned look-ahead's side runs stop. Checked with a model reader
held on an Event, never with a clock."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import pytest

from engine.cache import OutputCache
from engine.context import Folders, NodeContext
from engine.executor import Executor, RunRequest
from engine.jobs.coalesce import NextJobPrefetch
from engine.jobs.look_ahead import AbandonFlag, LookAhead
from engine.jobs.overlap import PlanAwarePrefetch
from engine.jobs.queue import LocalJobQueue
from engine.jobs.records import JobFinished, Notice
from engine.jobs.spec import JobSpec
from engine.jobs.store import JobStore
from engine.node import Node
from engine.registry import NodeRegistry
from engine.schema import INT, MODEL, STRING, Input, Output
from tests.engine.stub_nodes import STUBS, G, StubSettings, record, schema, scratch


class HeldModel:
    """What the held loader returns: a model handle (``key``/``kind``) the manager would read."""

    kind = "unet"

    def __init__(self, name: str) -> None:
        self.key = f"held:{name}"


class HeldLoader(Node):
    """A loader whose header read waits until the test opens ``record["gate"]``."""

    SCHEMA = schema("HeldLoader", (Input("name", STRING, "the model file"),), (Output("MODEL", MODEL, "m"),))

    def run(self, ctx: NodeContext, *, name: str) -> tuple[HeldModel]:
        found = scratch(ctx)
        found["entered"].set()
        if not found["gate"].wait(60):
            raise RuntimeError("the test never opened the gate")
        record(ctx, "HeldLoader")
        return (HeldModel(name),)


class UseModel(Node):
    SCHEMA = schema("UseModel", (Input("model", MODEL, "the model"),), (Output("INT", INT, "n"),))

    def run(self, ctx: NodeContext, *, model: HeldModel) -> tuple[int]:
        return (len(model.key),)


def _queue(tmp_path: Path, prefetch_kind: type[NextJobPrefetch]) -> tuple[LocalJobQueue, StubSettings]:
    registry = NodeRegistry()
    registry.register_all([*STUBS, HeldLoader, UseModel])
    folders = Folders(tmp_path / "in", tmp_path / "out", tmp_path / "temp")
    folders.ensure()
    settings = StubSettings(record={"gate": threading.Event(), "entered": threading.Event()})
    executor = Executor(registry, OutputCache(), folders, settings=settings)
    prefetch = prefetch_kind(executor)
    prefetch.look_ahead = ExpiresOnceEntered(settings.record["entered"])
    return LocalJobQueue(executor, JobStore(tmp_path / "jobs.sqlite"), prefetch=prefetch), settings


class ExpiresOnceEntered(LookAhead):
    """A look-ahead whose wait runs out only once the held read has begun: the running job's wait
    is read when it starts (``done.wait(self.wait_s)``), so the read is under way whichever thread
    the scheduler runs first, and the wait then expires at once (the read stays held)."""

    def __init__(self, entered: threading.Event) -> None:
        self.entered = entered
        super().__init__()

    @property  # type: ignore[override]
    def wait_s(self) -> float:
        if not self.entered.wait(60):
            raise RuntimeError("the held read never began")
        return 0.0

    @wait_s.setter
    def wait_s(self, value: float) -> None:
        pass


def _front_job() -> dict[str, Any]:
    g = G()
    g.add("Show", value=g.out(g.add("Const", value=7)))
    return g.prompt


def _held_job() -> dict[str, Any]:
    g = G()
    g.add("Show", value=g.out(g.add("UseModel", model=g.out(g.add("HeldLoader", name="stalled.gguf")))))
    return g.prompt


@pytest.mark.parametrize("prefetch_kind", [NextJobPrefetch, PlanAwarePrefetch])
def test_a_queued_job_whose_model_read_hangs_does_not_hold_up_the_job_in_front(
    tmp_path: Path, prefetch_kind: type[NextJobPrefetch]
) -> None:
    queue, settings = _queue(tmp_path, prefetch_kind)
    found = settings.record
    seen: dict[str, bool] = {}

    def on_notice(notice: Notice) -> None:
        if isinstance(notice, JobFinished) and notice.record.spec.prompt_id == "front":
            seen["read_started"] = found["entered"].is_set()
            seen["read_still_held"] = not found["gate"].is_set()
            found["gate"].set()  # now the stalled file "answers"

    queue.subscribe(on_notice)
    queue.submit(JobSpec(prompt=_front_job(), prompt_id="front"))
    queue.submit(JobSpec(prompt=_held_job(), prompt_id="held"))
    records = {r.spec.prompt_id: r for r in queue.drain()}

    assert records["front"].status == "succeeded"
    # the front job finished while the queued job's read had started and was still held
    assert seen == {"read_started": True, "read_still_held": True}
    assert queue.prefetch is not None and queue.prefetch.look_ahead.abandoned >= 1
    assert records["held"].status == "succeeded"  # and the held job itself ran once its file answered


def test_look_ahead_failure_is_one_log_line(caplog: pytest.LogCaptureFixture) -> None:
    def broken(stop: AbandonFlag) -> list[Any]:
        raise ValueError("header of x.gguf: array of 2^40 elements, 12 bytes left")

    with caplog.at_level(logging.WARNING, logger="loom.jobs"):
        assert LookAhead(wait_s=5).run("reading ahead for job q", broken) is None
    lines = [r for r in caplog.records if r.name == "loom.jobs"]
    assert len(lines) == 1 and lines[0].exc_info is None
    assert "reading ahead for job q failed" in lines[0].getMessage()
    assert "2^40 elements" in lines[0].getMessage()


def test_while_an_abandoned_look_ahead_is_stuck_later_jobs_do_not_wait_for_another() -> None:
    gate, started = threading.Event(), threading.Event()
    calls: list[str] = []

    def stuck(stop: AbandonFlag) -> list[Any]:
        started.set()
        gate.wait(60)
        return []

    look = LookAhead(wait_s=0.01)
    try:
        assert look.run("first", stuck) is None
        assert started.wait(60)  # the stuck work runs (on its own thread) even though abandoned
        assert look.run("second", lambda stop: calls.append("second") or []) is None
        assert calls == []  # skipped: no second thread piles up behind the stuck read
    finally:
        gate.set()


def test_an_abandoned_flag_stays_set_for_side_runs_started_later(tmp_path: Path) -> None:
    registry = NodeRegistry()
    registry.register_all(STUBS)
    folders = Folders(tmp_path / "in", tmp_path / "out", tmp_path / "temp")
    stop = AbandonFlag()
    stop.abandon()
    side = Executor(registry, OutputCache(), folders, settings=StubSettings(), interrupt=stop)
    result = side.run(RunRequest(prompt=_front_job()))
    assert result.status == "interrupted"  # Executor.run clears its flag on start; this one stays set
