"""The editor's own readers agree with the engine's: ComfyUI UI-format workflows converted in the
browser (web/js/formats.js + graph.js toPrompt) give the same API prompt as engine/formats/ui_import.py,
and PNG text chunks written by Pillow are read back by the browser's PNG reader."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from PIL import Image, PngImagePlugin

from engine.formats import convert_ui_to_api
from tests.e2e.conftest import Editor

pytestmark = [pytest.mark.browser]
COMPAT = Path(__file__).resolve().parents[1] / "compat"
INFO = json.loads((COMPAT / "object_info_core.json").read_text())
UI_FILES = sorted(
    p.name
    for p in (COMPAT / "workflows").glob("*.json")
    if isinstance(json.loads(p.read_text()), dict)
    and "links" in json.loads(p.read_text())
    and p.stem != "group_node"
)

CONVERT_IN_PAGE = """async ([ui, info]) => {
  const formats = await import('./js/formats.js');
  const { Graph } = await import('./js/graph.js');
  const graph = new Graph(info);
  graph.loadSaved(formats.convertUi(ui, info));
  const prompt = graph.toPrompt();
  for (const node of Object.values(prompt)) delete node._meta;
  return prompt;
}"""


def strip_meta(prompt: dict) -> dict:
    return {k: {"class_type": v["class_type"], "inputs": v["inputs"]} for k, v in prompt.items()}


@pytest.mark.parametrize("name", UI_FILES)
def test_ui_format_conversion_matches_the_engine(editor: Editor, name: str) -> None:
    editor.open()
    ui = json.loads((COMPAT / "workflows" / name).read_text())
    expected = strip_meta(convert_ui_to_api(ui, INFO))
    got = editor.page.evaluate(CONVERT_IN_PAGE, [ui, INFO])
    assert got == expected


def test_png_text_chunks_are_read_in_the_browser(editor: Editor) -> None:
    editor.open()
    meta = PngImagePlugin.PngInfo()
    meta.add_text("prompt", json.dumps({"1": {"class_type": "X", "inputs": {"é": "ü"}}}))
    meta.add_itxt("workflow", json.dumps({"format": "loom.workflow", "note": "日本"}), zip=True)
    meta.add_text("plain", "latin-1 text", zip=True)
    buf = io.BytesIO()
    Image.new("RGB", (4, 4)).save(buf, "PNG", pnginfo=meta)
    chunks = editor.page.evaluate(
        """async (bytes) => (await import('./js/formats.js')).readPngText(new Uint8Array(bytes).buffer)""",
        list(buf.getvalue()),
    )
    assert json.loads(chunks["prompt"]) == {"1": {"class_type": "X", "inputs": {"é": "ü"}}}
    assert json.loads(chunks["workflow"])["note"] == "日本"
    assert chunks["plain"] == "latin-1 text"


def test_the_editors_saved_format_is_read_by_the_engine(editor: Editor) -> None:
    from engine.formats import from_saved, load_workflow

    editor.open()
    editor.page.evaluate(
        "loom.editor.groups.addAround(['6', '7']); loom.editor.setMode(['7'], 4); loom.editor.convertWidget('3', 'cfg', true)"
    )
    saved = editor.saved()
    parsed = from_saved(saved)
    assert parsed.loaded_version == 2
    assert parsed.prompt == {k: {**v, "inputs": v["inputs"]} for k, v in saved["prompt"].items()}
    assert (
        parsed.layout["nodes"]["7"]["mode"] == 4
        and parsed.layout["groups"][0]["bounding"] == saved["layout"]["groups"][0]["bounding"]
    )
    assert load_workflow(saved, INFO).source_format == "loom"
