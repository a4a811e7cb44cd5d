"""ComfyUI UI-format (litegraph) → API-format conversion, the way ComfyUI's frontend does it when
it queues a prompt.

References (read for the rules, not copied): ComfyUI_frontend ``graphToPrompt``
(``src/utils/executionUtil.ts``: bypass pass-through, virtual nodes, removal of links to nodes
that are not emitted), ``widgetInputs`` (the frontend's PrimitiveNode), ``groupNode.ts``
(``extra.groupNodes``) and the subgraph serialisation (``definitions.subgraphs``, whose
input/output nodes have the ids -10 and -20).

The conversion runs in two steps:

1. *Flatten*: every node of the top-level graph, of each group node and of each subgraph instance
   becomes a :class:`_FlatNode` with a string id (``"outer:inner"`` inside a group or subgraph).
   Group-node and subgraph boundaries become *alias* nodes: virtual pass-throughs whose output
   slot ``k`` stands for some other node's output (or a constant).
2. *Resolve and emit*: each input link is followed through Reroutes, aliases, bypassed nodes and
   PrimitiveNodes to a real producer; nodes that are muted, bypassed or frontend-only are never
   emitted.

Only ``object_info`` (ComfyUI's ``/object_info`` shape) is consulted: this module knows nothing of
engine internals.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.formats.api import MAX_NODES, WorkflowFormatError, WorkflowTooLarge, json_kind
from engine.formats.modes import MODE_BYPASSED, MODE_MUTED, inherited_mode, passed_through
from engine.formats.ui_parse import (
    Link,
    SubgraphSlot,
    as_index,
    bind_instance_inputs,
    entries,
    group_links,
    group_node_definitions,
    link_of,
    link_table,
    subgraph_definitions,
    subgraph_inputs,
    widget_name,
)
from engine.formats.ui_rules import ui_rules
from engine.formats.ui_subgraph import MAX_NESTING, promoted_slots, promoted_values
from engine.formats.widgets import (
    HIDDEN,
    MISSING,
    ConversionProblem,
    Widget,
    assign,
    widget_inputs,
    widgets_of,
)


@dataclass(frozen=True)
class _Ref:
    """Output ``slot`` of flat node ``node``."""

    node: str
    slot: int


@dataclass(frozen=True)
class _Const:
    """A constant standing in for a link (a PrimitiveNode's value, a promoted widget's value)."""

    value: Any


class _Removed:
    """The link ends at a node that is not emitted: drop the input, widget value included."""


_REMOVED = _Removed()


class _NestingError(WorkflowFormatError):
    """Subgraphs nested too deeply (a cycle): reported once, not wrapped by every level."""


_Source = _Ref | _Const
_Resolved = _Ref | _Const | _Removed | None  # None: no link; the widget value (if any) stays


@dataclass
class _FlatInput:
    name: str
    type: str
    source: _Source | None


@dataclass
class _FlatNode:
    id: str
    type: str
    mode: int
    title: str | None
    inputs: list[_FlatInput]
    output_types: list[str]
    widgets_values: Any = None
    aliases: list[_Source | None] | None = None  # set on virtual pass-through nodes


@dataclass
class _Flattener:
    object_info: Mapping[str, Mapping[str, Any]]
    subgraphs: Mapping[str, Mapping[str, Any]]
    group_defs: Mapping[str, Mapping[str, Any]]
    flat: dict[str, _FlatNode] = field(default_factory=dict)

    # --- graphs (top level and subgraph definitions) -----------------------------------------
    def graph(self, graph: Mapping[str, Any], prefix: str, inherited_mode: int, depth: int) -> None:
        if depth > MAX_NESTING:
            raise _NestingError(f"subgraphs or group nodes nest deeper than {MAX_NESTING} levels (a cycle?)")
        links = link_table(graph.get("links"))
        nodes = graph.get("nodes")
        if not isinstance(nodes, list):
            raise WorkflowFormatError(f"expected a 'nodes' list, found {json_kind(nodes)}")
        for position, node in enumerate(nodes):
            if not isinstance(node, Mapping) or "id" not in node or not isinstance(node.get("type"), str):
                raise WorkflowFormatError(
                    f"node #{position} of the 'nodes' list: expected an object with 'id' and 'type', found {node!r:.80}"
                )
            if not isinstance(node["id"], int | str) or isinstance(node["id"], bool):
                raise WorkflowFormatError(
                    f"node #{position} of the 'nodes' list ({node['type']}): 'id' must be a number or a "
                    f"string, found {json_kind(node['id'])}"
                )
            if len(self.flat) >= MAX_NODES:  # subgraphs nest: a small file can expand enormously
                raise WorkflowTooLarge()
            node_id = f"{prefix}{node['id']}"
            mode = _mode(node, inherited_mode)
            inputs = [
                _FlatInput(str(i.get("name", "")), str(i.get("type", "")), _source_of(i, links, prefix))
                for i in entries(node.get("inputs"))
            ]
            outputs = [str(o.get("type", "")) for o in entries(node.get("outputs"))]
            type_ = node["type"]
            if type_ in self.subgraphs:
                try:
                    self.subgraph(node, node_id, mode, inputs, outputs, depth)
                except (_NestingError, WorkflowTooLarge):
                    raise  # the size limit keeps its own type (answered 413), whatever the depth
                except WorkflowFormatError as exc:
                    raise WorkflowFormatError(f"node {node_id} (subgraph {type_}): {exc}") from exc
            elif type_.startswith(ui_rules().group_node_prefixes) and _group_name(type_) in self.group_defs:
                try:
                    self.group_node(node, node_id, mode, inputs, outputs)
                except WorkflowFormatError as exc:
                    raise WorkflowFormatError(
                        f"group node {node_id} ({type_}): its definition in extra.groupNodes is malformed: {exc}"
                    ) from exc
            else:
                title = node.get("title")
                values = node.get("widgets_values")
                if values is not None and not isinstance(values, list | Mapping):
                    raise WorkflowFormatError(
                        f"node {node_id} ({type_}): expected 'widgets_values' to be a list (or an object by widget "
                        f"name), found {type(values).__name__} {values!r:.40}"
                    )
                self.flat[node_id] = _FlatNode(
                    node_id,
                    type_,
                    mode,
                    title if isinstance(title, str) else None,
                    inputs,
                    outputs,
                    node.get("widgets_values"),
                )

    # --- subgraph instances ------------------------------------------------------------------
    def subgraph(
        self,
        node: Mapping[str, Any],
        node_id: str,
        mode: int,
        inputs: list[_FlatInput],
        outputs: list[str],
        depth: int,
    ) -> None:
        definition = self.subgraphs[node["type"]]
        inner = f"{node_id}:"
        links = link_table(definition.get("links"))
        # The instance is an alias: its output k is whatever feeds the subgraph's output node slot k.
        aliases: list[_Source | None] = [None] * len(outputs)
        for link in links.values():
            if link.target_id == ui_rules().subgraph_output_node and 0 <= link.target_slot < len(aliases):
                aliases[link.target_slot] = _Ref(f"{inner}{link.origin_id}", link.origin_slot)
        self.flat[node_id] = _FlatNode(node_id, node["type"], mode, None, inputs, outputs, aliases=aliases)
        # Inside, the subgraph's input node (id -10) is an alias: its slot k stands for the
        # definition's input k, fed by the instance input bound to it by name (files list only
        # some of an instance's inputs, in any order); an unlinked input promoted to a widget
        # carries the instance's value for it, if the file stores one.
        slots = subgraph_inputs(definition)
        if slots is None:  # no named inputs: the instance's inputs by position
            slots = [SubgraphSlot(i.name, i.type) for i in inputs]
            bound = {k: k for k in range(len(slots))}
        else:
            bound = bind_instance_inputs(entries(node.get("inputs")), slots)
        promoted = promoted_values(
            node, slots, promoted_slots(definition, slots, links, self.object_info, self.subgraphs)
        )
        in_aliases: list[_Source | None] = []
        for k in range(len(slots)):
            position = bound.get(k)
            source = inputs[position].source if position is not None else None
            if source is None and k in promoted:
                in_aliases.append(_Const(promoted[k]))
            else:
                in_aliases.append(source)
        in_id = f"{inner}{ui_rules().subgraph_input_node}"
        self.flat[in_id] = _FlatNode(
            in_id, "SubgraphInput", 0, None, [], [slot.type for slot in slots], aliases=in_aliases
        )
        self.graph(definition, inner, mode, depth + 1)

    # --- legacy group nodes (extra.groupNodes) -----------------------------------------------
    def group_node(
        self, node: Mapping[str, Any], node_id: str, mode: int, inputs: list[_FlatInput], outputs: list[str]
    ) -> None:
        definition = self.group_defs[_group_name(node["type"])]
        inner_nodes = entries(definition.get("nodes"))
        internal = group_links(definition.get("links"), "links")
        external = _group_external(definition.get("external"))
        linked_to = {(t_idx, t_slot): (f_idx, f_slot) for f_idx, f_slot, t_idx, t_slot in internal}
        linked_from = {(f_idx, f_slot) for f_idx, f_slot, _, _ in internal}

        def inner_id(idx: int) -> str:
            return f"{node_id}:{idx}"

        # Instance input slots, in order: inner socket inputs that no internal link feeds.
        socket_slots = [i for i, e in enumerate(entries(node.get("inputs"))) if widget_name(e) is None]
        widget_inputs = {
            widget_name(e): i for i, e in enumerate(entries(node.get("inputs"))) if widget_name(e)
        }
        indexed = [(_inner_index(inner, pos), inner) for pos, inner in enumerate(inner_nodes)]
        exposed_sockets: list[tuple[int, int]] = []
        exposed_widgets: list[tuple[int, Widget]] = []
        for idx, inner in indexed:
            for slot, entry in enumerate(entries(inner.get("inputs"))):
                if widget_name(entry) is None and (idx, slot) not in linked_to:
                    exposed_sockets.append((idx, slot))
            for widget in widgets_of(self.object_info.get(str(inner.get("type")))):
                exposed_widgets.append((idx, widget))
        # The instance's widgets_values list every inner widget, node after node.
        per_node: dict[int, dict[str, Any]] = {}
        assigned, _ = assign([w for _, w in exposed_widgets], node.get("widgets_values"))
        for (idx, widget), value in zip(exposed_widgets, assigned, strict=True):
            if value is not MISSING and value is not HIDDEN:
                per_node.setdefault(idx, {})[widget.name] = value

        exposed_outputs = [
            (idx, slot)
            for idx, inner in indexed
            for slot, _ in enumerate(entries(inner.get("outputs")))
            if (idx, slot) not in linked_from or (idx, slot) in external
        ]
        aliases: list[_Source | None] = [_Ref(inner_id(i), s) for i, s in exposed_outputs[: len(outputs)]]
        aliases += [None] * (len(outputs) - len(aliases))
        self.flat[node_id] = _FlatNode(node_id, node["type"], mode, None, inputs, outputs, aliases=aliases)

        slot_source = {
            pair: inputs[socket_slots[n]].source
            for n, pair in enumerate(exposed_sockets)
            if n < len(socket_slots)
        }
        for idx, inner in indexed:
            flat_inputs = []
            for slot, entry in enumerate(entries(inner.get("inputs"))):
                name = str(entry.get("name", ""))
                source: _Source | None = None
                if (idx, slot) in linked_to:
                    f_idx, f_slot = linked_to[(idx, slot)]
                    source = _Ref(inner_id(f_idx), f_slot)
                elif (idx, slot) in slot_source:
                    source = slot_source[(idx, slot)]
                elif widget_name(entry) in widget_inputs:
                    source = inputs[widget_inputs[widget_name(entry)]].source
                flat_inputs.append(_FlatInput(name, str(entry.get("type", "")), source))
            title = inner.get("title")
            widgets_values = per_node.get(idx) if node.get("widgets_values") else inner.get("widgets_values")
            self.flat[inner_id(idx)] = _FlatNode(
                inner_id(idx),
                str(inner.get("type")),
                _mode(inner, mode),
                title if isinstance(title, str) else None,
                flat_inputs,
                [str(o.get("type", "")) for o in entries(inner.get("outputs"))],
                widgets_values,
            )


# --- public entry point -----------------------------------------------------------------------
def convert_ui_to_api(
    ui: Mapping[str, Any],
    object_info: Mapping[str, Mapping[str, Any]],
    problems: list[ConversionProblem] | None = None,
) -> dict[str, Any]:
    """Convert a ComfyUI UI-format workflow (litegraph ``nodes``/``links``) to API format.

    ``object_info`` is ComfyUI's ``/object_info`` mapping; it tells which inputs are widgets and
    in what order ``widgets_values`` lists them (rules: :mod:`engine.formats.widgets`). Unknown
    class types are kept as they are (their widget values cannot be mapped; validation reports
    the class later). What had to be guessed or dropped is appended to ``problems`` when given;
    what cannot be converted at all raises :class:`WorkflowFormatError` naming the node.
    """
    if not isinstance(ui, Mapping) or not isinstance(ui.get("nodes"), list):
        raise WorkflowFormatError("expected a ComfyUI UI-format workflow (an object with a 'nodes' list)")
    flattener = _Flattener(object_info, subgraph_definitions(ui), group_node_definitions(ui))
    flattener.graph(ui, "", 0, 0)
    flat = flattener.flat
    frontend_only = ui_rules().frontend_only_types

    prompt: dict[str, Any] = {}
    for node in sorted(flat.values(), key=lambda n: _natural_key(n.id)):
        if node.aliases is not None or node.type in frontend_only or node.mode in (MODE_MUTED, MODE_BYPASSED):
            continue
        info = object_info.get(node.type)
        inputs: dict[str, Any] = {}
        if info is not None:
            inputs.update(widget_inputs(widgets_of(info), node.widgets_values, node.id, node.type, problems))
        for flat_input in node.inputs:
            resolved = _resolve(flat, flat_input.source)
            dangling = isinstance(flat_input.source, _Ref) and flat_input.source.node not in flat
            if dangling and problems is not None:
                problems.append(
                    ConversionProblem(
                        node.id,
                        node.type,
                        f"input {flat_input.name!r} is linked to a "
                        "node that does not exist; the link is ignored",
                        "note",
                    )
                )
            if isinstance(resolved, _Removed):
                inputs.pop(flat_input.name, None)
            elif isinstance(resolved, _Const):
                value = resolved.value
                inputs[flat_input.name] = {"__value__": value} if isinstance(value, list) else value
            elif isinstance(resolved, _Ref):
                inputs[flat_input.name] = [resolved.node, resolved.slot]
        order = _input_order(info)
        inputs = {k: inputs[k] for k in sorted(inputs, key=lambda k: order.get(k, len(order)))}
        title = node.title or (info or {}).get("display_name") or node.type
        prompt[node.id] = {"class_type": node.type, "inputs": inputs, "_meta": {"title": title}}
    return prompt


# --- link resolution --------------------------------------------------------------------------
def _resolve(flat: Mapping[str, _FlatNode], source: _Source | None) -> _Resolved:
    """Follow a link through Reroutes, aliases, bypassed nodes and PrimitiveNodes to its producer."""
    seen: set[_Ref] = set()
    while isinstance(source, _Ref):
        if source in seen:
            return _REMOVED  # a loop of reroutes/bypasses: nothing real feeds it
        seen.add(source)
        node = flat.get(source.node)
        if node is None:
            return None  # dangling link: ComfyUI leaves the widget value
        if node.mode == MODE_MUTED:
            return _REMOVED
        if node.mode == MODE_BYPASSED:
            match = _bypass_input(node, source.slot)
            if match is None:
                return _REMOVED
            source = match.source
            if source is None:
                return None
            continue
        if node.aliases is not None:
            source = node.aliases[source.slot] if source.slot < len(node.aliases) else None
            continue
        if node.type == "Reroute":
            source = node.inputs[0].source if node.inputs else None
            continue
        if node.type == "PrimitiveNode":
            values = node.widgets_values
            if isinstance(values, list) and values:
                return _Const(values[0])
            return None
        if node.type in ui_rules().frontend_only_types:
            return _REMOVED
        return source
    return source


def _bypass_input(node: _FlatNode, slot: int) -> _FlatInput | None:
    """The input a bypassed node hands on for output ``slot`` (rule in :mod:`engine.formats.modes`)."""
    wanted = node.output_types[slot] if slot < len(node.output_types) else ""
    index = passed_through(wanted, [i.type for i in node.inputs], slot)
    return None if index is None else node.inputs[index]


# --- widgets (rules in engine/formats/widgets.py) ---------------------------------------------
def _input_order(info: Mapping[str, Any] | None) -> dict[str, int]:
    if not isinstance(info, Mapping):
        return {}
    order = info.get("input_order") or {}
    declared = info.get("input") or {}
    names: list[str] = []
    for section in ("required", "optional"):
        names += list(order.get(section) or declared.get(section) or {})
    return {name: i for i, name in enumerate(names)}


# --- small parsing helpers (the containers themselves: engine/formats/ui_parse.py) ----------------
def _source_of(entry: Mapping[str, Any], links: Mapping[int, Link], prefix: str) -> _Ref | None:
    link = link_of(entry, links)
    return None if link is None else _Ref(f"{prefix}{link.origin_id}", link.origin_slot)


def _group_external(raw: Any) -> set[tuple[int, int]]:
    """A group node definition's ``external`` list: ``[node index, output slot, type]`` for each
    inner output also linked outside the group."""
    found = set()
    for entry in raw or []:
        index = as_index(entry[0]) if isinstance(entry, list) and len(entry) >= 2 else None
        slot = as_index(entry[1]) if index is not None else None
        if index is None or slot is None:
            raise WorkflowFormatError(
                f"'external' entries must be [node index, output slot, type], found {entry!r:.60}"
            )
        found.add((index, slot))
    return found


def _inner_index(inner: Mapping[str, Any], position: int) -> int:
    index = as_index(inner.get("index", position))
    if index is None:
        raise WorkflowFormatError(
            f"nodes[{position}] ({inner.get('type')!s:.40}): 'index' must be a whole number, "
            f"found {inner.get('index')!r:.40}"
        )
    return index


def _mode(node: Mapping[str, Any], inherited: int) -> int:
    return inherited_mode(node.get("mode", 0), inherited)


def _group_name(node_type: str) -> str:
    for prefix in ui_rules().group_node_prefixes:
        if node_type.startswith(prefix):
            return node_type[len(prefix) :]
    return node_type


def _natural_key(node_id: str) -> list[tuple[int, int, str]]:
    """``"10:2"`` after ``"9:3"``: numeric parts by value (compared as digit strings, so ids of
    any length sort without converting them), the others after, as text."""
    key = []
    for part in node_id.split(":"):
        if part.isascii() and part.isdigit():
            digits = part.lstrip("0") or "0"
            key.append((0, len(digits), digits))
        else:
            key.append((1, 0, part))
    return key
