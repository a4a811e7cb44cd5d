"""Loom's saved format → ComfyUI's UI (litegraph) format, for the ``workflow`` chunk of PNGs
(see :func:`engine.formats.png.png_info`).

ComfyUI's editor loads an image's ``workflow`` chunk as a litegraph graph, so Loom writes that
format there (converted from the editor's saved format) and keeps its own saved format in a
``loom_workflow`` chunk. Converting the result back with :func:`engine.formats.ui_import.convert_ui_to_api`
gives the original API graph (tested), so images move both ways between Loom and ComfyUI.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.formats.api import is_link
from engine.formats.ui_rules import ui_rules
from engine.formats.widgets import is_widget_spec


def _ordered_inputs(info: Mapping[str, Any]) -> list[tuple[str, list[Any]]]:
    declared = info.get("input") or {}
    specs: list[tuple[str, list[Any]]] = []
    for section in ("required", "optional"):
        for name, spec in (declared.get(section) or {}).items():
            specs.append((name, spec if isinstance(spec, list) else [spec, {}]))
    return specs


def _numeric_ids(prompt: Mapping[str, Any]) -> dict[str, int]:
    """Litegraph's numeric node ids: a plain number keeps its value, any other id gets the next free one."""
    taken = {int(k) for k in prompt if _plain_number(k)}
    next_id = max(taken, default=0) + 1
    ids: dict[str, int] = {}
    for node_id in prompt:
        if _plain_number(node_id):
            ids[node_id] = int(node_id)
        else:
            ids[node_id] = next_id
            next_id += 1
    return ids


def _plain_number(node_id: str) -> bool:
    return node_id.isascii() and node_id.isdigit() and len(node_id) <= 15  # a safe integer in JavaScript


def saved_to_ui(saved: Mapping[str, Any], object_info: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """A litegraph graph for a (current-version) saved workflow ``{"prompt", "layout", ...}``."""
    prompt: Mapping[str, Any] = saved.get("prompt") or {}
    layout_nodes: Mapping[str, Any] = (saved.get("layout") or {}).get("nodes") or {}
    ids = _numeric_ids(prompt)
    rules = ui_rules()
    nodes: list[dict[str, Any]] = []
    links: list[list[Any]] = []
    outputs_of: dict[str, list[dict[str, Any]]] = {}
    for node_id, node in prompt.items():
        info = object_info.get(str(node.get("class_type"))) or {}
        outputs_of[node_id] = [
            {"name": name, "type": kind, "links": [], "slot_index": i}
            for i, (name, kind) in enumerate(
                zip(
                    info.get("output_name") or info.get("output") or [],
                    info.get("output") or [],
                    strict=False,
                )
            )
        ]
    for order, (node_id, node) in enumerate(prompt.items()):
        class_type = str(node.get("class_type"))
        info = object_info.get(class_type) or {}
        given: Mapping[str, Any] = node.get("inputs") or {}
        place = layout_nodes.get(node_id) or {}
        ui_inputs: list[dict[str, Any]] = []
        widgets: list[Any] = []
        for name, spec in _ordered_inputs(info):
            value: Any = given.get(name)
            widget = is_widget_spec(spec)
            options = spec[1] if len(spec) > 1 and isinstance(spec[1], Mapping) else {}
            if widget:
                widgets.append(options.get("default") if value is None or is_link(value) else value)
                if options.get("control_after_generate") or name in rules.seed_names:
                    widgets.append(rules.control_in_images)  # the image shows this seed: keep it
            if is_link(value) or not widget:
                entry: dict[str, Any] = {
                    "name": name,
                    "type": "COMBO" if isinstance(spec[0], list) else spec[0],
                    "link": None,
                }
                if widget:
                    entry["widget"] = {"name": name}
                if is_link(value) and value[0] in prompt:
                    link_id = len(links) + 1
                    source_outputs = outputs_of[value[0]]
                    known = 0 <= value[1] < len(source_outputs)  # else validation names the bad slot
                    link_type = source_outputs[value[1]]["type"] if known else "*"
                    links.append([link_id, ids[value[0]], value[1], ids[node_id], len(ui_inputs), link_type])
                    if known:
                        source_outputs[value[1]]["links"].append(link_id)
                    entry["link"] = link_id
                ui_inputs.append(entry)
        title = place.get("title") or (node.get("_meta") or {}).get("title")
        ui_node: dict[str, Any] = {
            "id": ids[node_id],
            "type": class_type,
            "pos": list(place.get("pos") or [order * 280, 0]),
            "size": list(place.get("size") or [260, 120]),
            "flags": {"collapsed": bool(place.get("collapsed"))},
            "order": order,
            "mode": place.get("mode") or 0,  # an integer (checked when the file was read)
            "inputs": ui_inputs,
            "outputs": outputs_of[node_id],
            "properties": {"Node name for S&R": class_type},
            "widgets_values": widgets,
        }
        if title:
            ui_node["title"] = title
        if place.get("color"):
            ui_node["color"] = place["color"]
        nodes.append(ui_node)
    groups = [
        {
            "title": g.get("title", "Group"),
            "bounding": list(g["bounding"]),
            "color": g.get("color", "#3f789e"),
        }
        for g in (saved.get("layout") or {}).get("groups") or []
        if isinstance(g, Mapping) and "bounding" in g
    ]
    return {
        "last_node_id": max(ids.values(), default=0),
        "last_link_id": len(links),
        "nodes": nodes,
        "links": links,
        "groups": groups,
        "config": {},
        "extra": {"loom": {"format": saved.get("format"), "version": saved.get("version")}},
        "version": 0.4,
    }
