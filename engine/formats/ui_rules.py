"""The UI-format rules Loom's server and editor share, read from ``ui_rules.json`` next to this file.

The editor imports the same file from ``GET /api/v1/workflows/ui-rules`` (``web/js/uirules.js``),
so neither side spells these rules out in code; ``tests/compat/test_ui_rules.py`` runs both
sides' widget readers on the same cases.

    rules = ui_rules()
    rules.frontend_only_types   # frozenset({"Note", "MarkdownNote", "Reroute", "PrimitiveNode"})
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import MappingProxyType
from typing import Any

RULES_FILE = Path(__file__).with_name("ui_rules.json")


@dataclass(frozen=True)
class UiRules:
    """The table, typed. ``control_values``: every value a file may store for a "control after
    generate" widget (the editor's ``control_choices`` plus older ones it reads but never offers)."""

    frontend_only_types: frozenset[str]
    note_types: frozenset[str]
    group_node_prefixes: tuple[str, ...]
    subgraph_input_node: int
    subgraph_output_node: int
    widget_types: frozenset[str]
    control_choices: tuple[str, ...]
    control_values: frozenset[str]
    control_in_images: str
    seed_names: frozenset[str]
    control_values_stored: Mapping[str, int]
    upload_flags: tuple[str, ...]
    upload_widget: str
    upload_value: str

    def control_slots(self, kind: str) -> int:
        """How many values files store after a controlled widget of this kind (a COMBO also stores
        its filter text)."""
        return self.control_values_stored.get(kind, self.control_values_stored["other"])


@cache
def ui_rules_text() -> str:
    """The table as the file holds it (what the server sends the editor)."""
    return RULES_FILE.read_text(encoding="utf-8")


@cache
def ui_rules() -> UiRules:
    """The table, read once."""
    try:
        data = json.loads(ui_rules_text())
        control, upload = data["control_after_generate"], data["upload"]
        return UiRules(
            frontend_only_types=frozenset(data["frontend_only_types"]),
            note_types=frozenset(data["note_types"]),
            group_node_prefixes=tuple(data["group_node_prefixes"]),
            subgraph_input_node=int(data["subgraph_input_node"]),
            subgraph_output_node=int(data["subgraph_output_node"]),
            widget_types=frozenset(data["widget_types"]),
            control_choices=tuple(control["choices"]),
            control_values=frozenset(control["choices"]) | frozenset(control["also_read"]),
            control_in_images=str(control["in_images"]),
            seed_names=frozenset(control["implied_for_int_inputs"]),
            control_values_stored=_int_mapping(control["values_stored"]),
            upload_flags=tuple(upload["flags"]),
            upload_widget=str(upload["widget"]),
            upload_value=str(upload["value"]),
        )
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise RuntimeError(
            f"{RULES_FILE}: expected the UI-format rules table (keys frontend_only_types, note_types, "
            f"group_node_prefixes, subgraph_input_node, subgraph_output_node, widget_types, "
            f"control_after_generate, upload), found a file that does not parse ({type(exc).__name__}: {exc}); "
            "restore it from git"
        ) from exc


def _int_mapping(raw: Any) -> Mapping[str, int]:
    if not isinstance(raw, Mapping) or "other" not in raw:
        raise ValueError(f"values_stored: expected an object with an 'other' count, found {raw!r:.60}")
    return MappingProxyType({str(k): int(v) for k, v in raw.items()})
