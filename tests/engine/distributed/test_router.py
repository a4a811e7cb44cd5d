"""The routing rules as a spec: pure logic, a fake clock, no Ray."""

from __future__ import annotations

import pytest

from engine.distributed.router import Router, Ticket, first_model_finder
from nodes.bench.stubs.worker_runtime import make_registry, workflow


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def router(clock: Clock, workers: list[str], *, load_s: float = 5.0, run_s: float = 1.0) -> Router:
    r = Router(default_load_s=load_s, default_run_s=run_s, clock=clock)
    for w in workers:
        r.add_worker(w)
    return r


def placed(r: Router, *tickets: Ticket) -> dict[str, str]:
    return {a.job_id: a.worker_id for a in r.plan(list(tickets))}


def test_an_idle_worker_with_the_model_resident_takes_the_job(clock: Clock) -> None:
    r = router(clock, ["w1", "w2"])
    assert placed(r, Ticket("j1", "A"), Ticket("j2", "B")) == {"j1": "w1", "j2": "w2"}
    r.finished("w1", run_s=1.0, load_s=5.0)
    r.finished("w2", run_s=1.0, load_s=5.0)
    assert placed(r, Ticket("j3", "B"), Ticket("j4", "A")) == {"j3": "w2", "j4": "w1"}
    assert [a.reason for a in r.plan([])] == []


def test_a_job_waits_for_the_busy_worker_holding_its_model_when_that_beats_a_load(clock: Clock) -> None:
    r = router(clock, ["w1", "w2"], load_s=5.0, run_s=1.0)
    assert placed(r, Ticket("j1", "A")) == {"j1": "w1"}
    # w2 is idle, but w1 frees up in ~1 s while loading A on w2 costs ~5 s: j2 waits; j3 (B) goes on.
    assert placed(r, Ticket("j2", "A"), Ticket("j3", "B")) == {"j3": "w2"}
    r.finished("w1", run_s=1.0, load_s=5.0)
    assert placed(r, Ticket("j2", "A")) == {"j2": "w1"}


def test_a_job_loads_elsewhere_when_the_queue_behind_the_holder_is_longer_than_a_load(clock: Clock) -> None:
    r = router(clock, ["w1", "w2"], load_s=2.5, run_s=1.0)
    assert placed(r, Ticket("j1", "A")) == {"j1": "w1"}
    # j2 and j3 wait (1 s, 2 s < 2.5 s); j4 would wait 3 s > 2.5 s: it loads A on w2.
    got = placed(r, Ticket("j2", "A"), Ticket("j3", "A"), Ticket("j4", "A"))
    assert got == {"j4": "w2"}


def test_elapsed_time_of_the_running_job_shortens_the_expected_wait(clock: Clock) -> None:
    r = router(clock, ["w1", "w2"], load_s=1.0, run_s=3.0)
    placed(r, Ticket("j1", "A"))
    assert placed(r, Ticket("j2", "A")) == {"j2": "w2"}  # 3 s left > 1 s load
    r2 = router(clock, ["w1", "w2"], load_s=1.0, run_s=3.0)
    placed(r2, Ticket("j1", "A"))
    clock.now += 2.5
    assert placed(r2, Ticket("j2", "A")) == {}  # 0.5 s left < 1 s load: wait


def test_without_affinity_an_empty_worker_then_an_unwanted_model_then_the_lru_one(clock: Clock) -> None:
    r = router(clock, ["w1", "w2", "w3"], load_s=0.1)
    placed(r, Ticket("a", "A"), Ticket("b", "B"))
    for w in ("w1", "w2"):
        r.finished(w, run_s=1.0, load_s=0.1)
    assert r.plan([Ticket("c", "C")])[0].reason == "empty"  # w3 had nothing resident
    r.finished("w3", run_s=1.0, load_s=0.1)
    clock.now += 1
    r.finished("w1", run_s=0.0, load_s=0.0)  # touches nothing: last_used is when the job ended
    # D evicts someone: B (w2) is least recently used, but it is still wanted by a later job.
    got = r.plan([Ticket("d", "D"), Ticket("e", "B")])
    assert {a.job_id: (a.worker_id, a.reason) for a in got} == {"d": ("w3", "lru"), "e": ("w2", "resident")}


def test_jobs_without_a_model_take_any_idle_worker(clock: Clock) -> None:
    r = router(clock, ["w1"])
    assert [a.reason for a in r.plan([Ticket("x", None)])] == ["no-model"]
    assert r.plan([Ticket("y", None)]) == []  # w1 is busy


def test_estimates_are_learned_from_the_workers_figures(clock: Clock) -> None:
    r = router(clock, ["w1"], load_s=9.0, run_s=9.0)
    placed(r, Ticket("j1", "A"))
    r.finished("w1", run_s=2.0, load_s=4.0)
    assert r.estimates.load("A") == 4.0 and r.estimates.run("A") == 2.0 and r.estimates.run("B") == 2.0
    placed(r, Ticket("j2", "A"))
    r.finished("w1", run_s=1.0, load_s=0.0)  # no load this time: the load estimate is kept
    assert r.estimates.load("A") == 4.0 and r.estimates.run("A") == pytest.approx(1.7)


def test_a_dead_worker_gives_back_its_job_and_a_new_one_gets_work(clock: Clock) -> None:
    r = router(clock, ["w1"])
    placed(r, Ticket("j1", "A"))
    assert r.remove_worker("w1") == "j1"
    assert r.plan([Ticket("j1", "A")]) == []
    r.add_worker("w2")
    assert placed(r, Ticket("j1", "A")) == {"j1": "w2"}
    with pytest.raises(ValueError, match="already"):
        r.add_worker("w2")


def test_alternating_models_on_two_workers_swap_nothing_after_warm_up(clock: Clock) -> None:
    """Simulate a queue of 20 alternating A/B jobs; count model changes per worker."""
    r = router(clock, ["w1", "w2"], load_s=0.5, run_s=0.2)
    pending = [Ticket(f"j{i}", "AB"[i % 2]) for i in range(20)]
    resident: dict[str, str | None] = {"w1": None, "w2": None}
    loads: list[tuple[str, str]] = []
    running: dict[str, Ticket] = {}
    while pending or running:
        for a in r.plan(pending):
            ticket = next(t for t in pending if t.job_id == a.job_id)
            pending.remove(ticket)
            running[a.worker_id] = ticket
            if resident[a.worker_id] != ticket.model:
                loads.append((a.worker_id, str(ticket.model)))
                resident[a.worker_id] = ticket.model
        clock.now += 0.1
        worker = next(iter(running))  # the one that started first ends first
        running.pop(worker)
        r.finished(worker, run_s=0.2, load_s=0.0)
    assert sorted(loads) == [("w1", "A"), ("w2", "B")]


def test_the_first_model_of_a_workflow_comes_from_loader_schemas() -> None:
    model_of = first_model_finder(make_registry())
    assert model_of(workflow("B.safetensors", 1)) == "checkpoints/B.safetensors"
    assert model_of({"1": {"class_type": "FakeSaveImage", "inputs": {}}}) is None
    assert model_of({"1": {"class_type": "Unknown", "inputs": {}}, "2": "junk"}) is None  # type: ignore[dict-item]
