"""Workflows with plugin nodes through engine.executor.Executor, including cache invalidation."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from engine.cache import OutputCache
from engine.events import EventBus
from engine.executor import Executor, RunRequest, RunResult
from tests.engine.plugins.conftest import PACKS, Env, make_env


def run(env: Env, prompt: dict[str, Any], cache: OutputCache | None = None) -> RunResult:
    executor = Executor(
        env.registry, cache if cache is not None else OutputCache(), env.folders, bus=EventBus()
    )
    return executor.run(RunRequest(prompt=prompt))


REPEAT_AND_SHOW = {
    "1": {"class_type": "TextTools_Repeat", "inputs": {"text": "ab", "times": 2, "mode": "plain"}},
    "2": {"class_type": "OutputPack_ShowText", "inputs": {"text": ["1", 0]}},
}


def test_v1_workflow_runs_then_hits_the_cache(loaded: tuple[Env, Any]) -> None:
    env, _ = loaded
    cache = OutputCache()
    first = run(env, REPEAT_AND_SHOW, cache)
    assert first.status == "success", first.error
    assert first.executed == ["1", "2"] and first.outputs["2"] == {"text": ["abab"]}
    assert env.events == [("output_pack.shown", {"node": "2", "text": "abab"}, None)]
    second = run(env, REPEAT_AND_SHOW, cache)
    assert second.executed == [] and "2" in second.cached
    assert second.outputs["2"] == {"text": ["abab"]}


def test_list_nodes_in_a_workflow(loaded: tuple[Env, Any]) -> None:
    env, _ = loaded
    prompt = {
        "1": {"class_type": "Lists_SplitWords", "inputs": {"text": "a b c"}},
        "2": {"class_type": "TextTools_OldUpper", "inputs": {"text": ["1", 0]}},
        "3": {"class_type": "Lists_JoinWords", "inputs": {"words": ["2", 0], "separator": "+"}},
        "4": {"class_type": "OutputPack_ShowText", "inputs": {"text": ["3", 0]}},
    }
    result = run(env, prompt)
    assert result.status == "success", result.error
    assert result.outputs["4"] == {"text": ["A+B+C"]}


def test_nan_is_changed_always_reruns(loaded: tuple[Env, Any]) -> None:
    env, _ = loaded
    cache = OutputCache()
    prompt = {
        "1": {"class_type": "IsChanged_Clock", "inputs": {}},
        "2": {"class_type": "V3Pack_Show", "inputs": {"value": ["1", 0]}},
    }
    first, second = run(env, prompt, cache), run(env, prompt, cache)
    assert first.status == second.status == "success"
    assert "1" in first.executed and "1" in second.executed
    assert int(second.outputs["2"]["text"][0]) == int(first.outputs["2"]["text"][0]) + 1


def test_v3_workflow_and_lazy_switch(loaded: tuple[Env, Any]) -> None:
    env, _ = loaded
    prompt = {
        "1": {"class_type": "V3Pack_Multiply", "inputs": {"a": 6, "b": 7, "mode": "plain"}},
        "2": {"class_type": "V3Pack_Show", "inputs": {"value": ["1", 0]}},
        "3": {"class_type": "TextTools_Repeat", "inputs": {"text": "x", "times": 1, "mode": "plain"}},
        "4": {"class_type": "TextTools_Repeat", "inputs": {"text": "never", "times": 2, "mode": "plain"}},
        "5": {
            "class_type": "TextTools_LazySwitch",
            "inputs": {"choose_a": True, "a": ["3", 0], "b": ["4", 0]},
        },
        "6": {"class_type": "OutputPack_ShowText", "inputs": {"text": ["5", 0]}},
    }
    result = run(env, prompt)
    assert result.status == "success", result.error
    assert result.outputs["1"] == {"text": ["1: 42"]} and result.outputs["2"]["text"] == ["42"]
    assert result.outputs["6"] == {"text": ["x"]}
    assert "4" not in result.executed  # the lazy input that was not chosen never ran


def test_validate_inputs_hook_makes_the_workflow_invalid(loaded: tuple[Env, Any]) -> None:
    env, _ = loaded
    prompt = {
        **REPEAT_AND_SHOW,
        "1": {"class_type": "TextTools_Repeat", "inputs": {"text": "ab", "times": 7, "mode": "plain"}},
    }
    result = run(env, prompt)
    assert result.status == "invalid"
    assert "unlucky" in str(result.node_errors["1"])


def test_a_failing_plugin_node_fails_its_workflow_naming_the_pack(loaded: tuple[Env, Any]) -> None:
    env, _ = loaded
    prompt = {
        "1": {"class_type": "IsChanged_FileText", "inputs": {"name": "absent.txt"}},
        "2": {"class_type": "OutputPack_ShowText", "inputs": {"text": ["1", 0]}},
    }
    result = run(env, prompt)
    assert result.status == "error" and result.error is not None
    assert "plugin pack 'comfy_is_changed'" in str(result.error)
    ok = run(env, REPEAT_AND_SHOW)  # the next workflow is unaffected
    assert ok.status == "success"


def test_editing_a_plugin_between_two_registries_reexecutes(tmp_path: Path) -> None:
    plugins = tmp_path / "plugins"
    for name in ("comfy_lists", "comfy_output_node"):
        shutil.copytree(PACKS / name, plugins / name)
    prompt = {
        "1": {"class_type": "Lists_SplitWords", "inputs": {"text": "a b"}},
        "2": {"class_type": "Lists_JoinWords", "inputs": {"words": ["1", 0], "separator": "+"}},
        "3": {"class_type": "OutputPack_ShowText", "inputs": {"text": ["2", 0]}},
    }
    cache = OutputCache()  # shared, as across two server runs with a persisted cache

    def fresh_run(sub: str) -> RunResult:
        env = make_env(tmp_path / sub)
        env.load(plugins)
        return run(env, prompt, cache)

    first = fresh_run("a")
    assert first.outputs["3"] == {"text": ["a+b"]}
    unchanged = fresh_run("b")
    assert unchanged.executed == [] and unchanged.outputs["3"] == {"text": ["a+b"]}
    init = plugins / "comfy_lists" / "__init__.py"
    init.write_text(
        init.read_text().replace("separator[0].join(words)", "separator[0].join(reversed(words))")
    )
    edited = fresh_run("c")
    assert edited.outputs["3"] == {"text": ["b+a"]}
    assert set(edited.executed) == {"1", "2", "3"}
