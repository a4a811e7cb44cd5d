"""Node classes ComfyUI accepts that real packs declare: the V1 adapter registers them too.

A hidden input whose value is a list of choices (rgthree's Power Prompt), a wildcard type that is an
unhashable ``str`` subclass (Crystools, Easy-Use), input names that are not identifiers, one name in
both ``required`` and ``optional``, ``OUTPUT_IS_LIST`` shorter than ``RETURN_TYPES``, and a node for
the editor only, without ``FUNCTION``."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.engine.plugins.conftest import Env

PACK = """
class AnyType(str):
    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False


ANY = AnyType("*")


class HiddenChoices:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"text": ("STRING", {"default": "a"})},
                "hidden": {"values_insert_saved": (["CHOOSE", "one", "two"],), "unique_id": "UNIQUE_ID"}}

    RETURN_TYPES = ("STRING",)
    FUNCTION = "run"
    CATEGORY = "lenient"

    def run(self, text, values_insert_saved=None, unique_id=None):
        return (f"{text}|{values_insert_saved}",)


class Wildcard:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"anything": (ANY, {})}}

    RETURN_TYPES = (ANY,)
    FUNCTION = "run"
    CATEGORY = "lenient"

    def run(self, anything):
        return (anything,)


class OddNames:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"text 1": ("STRING", {"default": "x"}), "shared": ("INT", {"default": 1})},
                "optional": {"shared": ("INT", {"default": 2}), "A/B": ("STRING", {"default": "y"})}}

    RETURN_TYPES = ("STRING", "INT", "STRING")
    OUTPUT_IS_LIST = (False,)
    FUNCTION = "run"
    CATEGORY = "lenient"

    def run(self, **kwargs):
        return (kwargs["text 1"] + kwargs["A/B"], kwargs["shared"], "z")


class EditorOnly:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {}}

    RETURN_TYPES = ()
    CATEGORY = "lenient"


NODE_CLASS_MAPPINGS = {
    "Lenient_HiddenChoices": HiddenChoices,
    "Lenient_Wildcard": Wildcard,
    "Lenient_OddNames": OddNames,
    "Lenient_EditorOnly": EditorOnly,
}
"""


@pytest.fixture
def lenient(env: Env, tmp_path: Path) -> Env:
    pack = tmp_path / "custom_nodes" / "lenient_pack"
    pack.mkdir(parents=True)
    (pack / "__init__.py").write_text(textwrap.dedent(PACK))
    (status,) = env.load(tmp_path / "custom_nodes").packs
    assert status.ok, status.error
    assert status.rejected == {}
    assert sorted(status.nodes) == [
        "Lenient_EditorOnly",
        "Lenient_HiddenChoices",
        "Lenient_OddNames",
        "Lenient_Wildcard",
    ]
    return env


def node(env: Env, name: str):  # type: ignore[no-untyped-def]
    found = env.registry.get(name)
    assert found is not None
    return found


def test_a_hidden_choices_list_gets_none(lenient: Env) -> None:
    out = node(lenient, "Lenient_HiddenChoices").execute(lenient.ctx(), {"text": "a"})
    assert out.values == ("a|None",)


def test_a_wildcard_str_subclass_is_the_plain_wildcard_type(lenient: Env) -> None:
    schema = node(lenient, "Lenient_Wildcard").schema
    assert type(schema.inputs[0].type) is str and schema.inputs[0].type == "*"
    assert type(schema.outputs[0].type) is str and schema.outputs[0].type == "*"
    assert node(lenient, "Lenient_Wildcard").execute(lenient.ctx(), {"anything": 5}).values == (5,)


def test_odd_names_duplicates_and_short_output_is_list(lenient: Env) -> None:
    odd = node(lenient, "Lenient_OddNames")
    names = [(i.name, i.optional) for i in odd.schema.inputs]
    assert names == [("text 1", False), ("shared", False), ("A/B", True)]  # the required 'shared' kept
    assert [o.is_list for o in odd.schema.outputs] == [False, False, False]
    out = odd.execute(lenient.ctx(), {"text 1": "x", "shared": 3, "A/B": "y"})
    assert out.values == ("xy", 3, "z")


def test_an_editor_only_node_registers_and_explains_when_run(lenient: Env) -> None:
    editor_only = node(lenient, "Lenient_EditorOnly")
    assert editor_only.schema.outputs == ()
    with pytest.raises(NotImplementedError, match="declares no FUNCTION: it is a node for the editor only"):
        editor_only.execute(lenient.ctx(), {})
