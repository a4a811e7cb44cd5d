"""A ComfyUI V1 pack node that expands (``{"result": ..., "expand": GraphBuilder().finalize()}``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine.cache import OutputCache
from engine.events import EventBus
from engine.executor import Executor, RunRequest, RunResult
from tests.engine.plugins.conftest import Env, make_env

PACK = '''
from comfy_execution.graph_utils import GraphBuilder, is_link


class TripleJoin:
    """Joins a + b + c through two core StringConcatenate nodes it expands into."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"a": ("STRING", {"default": ""}), "b": ("STRING", {"default": ""}),
                             "c": ("STRING", {"default": ""})}}

    RETURN_TYPES = ("STRING",)
    FUNCTION = "join"
    CATEGORY = "test"

    def join(self, a, b, c):
        graph = GraphBuilder()
        first = graph.node("StringConcatenate", string_a=a, string_b=b)
        second = graph.node("StringConcatenate", string_a=first.out(0), string_b=c)
        assert is_link(second.out(0))
        return {"result": (second.out(0),), "expand": graph.finalize()}


class Show:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"text": ("STRING", {"forceInput": True})}}

    RETURN_TYPES = ()
    FUNCTION = "show"
    OUTPUT_NODE = True
    CATEGORY = "test"

    def show(self, text):
        return {"ui": {"text": [text]}}


NODE_CLASS_MAPPINGS = {"Expand_TripleJoin": TripleJoin, "Expand_Show": Show}
'''


def pack_env(tmp_path: Path) -> Env:
    env = make_env(tmp_path)
    pack = tmp_path / "custom_nodes" / "expand_pack"
    pack.mkdir(parents=True)
    (pack / "__init__.py").write_text(PACK)
    report = env.load(tmp_path / "custom_nodes")
    assert env.registry.get("Expand_TripleJoin") is not None, report
    return env


def run(env: Env, prompt: dict[str, Any], cache: OutputCache, bus: EventBus | None = None) -> RunResult:
    return Executor(env.registry, cache, env.folders, bus=bus or EventBus()).run(RunRequest(prompt=prompt))


PROMPT = {
    "1": {"class_type": "Expand_TripleJoin", "inputs": {"a": "x", "b": "y", "c": "z"}},
    "2": {"class_type": "Expand_Show", "inputs": {"text": ["1", 0]}},
}


def test_the_v1_expansion_equals_running_the_two_core_nodes(tmp_path: Path) -> None:
    env = pack_env(tmp_path)
    expanded = run(env, PROMPT, OutputCache())
    assert expanded.status == "success", expanded.error
    direct = run(
        env,
        {
            "1": {"class_type": "StringConcatenate", "inputs": {"string_a": "x", "string_b": "y"}},
            "3": {"class_type": "StringConcatenate", "inputs": {"string_a": ["1", 0], "string_b": "z"}},
            "2": {"class_type": "Expand_Show", "inputs": {"text": ["3", 0]}},
        },
        OutputCache(),
    )
    assert expanded.outputs["2"] == direct.outputs["2"] == {"text": ["xyz"]}
    assert {"1.0.0.1", "1.0.0.2"} <= set(expanded.executed)  # ComfyUI's default GraphBuilder ids


def test_ids_are_stable_and_a_second_run_is_cached(tmp_path: Path) -> None:
    env = pack_env(tmp_path)
    cache = OutputCache()
    first = run(env, PROMPT, cache)
    assert first.status == "success", first.error
    second = run(env, PROMPT, cache)
    assert second.executed == [] and second.outputs["2"] == {"text": ["xyz"]}
    changed = {**PROMPT, "1": {"class_type": "Expand_TripleJoin", "inputs": {"a": "x", "b": "y", "c": "w"}}}
    third = run(env, changed, cache)
    assert third.outputs["2"] == {"text": ["xyw"]}
    assert "1.0.0.1" not in third.executed and "1.0.0.2" in third.executed  # same id, same content: a hit


V3_PACK = """
from comfy_api.latest import io
from comfy_execution.graph_utils import GraphBuilder


class Twice(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(node_id="V3Expand_Twice", inputs=[io.String.Input("text")],
                         outputs=[io.String.Output()], enable_expand=True)

    @classmethod
    def execute(cls, text):
        graph = GraphBuilder()
        joined = graph.node("StringConcatenate", string_a=text, string_b=text)
        return io.NodeOutput(joined.out(0), expand=graph.finalize())


NODE_CLASS_MAPPINGS = {"V3Expand_Twice": Twice}
"""


def test_a_v3_node_output_with_expand_runs_its_sub_graph(tmp_path: Path) -> None:
    env = pack_env(tmp_path)
    pack = tmp_path / "v3_packs" / "v3_expand.py"
    pack.parent.mkdir()
    pack.write_text(V3_PACK)
    env.load(pack.parent)
    prompt = {
        "4": {"class_type": "V3Expand_Twice", "inputs": {"text": "ab"}},
        "5": {"class_type": "Expand_Show", "inputs": {"text": ["4", 0]}},
    }
    result = run(env, prompt, OutputCache())
    assert result.status == "success", result.error
    assert result.outputs["5"] == {"text": ["abab"]} and "4.0.0.1" in result.executed


def test_graph_builder_without_a_prefix_outside_a_node_says_what_to_do(tmp_path: Path) -> None:
    graph_utils = make_env(tmp_path).shim.graph_utils
    with pytest.raises(RuntimeError, match="pass a prefix"):
        graph_utils.GraphBuilder()
    builder = graph_utils.GraphBuilder("p.")
    node = builder.node("StringConcatenate", string_a="a")
    node.set_input("string_b", "b")
    assert builder.lookup_node("1") is node and graph_utils.is_link(node.out(0))
    assert builder.finalize() == {
        "p.1": {"class_type": "StringConcatenate", "inputs": {"string_a": "a", "string_b": "b"}}
    }
    graph, outputs = graph_utils.add_graph_prefix(builder.finalize(), (node.out(0), 5), "q.")
    assert list(graph) == ["q.p.1"] and outputs == (["q.p.1", 0], 5)
