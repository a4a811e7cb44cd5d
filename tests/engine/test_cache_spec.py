"""Cache behaviour as a specification: what runs and what is served from the cache, across workflows."""

from __future__ import annotations

from pathlib import Path

from engine.cache import OutputCache
from engine.node import Node
from engine.registry import NodeRegistry
from tests.engine.conftest import Harness
from tests.engine.stub_nodes import STUBS, G


def chain() -> G:
    g = G()
    a = g.add("Const", value=1)
    b = g.add("Const", value=2)
    s = g.add("Add", a=g.out(a), b=g.out(b))
    g.add("Show", value=g.out(s))
    return g


def test_first_run_executes_everything(harness: Harness) -> None:
    result = harness.run(chain().prompt)
    assert result.status == "success"
    assert set(result.executed) == {"1", "2", "3", "4"}
    assert result.cached == []
    assert result.outputs == {"4": {"text": ["3"]}}


def test_identical_resubmit_is_fully_cached_and_resends_ui(harness: Harness) -> None:
    harness.run(chain().prompt)
    result = harness.run(chain().prompt)
    assert result.executed == []
    # every node whose output the run took from the cache, as ComfyUI's execution_cached lists them
    # (nothing upstream of the output node ran, but their outputs are cached all the same)
    assert result.cached == ["1", "2", "3", "4"]
    cached_events = [e for e in harness.events if e.type == "execution_cached"]
    assert cached_events[-1].data()["nodes"] == ["1", "2", "3", "4"]
    assert harness.calls == []
    assert result.outputs == {"4": {"text": ["3"]}}
    executed = [e for e in harness.events if e.type == "executed"]
    assert len(executed) == 1 and executed[0].data()["output"] == {"text": ["3"]}


def test_changed_constant_reruns_exactly_that_node_and_descendants(harness: Harness) -> None:
    harness.run(chain().prompt)
    g = chain()
    g.prompt["2"]["inputs"]["value"] = 5
    result = harness.run(g.prompt)
    assert sorted(result.executed) == ["2", "3", "4"]
    assert result.cached == ["1"]
    assert result.outputs["4"] == {"text": ["6"]}


def test_same_subgraph_under_other_ids_hits(harness: Harness) -> None:
    harness.run(chain().prompt)
    g = G(start=100)
    a = g.add("Const", value=1)
    b = g.add("Const", value=2)
    s = g.add("Add", a=g.out(a), b=g.out(b))
    g.add("Show", value=g.out(s))
    result = harness.run(g.prompt)
    assert result.executed == []
    assert result.cached == ["100", "101", "102", "103"]  # every node served from the cache


def test_shared_prefix_between_workflows_hits(harness: Harness) -> None:
    harness.run(chain().prompt)
    g = chain()
    d = g.add("Double", value=g.out("3"))
    g.add("Show", value=g.out(d))
    result = harness.run(g.prompt)
    assert sorted(result.executed) == ["5", "6"]
    assert "3" in result.cached


def test_not_idempotent_always_runs_and_so_do_its_consumers(harness: Harness) -> None:
    g = G()
    r = g.add("Random")
    g.add("Show", value=g.out(r))
    first = harness.run(g.prompt)
    second = harness.run(g.prompt)
    assert sorted(first.executed) == sorted(second.executed) == ["1", "2"]
    assert first.outputs["2"] != second.outputs["2"]


def test_fingerprint_change_reruns_the_file_reader(harness: Harness) -> None:
    (harness.folders.input_dir / "a.txt").write_text("one")
    g = G()
    f = g.add("ReadFile", name="a.txt")
    g.add("Show", value=g.out(f))
    assert harness.run(g.prompt).outputs["2"] == {"text": ["one"]}
    assert harness.run(g.prompt).executed == []
    (harness.folders.input_dir / "a.txt").write_text("two")
    result = harness.run(g.prompt)
    assert sorted(result.executed) == ["1", "2"]
    assert result.outputs["2"] == {"text": ["two"]}


PLUGIN_SOURCE = """
from engine.node import Node
from engine.schema import INT, Output
from tests.engine.stub_nodes import record, schema


class Versioned(Node):
    SCHEMA = schema("Versioned", (), (Output("INT", INT, "n"),))

    def run(self, ctx):
        record(ctx, "Versioned")
        return (RESULT,)
"""


def _load_versioned(path: Path, module_name: str, result: int) -> type[Node]:
    """Write the node's module (as a user editing a plugin would) and import it afresh."""
    import importlib.util

    path.write_text(PLUGIN_SOURCE.replace("RESULT", str(result)))
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Versioned  # type: ignore[no-any-return]


def test_changed_node_code_invalidates_its_outputs(tmp_path: Path) -> None:
    cache = OutputCache()
    g = G()
    v = g.add("Versioned")
    g.add("Show", value=g.out(v))
    regs = []
    for version, result in enumerate((1, 2)):
        reg = NodeRegistry()
        reg.register_all(STUBS)
        reg.register(_load_versioned(tmp_path / "versioned_node.py", f"versioned_v{version}", result))
        regs.append(reg)
    old = Harness(tmp_path, cache, regs[0])
    new = Harness(tmp_path, cache, regs[1])
    assert old.run(g.prompt).outputs["2"] == {"text": ["1"]}
    assert old.run(g.prompt).executed == []
    result = new.run(g.prompt)
    assert sorted(result.executed) == ["1", "2"]
    assert result.outputs["2"] == {"text": ["2"]}


def test_unhashable_constant_never_hits(harness: Harness) -> None:
    g = G()
    g.add("Show", value={"not": {"json": object()}})
    assert harness.run(g.prompt).executed == ["1"]
    assert harness.run(g.prompt).executed == ["1"]


def test_lru_budget_evicts_oldest(tmp_path: Path) -> None:
    cache = OutputCache(budget_bytes=400)
    cache.put("k1", [["x" * 100]], None)
    cache.put("k2", [["y" * 100]], None)
    cache.put("k3", [["z" * 100]], None)
    assert "k1" not in cache and "k3" in cache
    assert cache.stats.evictions >= 1
    assert cache.stats.bytes <= 400


def test_failure_keeps_computed_outputs_cached_and_correct(harness: Harness) -> None:
    g = G()
    a = g.add("Const", value=3)
    d = g.add("Double", value=g.out(a))
    f = g.add("Fail", value=g.out(d))
    g.add("Show", value=g.out(f))
    result = harness.run(g.prompt)
    assert result.status == "error"
    assert result.error is not None and result.error["node_id"] == "3"
    assert result.error["exception_type"] == "ValueError"
    assert "always fails" in result.error["exception_message"]
    g2 = G()
    a2 = g2.add("Const", value=3)
    d2 = g2.add("Double", value=g2.out(a2))
    g2.add("Show", value=g2.out(d2))
    ok = harness.run(g2.prompt)
    assert ok.executed == ["3"] and ok.outputs["3"] == {"text": ["6"]}


def test_partial_execution_runs_only_requested_outputs(harness: Harness) -> None:
    g = chain()
    c = g.add("Const", value=9)
    g.add("Show", value=g.out(c))
    result = harness.run(g.prompt, outputs=["6"])
    assert sorted(result.executed) == ["5", "6"]
    assert list(result.outputs) == ["6"]
