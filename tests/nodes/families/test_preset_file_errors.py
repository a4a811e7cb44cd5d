"""Every mistake in a presets file is a PresetError naming the file, the entry and the fix, never
another exception; a string ``match`` is one word, not its letters (issue 33, item 7)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nodes.families.shipped_presets import Preset, PresetError, read_preset_file

DEFAULT = {
    "name": "x",
    "family": "sdxl",
    "steps": 20,
    "cfg": 7.0,
    "sampler_name": "euler",
    "scheduler": "normal",
}
VARIANT = {"name": "v", "family": "sdxl", "match": ["turbo"], "steps": 4}


@pytest.mark.parametrize(
    ("entry", "field"),
    [
        ({**VARIANT, "match": 5}, "match"),
        ({**VARIANT, "match": [1, 2]}, "match"),
        ({**VARIANT, "match": {"a": 1}}, "match"),
        ({**VARIANT, "name": ["x"]}, "name"),
        ({**VARIANT, "name": 5}, "name"),
        ({**VARIANT, "family": {"a": 1}}, "family"),
        ({**DEFAULT, "sampler_name": 3}, "sampler_name"),
        ({**DEFAULT, "scheduler": None}, "scheduler"),
        ({**VARIANT, "title": []}, "title"),
        ({**VARIANT, "prediction": 1}, "prediction"),
        ({**VARIANT, "notes": {}}, "notes"),
        ({**VARIANT, "negative": "no"}, "negative"),
        ({**VARIANT, "steps": 2.5}, "steps"),
        ({**VARIANT, "width": "512"}, "width"),
        ({**VARIANT, "cfg": [1]}, "cfg"),
        ({**VARIANT, "guidance": True}, "guidance"),
    ],
)
def test_a_field_of_the_wrong_type_is_a_preset_error_naming_it(
    tmp_path: Path, entry: dict, field: str
) -> None:
    path = tmp_path / "presets.json"
    path.write_text(json.dumps([entry]))
    with pytest.raises(PresetError) as err:
        read_preset_file(path)
    message = str(err.value)
    assert "presets.json entry 0" in message and repr(field) in message and "expected" in message


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("[" * 100_000 + "]" * 100_000, id="lists"),
        pytest.param("[" + '{"a":' * 50_000 + "1" + "}" * 50_000 + "]", id="objects"),
    ],
)
def test_deep_nesting_is_a_preset_error(tmp_path: Path, text: str) -> None:
    path = tmp_path / "presets.json"
    path.write_text(text)
    with pytest.raises(PresetError, match="presets.json"):
        read_preset_file(path)


def test_a_string_match_is_one_word() -> None:
    preset = Preset.from_json({**VARIANT, "match": "Turbo"}, "here")
    assert preset.match == ("turbo",)


def test_a_list_match_is_still_its_words() -> None:
    assert Preset.from_json({**VARIANT, "match": ["Turbo", "lightning"]}, "here").match == (
        "turbo",
        "lightning",
    )
