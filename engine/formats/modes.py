"""Node modes, as ComfyUI stores them (0 = always, 2 = muted, 4 = bypassed), and what they do.

A muted node does not run, and inputs that read it are removed. A bypassed node does not run
either: each consumer of its output reads instead the first input of the bypassed node whose type
matches that output's type, trying the input at the same index first (as ComfyUI's frontend does).
A muted or bypassed container (subgraph, group node) mutes or bypasses everything inside it. The
saved format (:func:`apply_modes`) and UI-format import (:mod:`engine.formats.ui_import`) both use
these rules.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from engine.formats.api import WorkflowFormatError, is_link

MODE_ALWAYS = 0
MODE_MUTED = 2  # litegraph's NEVER
MODE_BYPASSED = 4


def inherited_mode(own: Any, container: int) -> int:
    """The mode a node runs in: its container's when that is muted or bypassed, else its own."""
    if container in (MODE_MUTED, MODE_BYPASSED):
        return container
    return own if isinstance(own, int) else MODE_ALWAYS


def passed_through(output_type: str, input_types: Sequence[str], slot: int) -> int | None:
    """Which input (index into ``input_types``) a bypassed node hands on for its output ``slot``
    of type ``output_type``: the one at ``slot`` if its type matches, else the first that does
    (``*`` matches anything); None if none does."""
    for index in [slot, *range(len(input_types))]:
        if index < len(input_types):
            kind = input_types[index]
            if kind == output_type or "*" in (kind, output_type):
                return index
    return None


def apply_modes(
    prompt: Mapping[str, Any], layout: Mapping[str, Any], object_info: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any]:
    """The API graph that runs from a saved workflow's graph and its layout's node modes."""
    modes = {
        str(k): v.get("mode", 0) for k, v in (layout.get("nodes") or {}).items() if isinstance(v, Mapping)
    }
    muted = {n for n, m in modes.items() if m == MODE_MUTED and n in prompt}
    bypassed = {n for n, m in modes.items() if m == MODE_BYPASSED and n in prompt}
    if not muted and not bypassed:
        return dict(prompt)
    runnable = {k: copy.deepcopy(dict(v)) for k, v in prompt.items() if k not in muted and k not in bypassed}
    for node_id, node in runnable.items():
        inputs = node.get("inputs") or {}
        for name in list(inputs):
            value = inputs[name]
            if is_link(value):
                where = f"node {node_id!r} input {name!r}"
                target = _through_bypass(prompt, value, muted, bypassed, object_info, where)
                if target is None:
                    del inputs[name]
                else:
                    inputs[name] = target
    return runnable


def _through_bypass(
    prompt: Mapping[str, Any],
    link: list[Any],
    muted: set[str],
    bypassed: set[str],
    object_info: Mapping[str, Mapping[str, Any]],
    where: str,
) -> list[Any] | None:
    seen: set[str] = set()
    while link[0] in bypassed and link[0] not in seen:
        source = link[0]
        if link[1] < 0:  # never taken from the end of the outputs
            raise WorkflowFormatError(
                f"{where}: links to output {link[1]} of bypassed node {source!r}; output slots count "
                "from 0: reconnect the input"
            )
        seen.add(source)
        node = prompt[source]
        info = object_info.get(str(node.get("class_type"))) or {}
        outputs = info.get("output") or []
        wanted = outputs[link[1]] if link[1] < len(outputs) else "*"
        declared = {
            **(info.get("input") or {}).get("required", {}),
            **(info.get("input") or {}).get("optional", {}),
        }
        links = [v for n, v in (node.get("inputs") or {}).items() if is_link(v)]
        types = [_type_name(declared.get(n)) for n, v in (node.get("inputs") or {}).items() if is_link(v)]
        index = passed_through(wanted, types, link[1])
        if index is None:
            return None
        link = links[index]
    if link[0] in muted or link[0] in seen:
        return None
    return list(link)


def _type_name(spec: Any) -> str:
    return spec[0] if isinstance(spec, list | tuple) and spec and isinstance(spec[0], str) else "?"
