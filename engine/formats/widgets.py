"""How ComfyUI's frontend maps a UI-format node's ``widgets_values`` onto its widget inputs.

Rules, as the frontend builds and restores widgets (``useIntWidget``/``useComboWidget``,
``addValueControlWidgets``, the ``Comfy.UploadImage`` extension, ``LGraphNode.configure``); the
names and values they use are data, ``ui_rules.json`` (:mod:`engine.formats.ui_rules`), which the
editor reads too (``web/js/uirules.js`` applies the same rules):

- A node's widgets are its widget inputs (the table's ``widget_types``; not ``forceInput``) in
  ``input_order`` (required, then optional), then an ``upload`` button when an input asks for a
  media upload (the table's ``upload.flags``). The button's value is stored but never sent.
- An input with ``control_after_generate`` (and, in older frontends, any INT named ``seed`` or
  ``noise_seed``) is followed by a "control after generate" widget: one stored value for numbers,
  two for a COMBO (the control and its filter text). Files store the control value as a string
  (``"randomize"``, ...), as a boolean (2023 files), or not at all (files written by tools, or
  newest frontends that keep the control outside ``widgets_values``): a value is taken as a
  control value only if it looks like one and the file has values to spare.
- ``widgets_values`` restores positionally; surplus trailing values are ignored; a widget the file
  has no value for keeps the widget's default (an older save of a node that gained an input).
- Array values are sent wrapped as ``{"__value__": [...]}`` (arrays mean links in API format).
- A dynamic combo (ComfyUI V3's ``DynamicCombo``, ``dynamicWidgets.ts``) reveals the widgets of the
  chosen option right after itself, named ``combo.key``; the others do not exist, store no value
  and are not sent. Loom declares each revealed input flat, as ``combo.key`` with
  ``{"revealed_by": {"input": combo, "choices": [...]}}`` among its options.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine.formats.ui_rules import ui_rules
from engine.schema import COMBO

MISSING: Any = object()
HIDDEN: Any = object()  # a dynamic combo's widget its chosen option does not reveal
REVEALED_BY = "revealed_by"


@dataclass(frozen=True)
class Widget:
    """One widget of a node: its input name, the values stored after it for its "control after
    generate" companions (0, 1, or 2 for a COMBO), whether its value is sent (``serialize``), the
    default the frontend gives it, and its kind (INT, FLOAT, STRING, BOOLEAN, COMBO)."""

    name: str
    control_slots: int = 0
    serialize: bool = True
    default: Any = None
    kind: str = ""
    options: tuple[Any, ...] | None = None
    revealed_by: tuple[str, tuple[Any, ...]] | None = None  # (dynamic combo, the choices showing it)


@dataclass(frozen=True)
class ConversionProblem:
    """Something a conversion had to guess or drop: the node, its class, and what happened."""

    node_id: str
    class_type: str
    message: str
    level: str = "warning"  # "warning": the result may be wrong; "note": a documented fallback was used

    def to_json(self) -> dict[str, str]:
        return {
            "node_id": self.node_id,
            "class_type": self.class_type,
            "message": self.message,
            "level": self.level,
        }

    def __str__(self) -> str:
        return f"node {self.node_id} ({self.class_type}): {self.message}"


def is_widget_spec(spec: Sequence[Any]) -> bool:
    """Whether an ``object_info`` input spec (``[kind, options]``) is a widget: a COMBO (a list of
    choices or ``"COMBO"``) or a scalar widget type, unless the spec forces an input socket."""
    kind = spec[0] if spec else None
    opts = spec[1] if len(spec) > 1 and isinstance(spec[1], Mapping) else {}
    return (isinstance(kind, list) or kind in ui_rules().widget_types) and not opts.get("forceInput")


def widgets_of(info: Mapping[str, Any] | None) -> list[Widget]:
    """The widgets of an ``object_info`` entry, in the order the frontend creates them."""
    if not isinstance(info, Mapping):
        return []
    declared = info.get("input") or {}
    order = info.get("input_order") or {}
    rules = ui_rules()
    widgets: list[Widget] = []
    upload = False
    for section in ("required", "optional"):
        specs = declared.get(section) or {}
        for name in order.get(section) or list(specs):
            spec = specs.get(name)
            if not isinstance(spec, Sequence) or isinstance(spec, str) or not spec:
                continue
            if not is_widget_spec(spec):
                continue
            kind, opts = spec[0], spec[1] if len(spec) > 1 and isinstance(spec[1], Mapping) else {}
            options = _combo_options(kind, opts)
            upload = upload or any(opts.get(flag) for flag in rules.upload_flags)
            controlled = bool(opts.get("control_after_generate")) or (
                kind == "INT" and name in rules.seed_names
            )
            slots = rules.control_slots(COMBO if options is not None else str(kind)) if controlled else 0
            widgets.append(
                Widget(
                    str(name),
                    slots,
                    True,
                    _default(kind, opts, options),
                    "COMBO" if options is not None else str(kind),
                    options,
                    _revealed_by(opts),
                )
            )
    if upload:
        widgets.append(Widget(rules.upload_widget, 0, False, rules.upload_value, "BUTTON"))
    return _after_their_combos(widgets)


def _revealed_by(opts: Mapping[str, Any]) -> tuple[str, tuple[Any, ...]] | None:
    raw = opts.get(REVEALED_BY)
    if not isinstance(raw, Mapping) or not isinstance(raw.get("input"), str):
        return None
    choices = raw.get("choices")
    return str(raw["input"]), tuple(choices) if isinstance(choices, list | tuple) else ()


def _after_their_combos(widgets: list[Widget]) -> list[Widget]:
    """Each dynamic combo's widgets right after it (nested combos' after theirs), in declaration order."""
    names = {w.name for w in widgets}
    children: dict[str, list[Widget]] = {}
    for w in widgets:
        if w.revealed_by is not None and w.revealed_by[0] in names:
            children.setdefault(w.revealed_by[0], []).append(w)
    ordered: list[Widget] = []

    def place(widget: Widget, depth: int) -> None:
        ordered.append(widget)
        for child in children.get(widget.name, []) if depth < len(widgets) else []:
            place(child, depth + 1)

    for w in widgets:
        if w.revealed_by is None or w.revealed_by[0] not in names:
            place(w, 0)
    return ordered


def _combo_options(kind: Any, opts: Mapping[str, Any]) -> tuple[Any, ...] | None:
    if isinstance(kind, list):
        return tuple(kind)
    if kind == "COMBO":
        return tuple(opts.get("options") or ())
    return None


def _default(kind: Any, opts: Mapping[str, Any], options: tuple[Any, ...] | None) -> Any:
    """The value a freshly created widget has (the frontend's defaults when the spec names none)."""
    if "default" in opts:
        return opts["default"]
    if options is not None:
        return options[0] if options else None
    if kind in ("INT", "FLOAT"):
        low = opts.get("min")
        return low if isinstance(low, int | float) and low > 0 else 0
    return {"STRING": "", "BOOLEAN": False}.get(str(kind))


def looks_like_control(value: Any) -> bool:
    return (
        value is None
        or isinstance(value, bool)
        or (isinstance(value, str) and value in ui_rules().control_values)
    )


def assign(widgets: Sequence[Widget], values: Any) -> tuple[list[Any], int]:
    """One value per widget (``MISSING`` where the file has none) from ``widgets_values``: a list
    in widget order, or (some newer files) an object by widget name; and how many list entries
    that used (controls included; the rest are surplus)."""
    chosen: dict[str, Any] = {}  # each shown widget's value (its default where the file has none)
    if isinstance(values, Mapping):
        by_name = [values.get(w.name, MISSING) for w in widgets]
        for position, widget in enumerate(widgets):
            if not _revealed(widget, chosen):
                by_name[position] = HIDDEN
            elif by_name[position] is MISSING:
                chosen[widget.name] = widget.default
            else:
                chosen[widget.name] = by_name[position]
        return by_name, 0
    out: list[Any] = [MISSING] * len(widgets)
    if not isinstance(values, list):
        for position, widget in enumerate(widgets):
            if _revealed(widget, chosen):
                chosen[widget.name] = widget.default
            else:
                out[position] = HIDDEN
        return out, 0
    i = 0
    for position, widget in enumerate(widgets):
        if not _revealed(widget, chosen):
            out[position] = HIDDEN
            continue
        if i >= len(values):
            chosen[widget.name] = widget.default
            continue
        out[position] = chosen[widget.name] = values[i]
        i += 1
        needed_after = sum(
            w.revealed_by is None for w in widgets[position + 1 :]
        )  # values later widgets need
        if widget.control_slots and i < len(values) and len(values) - i > needed_after:
            if looks_like_control(values[i]):
                i += 1
                spare = len(values) - i > needed_after
                if widget.control_slots == 2 and i < len(values) and spare and isinstance(values[i], str):
                    i += 1  # the combo's filter text
    return out, i


def _revealed(widget: Widget, chosen: Mapping[str, Any]) -> bool:
    """Whether a widget exists: always, unless a dynamic combo reveals it and shows another option
    (or is itself hidden)."""
    if widget.revealed_by is None:
        return True
    combo, choices = widget.revealed_by
    return combo in chosen and chosen[combo] in choices


def widget_inputs(
    widgets: Sequence[Widget],
    values: Any,
    node_id: str,
    class_type: str,
    problems: list[ConversionProblem] | None,
) -> dict[str, Any]:
    """The API-format inputs the frontend sends for these widgets, defaults filled in; what had to
    be guessed goes to ``problems`` (when given)."""
    assigned, used = assign(widgets, values)
    inputs: dict[str, Any] = {}
    for widget, value in zip(widgets, assigned, strict=True):
        if not widget.serialize or value is HIDDEN:
            continue
        if value is MISSING:
            value = widget.default
            if problems is not None and values is not None:
                problems.append(
                    ConversionProblem(
                        node_id,
                        class_type,
                        f"the file stores no value for widget {widget.name!r}; its default {value!r} is used",
                        "note",
                    )
                )
        elif problems is not None:
            mismatch = _type_problem(widget, value)
            if mismatch:
                problems.append(ConversionProblem(node_id, class_type, mismatch))
        inputs[widget.name] = {"__value__": value} if isinstance(value, list) else value
    if problems is not None and isinstance(values, list) and MISSING not in assigned:
        if used < len(values):
            surplus = values[used:]
            problems.append(
                ConversionProblem(
                    node_id,
                    class_type,
                    f"{len(surplus)} surplus widget value(s) ignored: {surplus!r:.80}",
                    "note",
                )
            )
    return inputs


def _type_problem(widget: Widget, value: Any) -> str | None:
    number = isinstance(value, int | float) and not isinstance(value, bool)
    whole = number and (isinstance(value, int) or value.is_integer())  # float(huge int) would overflow
    expected = None
    if widget.kind == "INT" and not (whole or _numeric_text(value)):
        expected = "an integer"
    elif (
        widget.kind == "COMBO"
        and widget.options
        and value not in widget.options
        and not isinstance(value, type(widget.options[0]))
    ):
        expected = f"one of {list(widget.options)[:4]!r:.60}"
    elif widget.kind == "FLOAT" and not (number or _numeric_text(value)):
        expected = "a number"
    elif widget.kind == "BOOLEAN" and not isinstance(value, bool):
        expected = "true or false"
    if expected is None:
        return None
    return (
        f"widget {widget.name!r} expects {expected} but the file has {value!r:.40}; the widget values may "
        "be shifted (a node saved by another version, or a missing control-after-generate value)"
    )


def _numeric_text(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    try:
        float(value)
    except ValueError:
        return False
    return True
