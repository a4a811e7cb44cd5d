"""The UI-format rules have one home, engine/formats/ui_rules.json, and both sides apply them alike.

- The editor's widget reader (web/js/uirules.js, run under Node with the same table) and the
  engine's (engine/formats/widgets.py) find the same widgets and the same values on the same cases.
- A workflow the editor opens and exports (web/js/uiformat.js ``toUi``) converts on the server
  (engine/formats/ui_import.py) to the prompt the editor itself queues.
- No module of web/js or engine/formats spells a rule out again.
"""

from __future__ import annotations

import ast
import json
import os
import random
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from engine.formats import convert_ui_to_api
from engine.formats.ui_rules import RULES_FILE, ui_rules
from engine.formats.widgets import MISSING, assign, widgets_of

ROOT = Path(__file__).resolve().parents[2]
COMPAT = Path(__file__).resolve().parent
EDITOR = COMPAT / "js" / "editor_formats.mjs"
INFO = json.loads((COMPAT / "object_info_core.json").read_text())
NODE = shutil.which("node")
# The README's test command installs Node.js, so CI always runs these; elsewhere they skip without it.
needs_node = pytest.mark.skipif(
    NODE is None and not os.environ.get("CI"),
    reason="Node.js runs the editor's modules here (apt-get install nodejs)",
)


def run_editor(request: dict[str, Any]) -> Any:
    assert NODE is not None
    done = subprocess.run(
        [NODE, str(EDITOR)], input=json.dumps(request), capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.returncode == 0, f"the editor's modules failed under Node:\n{done.stderr[-3000:]}"
    return json.loads(done.stdout)


def entry(
    required: dict[str, Any], optional: dict[str, Any] | None = None, reverse: bool = False
) -> dict[str, Any]:
    """An object_info entry; ``reverse``: input_order lists the required names backwards (the order
    must come from input_order, not from the dict)."""
    optional = optional or {}
    order = list(reversed(required)) if reverse else list(required)
    return {
        "input": {"required": required, "optional": optional},
        "input_order": {"required": order, "optional": list(optional)},
        "output": [],
        "output_name": [],
    }


SCHEMAS: dict[str, dict[str, Any]] = {
    "Sampler": entry(
        {
            "seed": ["INT", {"default": 0, "control_after_generate": True}],
            "steps": ["INT", {"default": 20, "min": 1}],
            "cfg": ["FLOAT", {"default": 8.0}],
            "sampler_name": [["euler", "ddim"], {}],
            "model": ["MODEL", {}],
        }
    ),
    "OldSeed": entry({"noise_seed": ["INT", {}], "text": ["STRING", {"multiline": True}]}, reverse=True),
    "ComboControl": entry(
        {"pick": [["a", "b", "c"], {"control_after_generate": True}], "count": ["INT", {}]},
        {"flag": ["BOOLEAN", {"default": False}]},
    ),
    "MaskFromImage": entry(
        {"image": [["x.png", "y.png"], {"image_upload": True}], "channel": [["alpha", "red", "green"], {}]}
    ),
    "OneImage": entry({"image": [["x.png"], {"image_upload": True}]}),
    "Mixed": entry(
        {"forced": ["INT", {"forceInput": True}], "mode": ["COMBO", {"options": ["on", "off"]}]},
        {"strength": ["FLOAT", {}], "seed": ["INT", {}], "clip": ["CLIP", {}]},
        reverse=True,
    ),
    "Video": entry({"video": [["v.mp4"], {"video_upload": True}], "loop": ["BOOLEAN", {}]}),
}
TOKENS: list[Any] = [
    7,
    1.5,
    "randomize",
    "fixed",
    "increment-wrap",
    True,
    False,
    None,
    "",
    "b",
    "image",
    "x.png",
]
TOKENS += ["green", [1, 2]]


def cases() -> list[dict[str, Any]]:
    """Every schema with widgets_values lists of every length up to three past its widgets (seeded
    random tokens), the lists ComfyUI writes, and object-form values."""
    rng = random.Random(29)
    out = []
    for type_, info in SCHEMAS.items():
        width = len(widgets_of(info))
        for length in range(width + 4):
            for _ in range(25):
                out.append({"type": type_, "info": info, "widgets_values": rng.choices(TOKENS, k=length)})
        out.append(
            {"type": type_, "info": info, "widgets_values": {w.name: 3 for w in widgets_of(info)} | {"x": 1}}
        )
    out.append(
        {"type": "Sampler", "info": SCHEMAS["Sampler"], "widgets_values": [5, "increment", 20, 8.0, "ddim"]}
    )
    out.append(
        {
            "type": "MaskFromImage",
            "info": SCHEMAS["MaskFromImage"],
            "widgets_values": ["y.png", "red", "image"],
        }
    )
    out.append(
        {
            "type": "ComboControl",
            "info": SCHEMAS["ComboControl"],
            "widgets_values": [1, "b", "fixed", "", True],
        }
    )
    return out


@needs_node
def test_the_editor_and_the_engine_read_widgets_alike() -> None:
    all_cases = cases()
    answers = run_editor({"task": "widgets", "cases": all_cases})
    for case, answer in zip(all_cases, answers, strict=True):
        widgets = widgets_of(case["info"])
        assert answer["widgets"] == [
            {"name": w.name, "controlSlots": w.control_slots, "serialize": w.serialize} for w in widgets
        ], case["type"]
        assigned, _ = assign(widgets, case["widgets_values"])
        engine = {
            w.name: v for w, v in zip(widgets, assigned, strict=True) if w.serialize and v is not MISSING
        }
        assert answer["values"] == engine, f"{case['type']} {case['widgets_values']!r}"
        assert set(answer["control"]) <= set(engine)
        assert set(answer["control"].values()) <= set(ui_rules().control_choices)


def mask_workflow() -> dict[str, Any]:
    """A LoadImageMask-shaped node (its upload input is not its last widget), as ComfyUI saves it."""
    return {
        "nodes": [
            {"id": 1, "type": "MaskFromImage", "pos": [0, 0], "size": [200, 100], "mode": 0, "inputs": [],
             "outputs": [], "widgets_values": ["y.png", "green", "image"]},
            {"id": 2, "type": "Sampler", "pos": [300, 0], "size": [200, 100], "mode": 0, "inputs": [],
             "outputs": [], "widgets_values": [11, "fixed", 30, 6.5, "ddim"]},
        ],
        "links": [],
        "version": 0.4,
    }  # fmt: skip


@needs_node
def test_what_the_editor_exports_the_engine_reads_as_the_editor_queues_it() -> None:
    info = INFO | {name: SCHEMAS[name] for name in ("MaskFromImage", "Sampler")}
    workflows = [
        json.loads(p.read_text())
        for p in sorted((COMPAT / "workflows").glob("*.json"))
        if p.stem != "group_node"  # the editor has the server flatten legacy group nodes
    ]
    workflows = [w for w in workflows if isinstance(w, dict) and "links" in w] + [mask_workflow()]
    answers = run_editor({"task": "export", "info": info, "workflows": workflows})
    for answer in answers:
        engine = convert_ui_to_api(answer["ui"], info)
        strip = {k: {"class_type": v["class_type"], "inputs": v["inputs"]} for k, v in engine.items()}
        assert strip == {
            k: {"class_type": v["class_type"], "inputs": v["inputs"]} for k, v in answer["prompt"].items()
        }
    mask = answers[-1]
    assert mask["prompt"]["1"]["inputs"] == {"image": "y.png", "channel": "green"}
    assert mask["ui"]["nodes"][0]["widgets_values"] == [
        "y.png",
        "green",
        "image",
    ]  # the upload button's value last


# --- one home --------------------------------------------------------------------------------------
# How many of a rule's words one line (JS) or one list (Python) may name before it counts as the
# rule written out again: widget types are also compared one or two at a time, by their behaviour.
ENOUGH = {"widget_types": 4}


def rule_lists() -> dict[str, set[str]]:
    table = json.loads(RULES_FILE.read_text())
    control = table["control_after_generate"]
    return {
        "frontend_only_types": set(table["frontend_only_types"]),
        "note_types": set(table["note_types"]),
        "group_node_prefixes": set(table["group_node_prefixes"]),
        "widget_types": set(table["widget_types"]),
        "control values": set(control["choices"]) | set(control["also_read"]),
        "seed names": set(control["implied_for_int_inputs"]),
        "upload flags": set(table["upload"]["flags"]),
    }


# Spellings that only the table may hold: a rule's own words, and the seed-name regex of old.
TELLTALES = ("MarkdownNote", "increment-wrap", "noise_seed", "noise_)", "workflow>", "video_upload")
BOUNDARY_ID = re.compile(r"(?<![\w.\-])[\"']?-(?:10|20)[\"']?(?![\w.])")
JS_STRING = re.compile(r"\"((?:[^\"\\\n]|\\.)*)\"|'((?:[^'\\\n]|\\.)*)'")


def js_code(text: str) -> list[tuple[int, str]]:
    """The lines of a JS module without its comments."""
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group().count("\n"), text, flags=re.S)
    return [(n, re.sub(r"(^|\s)//.*$", "", line)) for n, line in enumerate(text.splitlines(), 1)]


def test_no_editor_module_spells_a_rule_out() -> None:
    lists, found = rule_lists(), []
    for path in sorted((ROOT / "web" / "js").glob("*.js")):
        for n, line in js_code(path.read_text()):
            strings = {a or b for a, b in JS_STRING.findall(line)}
            for rule, members in lists.items():
                if len(strings & members) >= ENOUGH.get(rule, 2):
                    found.append(f"{path.name}:{n} spells out {rule}: {line.strip()[:100]}")
            code = JS_STRING.sub('""', line)
            found += [f"{path.name}:{n} has {t!r}" for t in TELLTALES if t in line]
            if BOUNDARY_ID.search(code):
                found.append(f"{path.name}:{n} names a subgraph boundary id: {line.strip()[:100]}")
    assert not found, (
        "rules belong in engine/formats/ui_rules.json (web/js/uirules.js exports them):\n" + "\n".join(found)
    )


def python_strings(tree: ast.AST) -> list[ast.Constant]:
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings
    ]


def test_no_engine_formats_module_spells_a_rule_out() -> None:
    lists, found = rule_lists(), []
    for path in sorted((ROOT / "engine" / "formats").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.List | ast.Tuple | ast.Set):
                strings = {
                    e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)
                }
                found += [
                    f"{path.name}:{node.lineno} spells out {rule}"
                    for rule, members in lists.items()
                    if len(strings & members) >= ENOUGH.get(rule, 2)
                ]
            if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
                if isinstance(node.operand, ast.Constant) and node.operand.value in (10, 20):
                    found.append(f"{path.name}:{node.lineno} names a subgraph boundary id")
        for const in python_strings(tree):
            found += [f"{path.name}:{const.lineno} has {t!r}" for t in TELLTALES if t in const.value]
    assert not found, (
        "rules belong in engine/formats/ui_rules.json (engine/formats/ui_rules.py reads it):\n"
        + "\n".join(found)
    )


def test_the_table_agrees_with_the_engines_other_homes() -> None:
    """Node schemas declare the same widget types; the compatibility report (which keeps its own
    copies until it reads engine.formats.ui_rules) the same editor-only types and group prefixes."""
    from engine.plugins import compat_check
    from engine.schema import WIDGET_TYPES

    rules = ui_rules()
    assert rules.widget_types == WIDGET_TYPES
    assert compat_check.frontend_only_names() == rules.frontend_only_types
    assert tuple(compat_check.GROUP_NODE_PREFIXES) == rules.group_node_prefixes
    assert rules.control_values >= set(rules.control_choices)


@needs_node
def test_the_editors_own_node_types_are_the_tables_frontend_only_ones() -> None:
    rules = ui_rules()
    assert set(run_editor({"task": "frontend"})) == rules.frontend_only_types - rules.note_types
