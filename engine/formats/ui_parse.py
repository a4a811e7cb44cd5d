"""Reading the containers of a ComfyUI UI-format (litegraph) file: link tables, subgraph definitions
(``definitions.subgraphs``) and group node definitions (``extra.groupNodes``).

Each reader checks what it reads and raises :class:`WorkflowFormatError` naming the entry and the
field that is wrong (what was expected, what was found); :mod:`engine.formats.ui_import` and the
compatibility report (:mod:`engine.plugins.compat_check`) read files through these, so a malformed
file fails the same way everywhere. Slots count from 0: a negative slot is refused, never taken
from the end of a list.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engine.formats.api import WorkflowFormatError, json_kind

MAX_INDEX_DIGITS = 15  # ids and slots beyond this are not numbers an editor writes (JavaScript's safe range)


@dataclass(frozen=True)
class Link:
    """One entry of a link table: output ``origin_slot`` of ``origin_id`` feeds input
    ``target_slot`` of ``target_id``."""

    id: int
    origin_id: int | str
    origin_slot: int
    target_id: int | str
    target_slot: int


def as_index(value: Any) -> int | None:
    """``value`` as a whole number if it is one (``3``, ``3.0``, ``"3"``, ``"-3"``), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        digits = value.removeprefix("-")
        if digits.isascii() and digits.isdigit() and len(digits) <= MAX_INDEX_DIGITS:
            return int(value)
    return None


def link_table(raw: Any, where: str = "") -> dict[int, Link]:
    """Links as ``[id, from_node, from_slot, to_node, to_slot, type]`` arrays (workflow version
    0.4) or ``{id, origin_id, origin_slot, target_id, target_slot, type}`` objects (version 1,
    subgraph definitions). ``where`` names the graph in messages (``"subgraph X: "``)."""
    if raw is None:
        return {}
    if not isinstance(raw, list):
        raise WorkflowFormatError(f"{where}expected 'links' to be a list, found {json_kind(raw)}")
    table: dict[int, Link] = {}
    for link in raw:
        fields: list[Any]
        if isinstance(link, Mapping):
            fields = [link.get(k) for k in ("id", "origin_id", "origin_slot", "target_id", "target_slot")]
        elif isinstance(link, list) and len(link) >= 5:
            fields = list(link[:5])
        else:
            continue  # null entries and stubs: ComfyUI skips them too
        link_id, origin_slot, target_slot = (as_index(fields[i]) for i in (0, 2, 4))
        if (
            link_id is None
            or origin_slot is None
            or target_slot is None
            or not _node_ref(fields[1], fields[3])
        ):
            raise WorkflowFormatError(
                f"{where}expected links as [id, from_node, from_slot, to_node, to_slot, type] "
                f"or objects with id/origin_id/origin_slot/target_id/target_slot (whole numbers), "
                f"found {link!r:.80}"
            )
        if origin_slot < 0 or target_slot < 0:
            raise WorkflowFormatError(
                f"{where}link {link_id} (node {fields[1]} slot {origin_slot} to node {fields[3]} slot "
                f"{target_slot}): slots count from 0, found a negative slot; the file is damaged: "
                "reconnect the link in the editor and save again"
            )
        table[link_id] = Link(link_id, fields[1], origin_slot, fields[3], target_slot)
    return table


def _node_ref(*values: Any) -> bool:
    return all(isinstance(v, int | str) and not isinstance(v, bool) for v in values)


def link_of(entry: Mapping[str, Any], links: Mapping[int, Link]) -> Link | None:
    """The link feeding a node's input entry (``{"link": id}``), or None (unlinked, or an id the
    table does not hold: a dangling link, which ComfyUI ignores)."""
    link_id = as_index(entry.get("link"))
    return None if link_id is None else links.get(link_id)


def group_links(raw: Any, where: str) -> list[tuple[int, int, int, int]]:
    """A group node definition's links: ``[from_index, from_slot, to_index, to_slot, ...]``;
    entries whose four first values are not all integers (links from outside the group) are skipped."""
    out = []
    for link in raw if isinstance(raw, list) else []:
        if not (isinstance(link, list) and len(link) >= 4):
            continue
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in link[:4]):
            continue
        a, b, c, d = link[:4]
        if min(a, b, c, d) < 0:
            raise WorkflowFormatError(
                f"{where}: link {link!r:.60} has a negative node index or slot; indexes and slots count from 0"
            )
        out.append((a, b, c, d))
    return out


def subgraph_definitions(ui: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """``definitions.subgraphs`` by id (the node type their instances carry)."""
    definitions = ui.get("definitions")
    if definitions is None:
        return {}
    if not isinstance(definitions, Mapping):
        raise WorkflowFormatError(
            f"'definitions' must be an object (with a 'subgraphs' list), found {json_kind(definitions)}"
        )
    raw = definitions.get("subgraphs")
    if raw is None:
        return {}
    if not isinstance(raw, list):
        raise WorkflowFormatError(
            f"'definitions.subgraphs' must be a list of subgraph definitions, found {json_kind(raw)}"
        )
    found: dict[str, Mapping[str, Any]] = {}
    for n, sub in enumerate(raw):
        where = f"definitions.subgraphs[{n}]"
        if not isinstance(sub, Mapping):
            raise WorkflowFormatError(
                f"{where} must be an object (a subgraph definition with 'id' and 'nodes'), found {json_kind(sub)}"
            )
        sub_id = sub.get("id")
        if not isinstance(sub_id, str | int) or isinstance(sub_id, bool) or sub_id == "":
            raise WorkflowFormatError(
                f"{where}: 'id' must be a string (the node type its instances carry), found {sub_id!r:.60}"
            )
        if not isinstance(sub.get("nodes"), list):
            raise WorkflowFormatError(
                f"{where} ({sub_id}): 'nodes' must be a list, found {json_kind(sub.get('nodes'))}"
            )
        found[str(sub_id)] = sub
    return found


def group_node_definitions(ui: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """``extra.groupNodes`` by name (legacy group nodes; their instances' type is
    ``workflow>NAME``). ``extra`` itself is editor state: anything but an object holds none."""
    extra = ui.get("extra")
    groups = extra.get("groupNodes") if isinstance(extra, Mapping) else None
    if groups is None:
        return {}
    if not isinstance(groups, Mapping):
        raise WorkflowFormatError(
            f"'extra.groupNodes' must be an object (group node definitions by name), found {json_kind(groups)}"
        )
    for name, definition in groups.items():
        where = f"extra.groupNodes[{str(name)!r}]"
        if not isinstance(definition, Mapping):
            raise WorkflowFormatError(
                f"{where} must be an object (a group node definition with 'nodes' and 'links'), "
                f"found {json_kind(definition)}"
            )
        for key in ("nodes", "links", "external"):
            value = definition.get(key)
            if value is not None and not isinstance(value, list):
                raise WorkflowFormatError(f"{where}: '{key}' must be a list, found {json_kind(value)}")
    return {str(name): definition for name, definition in groups.items()}


def entries(raw: Any) -> list[Mapping[str, Any]]:
    """The objects of a list (``inputs``, ``outputs``, ``nodes``); anything else holds none."""
    return [e for e in raw if isinstance(e, Mapping)] if isinstance(raw, list) else []


def widget_name(entry: Mapping[str, Any]) -> str | None:
    """The widget an input entry stands for (``{"widget": {"name": ...}}``), if any."""
    widget = entry.get("widget")
    if isinstance(widget, Mapping) and isinstance(widget.get("name"), str):
        return str(widget["name"])
    return None


@dataclass(frozen=True)
class SubgraphSlot:
    """One input (or output) of a subgraph definition: its name, type and the inner links that
    leave it (``linkIds``)."""

    name: str
    type: str
    link_ids: tuple[int, ...] = ()


def subgraph_inputs(definition: Mapping[str, Any]) -> list[SubgraphSlot] | None:
    """A definition's ``inputs``, in slot order (slot k is what inner links from the input node's
    slot k carry); None when the definition lists none (files written before subgraphs named
    their inputs: their instances' inputs are then taken by position)."""
    raw = definition.get("inputs")
    if not isinstance(raw, list):
        return None
    slots = []
    for n, entry in enumerate(raw):
        if not isinstance(entry, Mapping):
            raise WorkflowFormatError(
                f"inputs[{n}]: expected a subgraph input (an object with 'name' and 'type'), found {json_kind(entry)}"
            )
        ids = entry.get("linkIds")
        link_ids = (
            tuple(i for i in (as_index(v) for v in ids) if i is not None) if isinstance(ids, list) else ()
        )
        slots.append(SubgraphSlot(str(entry.get("name", "")), str(entry.get("type", "")), link_ids))
    return slots


def bind_instance_inputs(
    instance_inputs: list[Mapping[str, Any]], slots: list[SubgraphSlot]
) -> dict[int, int]:
    """Which of an instance's input entries feeds each definition input: ``{slot: position}``.

    As the frontend binds them when it loads a file (``SubgraphNode._rebindInputSubgraphSlots``):
    each entry, in file order, takes the first definition input not yet taken with the same
    name and type, else the first with the same name; an entry matching none is dropped. Files
    keep only the inputs that are linked or shown, in any order, so position says nothing."""
    taken: dict[int, int] = {}
    for position, entry in enumerate(instance_inputs):
        name, type_ = str(entry.get("name", "")), str(entry.get("type", ""))
        free = [k for k, slot in enumerate(slots) if k not in taken and slot.name == name]
        same_type = [k for k in free if slots[k].type == type_]
        if same_type or free:
            taken[(same_type or free)[0]] = position
    return taken
