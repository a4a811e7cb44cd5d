"""Subgraph instances' promoted widgets, as today's frontend reads them (``SubgraphNode``:
``_resolveInputWidget``, ``_applyPromotedWidgetValues``; ``properties.proxyWidgets``): which of a
definition's inputs become widgets on its instances, and the values an instance stores for them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.formats.ui_parse import (
    Link,
    SubgraphSlot,
    bind_instance_inputs,
    entries,
    link_table,
    subgraph_inputs,
)
from engine.formats.ui_rules import ui_rules
from engine.formats.widgets import widgets_of

MAX_NESTING = 32


def promoted_slots(
    definition: Mapping[str, Any],
    slots: list[SubgraphSlot],
    links: Mapping[int, Link],
    object_info: Mapping[str, Mapping[str, Any]],
    subgraphs: Mapping[str, Mapping[str, Any]],
    depth: int = 0,
) -> list[int]:
    """The definition inputs that feed a widget inside (the frontend promotes those to widgets
    on each instance: ``SubgraphNode._resolveInputWidget``); a widget is one ``object_info``
    declares, so an input feeding only unknown node types promotes nothing."""
    nodes = {str(n.get("id")): n for n in entries(definition.get("nodes"))}
    from_input = [link for link in links.values() if link.origin_id == ui_rules().subgraph_input_node]
    found = []
    for k, slot in enumerate(slots):
        targets = [links[i] for i in slot.link_ids if i in links] or [
            link for link in from_input if link.origin_slot == k
        ]
        if any(
            feeds_widget(nodes.get(str(t.target_id)), t.target_slot, object_info, subgraphs, depth)
            for t in targets
        ):
            found.append(k)
    return found


def feeds_widget(
    target: Mapping[str, Any] | None,
    slot: int,
    object_info: Mapping[str, Mapping[str, Any]],
    subgraphs: Mapping[str, Mapping[str, Any]],
    depth: int,
) -> bool:
    """Whether input ``slot`` of an inner node is one of its widgets (or, on a nested instance, feeds one)."""
    target_inputs = entries(target.get("inputs")) if target is not None else []
    if target is None or slot >= len(target_inputs) or depth > MAX_NESTING:
        return False
    name = str(target_inputs[slot].get("name", ""))
    definition = subgraphs.get(str(target.get("type")))
    if definition is not None:  # a nested instance: does its own input feed a widget further in?
        inner_slots = subgraph_inputs(definition) or []
        bound = {position: k for k, position in bind_instance_inputs(target_inputs, inner_slots).items()}
        if slot not in bound:
            return False
        links = link_table(definition.get("links"))
        return bound[slot] in promoted_slots(
            definition, inner_slots, links, object_info, subgraphs, depth + 1
        )
    return name in {w.name for w in widgets_of(object_info.get(str(target.get("type"))))}


def promoted_values(
    node: Mapping[str, Any], slots: list[SubgraphSlot], promoted: list[int]
) -> dict[int, Any]:
    """Values a subgraph instance stores for its promoted widgets, by definition input index.

    ``widgets_values`` is an object by input name, or a list: with ``properties.proxyWidgets``
    (``[[inner node id, widget name], ...]``, ``"-1"`` for the instance's own inputs) one value per
    entry, in that order (an inner node's widget keeps its value on that node); without, one per
    promoted input in definition order, linked ones included. Templates of today's frontend
    store none: the widgets inside keep their own values."""
    values = node.get("widgets_values")
    by_name: dict[str, Any] = {}
    properties = node.get("properties")
    proxies = properties.get("proxyWidgets") if isinstance(properties, Mapping) else None
    if isinstance(values, Mapping):
        by_name = dict(values)
    elif isinstance(values, list) and isinstance(proxies, list):
        for proxy, value in zip(proxies, values, strict=False):
            if isinstance(proxy, list) and len(proxy) == 2 and str(proxy[0]) == "-1":
                by_name.setdefault(str(proxy[1]), value)
    elif isinstance(values, list):
        return dict(zip(promoted, values, strict=False))
    return {k: by_name[slots[k].name] for k in promoted if slots[k].name in by_name}
