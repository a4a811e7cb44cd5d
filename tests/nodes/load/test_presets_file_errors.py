"""A bad ``models/presets.json`` never stops the server: the describer ``serve`` builds at start-up
logs the file's error, keeps the shipped presets and shows the error at ``GET /api/v1/presets``;
a string ``match`` picks only files with that word (issue 33, item 7)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

import main
from nodes.load.presets import ModelDescriber, PresetTable
from tests.nodes.load.test_presets import cli_dirs

BAD_FILES = [
    pytest.param('[{"name": "v", "family": "sdxl", "match": 5, "steps": 4}]', id="match-number"),
    pytest.param("[" * 100_000 + "]" * 100_000, id="deep"),
    pytest.param('[{"name": ["v"], "family": "sdxl", "match": ["x"], "steps": 4}]', id="name-list"),
    pytest.param("\xff\xfe not text", id="not-utf8"),
]


@pytest.mark.parametrize("content", BAD_FILES)
def test_the_describer_survives_a_bad_file_and_shows_its_error(
    tmp_path: Path, content: str, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "presets.json").write_text(content, encoding="latin-1")
    with caplog.at_level(logging.ERROR, logger="loom.presets"):
        describer = ModelDescriber.for_folder(tmp_path)
    assert describer.table.names() == PresetTable.load(None).names()
    shown = describer.table_json()
    assert len(shown["errors"]) == 1 and "presets.json" in shown["errors"][0]
    assert any("presets.json" in r.getMessage() for r in caplog.records)
    assert not any(r.exc_info for r in caplog.records)  # a message, not a traceback


def test_a_good_file_shows_no_errors(tmp_path: Path) -> None:
    assert ModelDescriber.for_folder(tmp_path).table_json()["errors"] == []


def test_a_string_match_picks_only_files_with_that_word(tmp_path: Path) -> None:
    (tmp_path / "presets.json").write_text(
        json.dumps([{"name": "mine", "family": "sdxl", "match": "mymerge", "steps": 9}])
    )
    table = PresetTable.load(tmp_path)
    plain = table.for_model("sdxl", "epsilon", "ordinary_model.safetensors")
    assert plain is not None and plain.name != "mine"
    chosen = table.for_model("sdxl", "epsilon", "MyMerge_v2.safetensors")
    assert chosen is not None and chosen.name == "mine"


def test_serve_start_up_survives_a_bad_presets_file(tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    (models / "presets.json").write_text('[{"name": "v", "family": "sdxl", "match": 5, "steps": 4}]')
    args = main.make_parser().parse_args(["serve", *cli_dirs(tmp_path, models)])
    runtime = main.build_runtime(args)
    listed = runtime.presets()
    assert "sdxl" in {p["name"] for p in listed["presets"]}
    assert "presets.json" in listed["errors"][0]
