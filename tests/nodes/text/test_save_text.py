"""SaveText (nodes/text/save_text.py): numbered files in the output folder, JSON pretty-printed when
it parses, the file reported to the client, and prefixes that would leave the output folder refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.context import Folders, NodeContext
from nodes.text.save_text import SaveText, SaveTextError


@pytest.fixture
def ctx(tmp_path: Path) -> NodeContext:
    return NodeContext(node_id="1", prompt_id="p", folders=Folders(tmp_path, tmp_path / "out", tmp_path))


def test_saves_numbered_files_and_reports_them(ctx: NodeContext) -> None:
    out = ctx.folders.output_dir
    first = SaveText().run(ctx, text="a red fox", filename_prefix="notes/fox", format="txt")
    second = SaveText().run(ctx, text="an owl", filename_prefix="notes/fox", format="md")
    assert first.values == ("a red fox",)
    assert first.ui == {
        "text": ("a red fox",),
        "files": [{"filename": "fox_00001.txt", "subfolder": "notes", "type": "output"}],
    }
    assert second.ui is not None and second.ui["files"][0]["filename"] == "fox_00002.md"
    assert (out / "notes" / "fox_00001.txt").read_text(encoding="utf-8") == "a red fox"


def test_json_is_pretty_printed_when_it_parses(ctx: NodeContext) -> None:
    out = ctx.folders.output_dir
    SaveText().run(ctx, text='{"a":[1,2]}', filename_prefix="data", format="json")
    SaveText().run(ctx, text="not json {", filename_prefix="data", format="json")
    assert (out / "data_00001.json").read_text(encoding="utf-8") == '{\n  "a": [\n    1,\n    2\n  ]\n}'
    assert (out / "data_00002.json").read_text(encoding="utf-8") == "not json {"


def test_refuses_a_prefix_outside_the_output_folder(ctx: NodeContext) -> None:
    with pytest.raises(SaveTextError, match="points outside the output folder"):
        SaveText().run(ctx, text="x", filename_prefix="../escape/x", format="txt")
