"""ComfyUI's SaveText: write text to ``<prefix>_<counter>.<format>`` in the output folder (JSON text
pretty-printed with two spaces when it parses), report the file, and pass the text on."""

from __future__ import annotations

import json
import os
import re
from typing import Any

from engine.context import NodeContext
from engine.node import Node, NodeOutput
from engine.schema import COMBO, STRING, Input, NodeSchema, Output
from nodes.core.save_prefix import split_prefix

TEXT_FORMATS = ("txt", "csv", "md", "json")


class SaveTextError(ValueError):
    """A filename_prefix or format that cannot be written; the message says which."""


class SaveText(Node):
    SCHEMA = NodeSchema(
        node_id="SaveText",
        display_name="Save Text",
        category="text",
        description="Save text to a file in the output folder (.txt, .csv, .md or pretty-printed .json).",
        inputs=(
            Input("text", STRING, "The text to save.", force_input=True),
            Input("filename_prefix", STRING, "File name prefix; may contain sub-folders.", default="ComfyUI"),
            Input("format", COMBO, "The file format.", default="txt", options=TEXT_FORMATS),
        ),
        outputs=(Output("text", STRING, "The text, unchanged."),),
        output_node=True,
    )

    def run(self, ctx: NodeContext, *, text: str, filename_prefix: str, format: str) -> NodeOutput:  # noqa: A002
        if format not in TEXT_FORMATS:
            raise SaveTextError(f"format: expected one of {list(TEXT_FORMATS)}, found {format!r}")
        sub, stem = split_prefix(filename_prefix)
        root = ctx.folders.output_dir.resolve()
        folder = (root / sub).resolve()
        if folder != root and root not in folder.parents:
            raise SaveTextError(
                f"filename_prefix {filename_prefix!r} points outside the output folder; use e.g. 'notes/prompt'"
            )
        folder.mkdir(parents=True, exist_ok=True)
        pattern = re.compile(re.escape(stem) + r"_(\d{5,})\.[A-Za-z0-9]+$")
        counter = max((int(m.group(1)) for f in os.listdir(folder) if (m := pattern.match(f))), default=0) + 1
        name = f"{stem}_{counter:05}.{format}"
        (folder / name).write_text(pretty_json(text) if format == "json" else text, encoding="utf-8")
        entry: dict[str, Any] = {"filename": name, "subfolder": sub.replace(os.sep, "/"), "type": "output"}
        return NodeOutput(values=(text,), ui={"text": (text,), "files": [entry]})


def pretty_json(text: str) -> str:
    """``text`` re-indented by two spaces when it is JSON, else unchanged."""
    try:
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except json.JSONDecodeError:
        return text


NODES = [SaveText]
