"""The list nodes (nodes/text/lists.py): whole lists in, list outputs that make later nodes run once
per item, ComfyUI's growable ``inputs.inputN`` slots, and teaching errors for empty lists and bad
indices."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engine.cache import OutputCache
from engine.context import Folders, NodeContext
from engine.executor import Executor, RunRequest
from engine.registry import NodeRegistry
from nodes.text import lists as li
from nodes.text import text_edit
from nodes.text.primitives import NODES as UTILITY_NODES


@pytest.fixture
def ctx(tmp_path: Path) -> NodeContext:
    return NodeContext(node_id="1", prompt_id="p", folders=Folders(tmp_path, tmp_path, tmp_path))


def test_create_list_joins_slots_in_order(ctx: NodeContext) -> None:
    joined = li.CreateList().run(ctx, **{"inputs.input1": ["c"], "inputs.input0": ["a", "b"]})
    assert joined == (["a", "b", "c"],)
    with pytest.raises(li.ListError, match="connect at least one input"):
        li.CreateList().run(ctx, **{"inputs.input0": []})
    info = li.CreateList.SCHEMA.export()
    assert list(info["input"]["required"]) == ["inputs.input0"] and info["output_is_list"] == [True]


def test_get_item_from_list(ctx: NodeContext) -> None:
    node = li.GetItemFromList()
    assert node.run(ctx, list=["a", "b", "c"], index=[1]) == ("b",)
    assert node.run(ctx, list=["a", "b", "c"], index=[-1]) == ("c",)
    with pytest.raises(li.ListError, match="list: the list is empty"):
        node.run(ctx, list=[], index=[0])
    with pytest.raises(li.ListError, match="index: expected an integer from -3 to 2 .*found 3"):
        node.run(ctx, list=["a", "b", "c"], index=[3])


def test_merges_keep_every_item_and_refuse_empty(ctx: NodeContext) -> None:
    assert li.MergeTextLists().run(ctx, texts=["a", "b"]) == (["a", "b"],)
    with pytest.raises(li.ListError, match="images: the list is empty"):
        li.MergeImageLists().run(ctx, images=[])


def run_prompt(tmp_path: Path, prompt: dict[str, Any]) -> Any:
    registry = NodeRegistry()
    registry.register_all([*UTILITY_NODES, *text_edit.NODES, *li.NODES])
    return Executor(registry, OutputCache(), Folders(tmp_path, tmp_path, tmp_path)).run(
        RunRequest(prompt=prompt)
    )


def strings(*texts: str) -> dict[str, Any]:
    return {
        str(10 + i): {"class_type": "PrimitiveString", "inputs": {"value": t}} for i, t in enumerate(texts)
    }


def test_a_created_list_runs_the_next_node_once_per_item(tmp_path: Path) -> None:
    prompt = {
        **strings("fox", "owl"),
        "1": {"class_type": "CreateList", "inputs": {"inputs.input0": ["10", 0], "inputs.input1": ["11", 0]}},
        "2": {"class_type": "TextToUppercase", "inputs": {"text": ["1", 0]}},
        "3": {"class_type": "GetItemFromList", "inputs": {"list": ["2", 0], "index": 1}},
        "4": {"class_type": "PreviewAny", "inputs": {"source": ["2", 0]}},
        "5": {"class_type": "PreviewAny", "inputs": {"source": ["3", 0]}},
    }
    result = run_prompt(tmp_path, prompt)
    assert result.status == "success", json.dumps(result.error)
    assert result.outputs["4"]["text"] == ["FOX", "OWL"]
    assert result.outputs["5"]["text"] == ["OWL"]


def test_an_index_past_the_end_fails_the_run_naming_the_input(tmp_path: Path) -> None:
    prompt = {
        **strings("fox"),
        "1": {"class_type": "CreateList", "inputs": {"inputs.input0": ["10", 0]}},
        "3": {"class_type": "GetItemFromList", "inputs": {"list": ["1", 0], "index": 5}},
        "5": {"class_type": "PreviewAny", "inputs": {"source": ["3", 0]}},
    }
    result = run_prompt(tmp_path, prompt)
    assert result.status != "success" and "index: expected an integer from -1 to 0" in json.dumps(
        result.error
    )
