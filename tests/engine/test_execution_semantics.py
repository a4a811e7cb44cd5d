"""Lists, lazy inputs, blockers, events, interrupt."""

from __future__ import annotations

import threading

from engine.executor import RunRequest
from tests.engine.conftest import Harness
from tests.engine.stub_nodes import G


def test_list_output_maps_over_consumers_and_list_input_gathers(harness: Harness) -> None:
    g = G()
    m = g.add("MakeList", n=4)
    d = g.add("Double", value=g.out(m))
    s = g.add("SumList", values=g.out(d))
    g.add("Show", value=g.out(s))
    g.add("Show", value=g.out(d))
    result = harness.run(g.prompt)
    assert [c for c in harness.calls if c[1] == "Double"] == [("2", "Double")] * 4
    assert result.outputs["4"] == {"text": ["12"]}
    assert result.outputs["5"] == {"text": ["0", "2", "4", "6"]}


def test_lazy_input_only_computes_the_branch_asked_for(harness: Harness) -> None:
    g = G()
    t = g.add("Const", value=1)
    f = g.add("Const", value=2)
    w = g.add("Switch", choose=False, on_true=g.out(t), on_false=g.out(f))
    g.add("Show", value=g.out(w))
    result = harness.run(g.prompt)
    assert result.outputs["4"] == {"text": ["2"]}
    assert "1" not in harness.ran()
    assert "2" in harness.ran()


def test_blocker_without_message_silently_stops_downstream(harness: Harness) -> None:
    g = G()
    c = g.add("Const", value=1)
    gate = g.add("Gate", value=g.out(c), open=False, message="")
    d = g.add("Double", value=g.out(gate))
    g.add("Show", value=g.out(d))
    result = harness.run(g.prompt)
    assert result.status == "success"
    assert "3" not in harness.ran() and "4" not in harness.ran()
    assert result.outputs == {}


def test_blocker_with_message_fails_the_consumer(harness: Harness) -> None:
    g = G()
    c = g.add("Const", value=1)
    gate = g.add("Gate", value=g.out(c), open=False, message="no entry")
    g.add("Show", value=g.out(gate))
    result = harness.run(g.prompt)
    assert result.status == "error"
    assert result.error is not None and result.error["node_id"] == "3"
    assert "no entry" in result.error["exception_message"]


def test_event_sequence_matches_comfyui(harness: Harness) -> None:
    g = G()
    c = g.add("Slow", steps=3)
    g.add("Show", value=g.out(c))
    harness.run(g.prompt, prompt_id="p1")
    types = [e.type for e in harness.events]
    assert types[:2] == ["execution_start", "execution_cached"]
    assert harness.events[1].data()["nodes"] == []
    assert types.count("progress") == 3
    assert types[-2:] == ["execution_success", "executing"]
    assert harness.events[-1].data() == {"node": None, "display_node": None, "prompt_id": "p1"}
    executing = [e.data()["node"] for e in harness.events if e.type == "executing"]
    assert executing == ["1", "2", None]
    assert all(e.prompt_id == "p1" for e in harness.events)
    harness.run(g.prompt, prompt_id="p2")
    types = [e.type for e in harness.events]
    assert types[:2] == ["execution_start", "execution_cached"]
    assert harness.events[1].data()["nodes"] == ["1", "2"]  # ComfyUI lists every cached node


def test_interrupt_stops_a_long_node_and_the_next_run_works(harness: Harness) -> None:
    started = threading.Event()
    harness.settings.record["slow_started"] = started
    g = G()
    s = g.add("Slow", steps=2000)
    g.add("Show", value=g.out(s))
    results = []
    worker = threading.Thread(
        target=lambda: results.append(harness.executor.run(RunRequest(prompt=g.prompt)))
    )
    worker.start()
    assert started.wait(30)
    harness.executor.interrupt.set()
    worker.join(30)
    assert not worker.is_alive()
    assert results[0].status == "interrupted"
    assert any(e.type == "execution_interrupted" for e in harness.events)
    g2 = G()
    s2 = g2.add("Slow", steps=2)
    g2.add("Show", value=g2.out(s2))
    assert harness.run(g2.prompt).status == "success"
