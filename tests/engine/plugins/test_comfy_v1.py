"""ComfyUI V1 classes through ComfyV1NodeDef: object_info, execution, hooks, the shim at run time."""

from __future__ import annotations

from typing import Any

import pytest

from engine.node import NodeDef
from engine.plugins.comfy_v1 import ALWAYS_CHANGED_PREFIX, ComfyV1NodeDef
from engine.plugins.loader import PluginReport
from tests.engine.plugins.conftest import Env


def node(env: Env, name: str) -> Any:
    node_def = env.registry.get(name)
    assert node_def is not None, name
    return node_def


def test_object_info_matches_the_comfyui_declaration(loaded: tuple[Env, PluginReport]) -> None:
    env, _ = loaded
    info = env.registry.object_info("TextTools_Repeat")["TextTools_Repeat"]
    required, optional = info["input"]["required"], info["input"]["optional"]
    assert info["input_order"]["required"] == ["text", "times", "mode"]
    assert required["text"] == ["STRING", {"default": "ab", "multiline": True, "tooltip": "What to repeat."}]
    times = required["times"][1]
    assert required["times"][0] == "INT" and (
        times["default"],
        times["min"],
        times["max"],
        times["step"],
    ) == (2, 1, 10, 1)
    assert required["mode"][0] == ["plain", "numbered"] and required["mode"][1]["default"] == "plain"
    assert optional["separator"][1]["placeholder"] == "between copies"
    assert optional["scale"][1]["round"] == 0.01 and optional["scale"][1]["display"] == "slider"
    assert info["input"]["hidden"] == {
        "prompt": "PROMPT",
        "unique_id": "UNIQUE_ID",
        "extra_pnginfo": "EXTRA_PNGINFO",
        "dynprompt": "DYNPROMPT",
    }
    assert info["output"] == ["STRING", "INT"] and info["output_name"] == ["text", "length"]
    assert info["output_tooltips"] == ["The repeated text.", "Its length in characters."]
    assert info["output_is_list"] == [False, False]
    assert (info["display_name"], info["category"], info["description"]) == (
        "Repeat Text",
        "text_tools/text",
        "Repeats a text several times.",
    )
    assert info["experimental"] is True and info["deprecated"] is False and info["output_node"] is False
    assert info["python_module"] == "custom_nodes.comfy_text_tools"


def test_generated_descriptions_are_marked(loaded: tuple[Env, PluginReport]) -> None:
    env, _ = loaded
    repeat = node(env, "TextTools_Repeat")
    assert isinstance(repeat, ComfyV1NodeDef)
    assert "times" in repeat.ports.generated and "text" not in repeat.ports.generated
    assert (
        repeat.schema.input("times").description == "times (INT); no description given by the node's author"
    )
    upper = node(env, "TextTools_OldUpper")
    assert upper.schema.description.startswith("TextTools_OldUpper (ComfyUI node from pack comfy_text_tools")


def test_execute_passes_hidden_inputs_under_the_pack_names(loaded: tuple[Env, PluginReport]) -> None:
    env, _ = loaded
    repeat = node(env, "TextTools_Repeat")
    inputs = {
        "text": "ab",
        "times": 3,
        "mode": "numbered",
        "separator": "-",
        "prompt": {"1": {}},
        "unique_id": "7",
        "extra_pnginfo": {"k": 1},
        "dynprompt": None,
    }
    out = repeat.execute(env.ctx("7"), inputs)
    assert out.values == ("1:ab-2:ab-3:ab", 14) and out.ui is None
    instance = repeat._instances["7"]  # one instance per workflow node, as in ComfyUI
    assert instance.last_hidden == {"prompt": {"1": {}}, "unique_id": "7", "extra_pnginfo": {"k": 1}}
    repeat.execute(env.ctx("7"), inputs)
    assert repeat._instances["7"] is instance


def test_validate_inputs_hook(loaded: tuple[Env, PluginReport]) -> None:
    env, _ = loaded
    repeat = node(env, "TextTools_Repeat")
    assert repeat.validate_inputs({"text": "x", "times": 2, "mode": "plain"}) is True
    assert (
        repeat.validate_inputs({"text": "x", "times": 7, "mode": "plain"})
        == "7 is an unlucky number of repetitions"
    )
    assert repeat.self_validated == frozenset({"times"})


def test_lazy_inputs_and_check_lazy_status(loaded: tuple[Env, PluginReport]) -> None:
    env, _ = loaded
    switch = node(env, "TextTools_LazySwitch")
    assert switch.has_lazy_status and switch.schema.input("a").lazy and switch.schema.input("a").force_input
    assert switch.check_lazy_status(env.ctx(), {"choose_a": False, "a": None, "b": None}) == ["b"]
    assert switch.check_lazy_status(env.ctx(), {"choose_a": False, "a": None, "b": "B"}) == []
    assert switch.execute(env.ctx(), {"choose_a": False, "a": None, "b": "B"}).values == ("B",)
    assert not node(env, "TextTools_Repeat").has_lazy_status


def test_async_function_list_result_deprecated_and_default_input(loaded: tuple[Env, PluginReport]) -> None:
    env, _ = loaded
    upper = node(env, "TextTools_OldUpper")
    assert upper.schema.deprecated and upper.schema.input("text").force_input
    assert upper.execute(env.ctx(), {"text": "abc"}).values == ("ABC",)


def test_not_idempotent_combo_options_and_repeated_output_names(loaded: tuple[Env, PluginReport]) -> None:
    env, _ = loaded
    tag = node(env, "TextTools_RandomTag")
    assert tag.schema.not_idempotent and tag.schema.input("seed").control_after_generate
    split = node(env, "TextTools_SplitNumber")
    assert [o.name for o in split.schema.outputs] == ["INT", "INT_2"]
    assert split.schema.input("base").options == (10, 16)
    assert split.execute(env.ctx(), {"value": 47, "base": 10}).values == (4, 7)


def test_is_changed_fingerprints_file_content_and_nan_never_repeats(loaded: tuple[Env, PluginReport]) -> None:
    env, _ = loaded
    note = env.folders.input_dir / "note.txt"
    note.write_text("one")
    reader = node(env, "IsChanged_FileText")
    first = reader.fingerprint(env.folders, {"name": "note.txt"})
    assert first == reader.fingerprint(env.folders, {"name": "note.txt"})
    note.write_text("two")
    assert reader.fingerprint(env.folders, {"name": "note.txt"}) != first
    assert reader.execute(env.ctx(), {"name": "note.txt"}).values == ("two",)
    clock = node(env, "IsChanged_Clock")
    a, b = clock.fingerprint(env.folders, {}), clock.fingerprint(env.folders, {})
    assert a != b and a.startswith(ALWAYS_CHANGED_PREFIX)
    assert node(env, "TextTools_Repeat").fingerprint(env.folders, {}) is None


def test_folder_paths_at_import_and_at_run_time(loaded: tuple[Env, PluginReport]) -> None:
    env, _ = loaded
    pick = node(env, "FolderTools_PickCheckpoint")
    assert pick.schema.input("ckpt_name").options == ("tiny.safetensors",)
    name, full = pick.execute(env.ctx(), {"ckpt_name": "tiny.safetensors"}).values
    assert full == str(env.models_dir / "checkpoints" / "tiny.safetensors")
    save = node(env, "FolderTools_SaveNote")
    assert save.schema.output_node and save.schema.outputs == ()
    ui = save.execute(env.ctx(), {"text": "hi", "filename_prefix": "notes/note"}).ui
    assert ui == {"files": [{"filename": "note_00001_.txt", "subfolder": "notes", "type": "output"}]}
    assert (env.folders.output_dir / "notes" / "note_00001_.txt").read_text() == "hi"
    again = save.execute(env.ctx(), {"text": "ho", "filename_prefix": "notes/note"}).ui
    assert again["files"][0]["filename"] == "note_00002_.txt"
    assert env.shim.model_folders["folder_tools_presets"][0] == [str(env.models_dir / "presets")]


def test_output_node_ui_and_send_sync(loaded: tuple[Env, PluginReport]) -> None:
    env, _ = loaded
    show = node(env, "OutputPack_ShowText")
    assert show.schema.output_node and show.schema.hidden == ("UNIQUE_ID",)
    out = show.execute(env.ctx("12"), {"text": "hello", "unique_id": "12"})
    assert out.values == ("hello",) and out.ui == {"text": ["hello"]}
    assert env.events == [("output_pack.shown", {"node": "12", "text": "hello"}, None)]


def test_list_nodes(loaded: tuple[Env, PluginReport]) -> None:
    env, _ = loaded
    split, join = node(env, "Lists_SplitWords"), node(env, "Lists_JoinWords")
    assert split.schema.outputs[0].is_list and join.schema.input_is_list
    assert env.registry.object_info("Lists_SplitWords")["Lists_SplitWords"]["output_is_list"] == [True]
    assert split.execute(env.ctx(), {"text": "a b"}).values == (["a", "b"],)
    assert join.execute(env.ctx(), {"words": ["a", "b"], "separator": ["+"]}).values == ("a+b",)


def test_a_raising_node_names_its_pack(loaded: tuple[Env, PluginReport]) -> None:
    env, _ = loaded
    reader: NodeDef = node(env, "IsChanged_FileText")
    with pytest.raises(FileNotFoundError) as caught:
        reader.execute(env.ctx(), {"name": "absent.txt"})
    assert "from plugin pack 'comfy_is_changed'" in "".join(caught.value.__notes__)


def test_an_expansion_result_passes_through(env: Env) -> None:
    from engine.plugins.comfy_v1 import normalize_result

    graph = {"a.1": {"class_type": "StringConcatenate", "inputs": {}}}
    out = normalize_result({"result": (["a.1", 0],), "expand": graph}, 1, "X")
    assert out.values == (["a.1", 0],) and out.expand == graph


def test_refresh_rereads_input_types(loaded: tuple[Env, PluginReport]) -> None:
    env, _ = loaded
    pick = node(env, "FolderTools_PickCheckpoint")
    (env.models_dir / "checkpoints" / "new.safetensors").write_bytes(b"y")
    assert pick.schema.input("ckpt_name").options == ("tiny.safetensors",)
    pick.refresh()
    assert pick.schema.input("ckpt_name").options == ("new.safetensors", "tiny.safetensors")


def test_hooks_requiring_a_linked_input_get_none(env: Env, tmp_path) -> None:
    pack = tmp_path / "plugins" / "linked_hooks.py"
    pack.parent.mkdir()
    pack.write_text(
        "class N:\n"
        "    CATEGORY = 't'\n    FUNCTION = 'f'\n    RETURN_TYPES = ('STRING',)\n"
        "    @classmethod\n    def INPUT_TYPES(cls):\n"
        "        return {'required': {'image': ('IMAGE',), 'mode': (['a', 'b'],)}}\n"
        "    @classmethod\n    def VALIDATE_INPUTS(cls, image, mode):\n"
        "        return image is None and mode == 'a' or 'bad'\n"
        "    @classmethod\n    def IS_CHANGED(cls, image, mode):\n"
        "        return f'{image}-{mode}'\n"
        "    def f(self, image, mode):\n        return (mode,)\n"
        "NODE_CLASS_MAPPINGS = {'Linked_N': N}\n"
    )
    env.load(pack.parent)
    linked = node(env, "Linked_N")
    assert linked.validate_inputs({"mode": "a"}) is True
    assert linked.fingerprint(env.folders, {"mode": "b"}) == "None-b"
