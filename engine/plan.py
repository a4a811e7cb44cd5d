"""The plan validation hands to the executor: which nodes run, in what order, with what inputs.

:func:`engine.validate.validate_prompt` builds a :class:`Plan` for the outputs that passed; the
executor, the coalescer and the CLI read it instead of walking links and converting widget values
again. :func:`cache_keys` gives every planned node the key its outputs are cached under.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engine.cache import canonical, is_nonce, make_key, nonce
from engine.context import Folders
from engine.graph import Link, Prompt
from engine.node import NodeDef, contained
from engine.schema import HIDDEN_UNIQUE_ID


@dataclass(frozen=True)
class PlannedNode:
    """One node as it will run. ``links``: its linked inputs; ``constants``: its constant inputs
    converted to their declared types, plus the defaults of optional widgets left out."""

    node_id: str
    definition: NodeDef
    links: Mapping[str, Link]
    constants: Mapping[str, Any]

    @property
    def class_type(self) -> str:
        return self.definition.schema.node_id


@dataclass(frozen=True)
class Plan:
    """``outputs``: the output nodes that will run; ``order``: every node they need, in the
    deterministic topological order they run in; ``nodes``: those nodes by id."""

    prompt: Prompt
    outputs: list[str]
    order: list[str]
    nodes: Mapping[str, PlannedNode]

    @property
    def needed(self) -> frozenset[str]:
        return frozenset(self.order)

    def __getitem__(self, node_id: str) -> PlannedNode:
        return self.nodes[node_id]


def with_defaults(definition: NodeDef, constants: Mapping[str, Any]) -> dict[str, Any]:
    """``constants`` plus the default of every optional widget the workflow leaves out."""
    full = dict(constants)
    for spec in definition.schema.inputs:
        if spec.name not in full and spec.optional and spec.is_widget and spec.default is not None:
            full[spec.name] = spec.default
    return full


def cache_key(planned: PlannedNode, producer_keys: Mapping[str, str], folders: Folders) -> str:
    """The node's cache key from its class, code, constants, fingerprint and its producers' keys
    (``producer_keys``: node id → key). A nonce (never a hit) when the node or a producer is not
    idempotent, or when its constants or fingerprint cannot be hashed."""
    definition = planned.definition
    if definition.schema.not_idempotent:
        return nonce()
    producers: dict[str, list[Any]] = {}
    for name, link in planned.links.items():
        source_key = producer_keys[link.source]
        if is_nonce(source_key):
            return nonce()
        producers[name] = [source_key, link.output_index]
    constants = dict(planned.constants)
    try:
        with contained(f"node {planned.node_id} ({planned.class_type})"):
            fingerprint = definition.fingerprint(folders, constants)
        if isinstance(fingerprint, float) and fingerprint != fingerprint:  # NaN: always changed
            return nonce()
        parts = {
            "class": planned.class_type,
            "code": definition.code_version,
            "constants": constants,
            "fingerprint": fingerprint,
            "producers": producers,
            "unique_id": planned.node_id if HIDDEN_UNIQUE_ID in definition.schema.hidden else None,
        }
        canonical(parts)
    except Exception:  # unhashable constants or a failing fingerprint hook: never hit
        return nonce()
    return make_key(parts)


def cache_keys(plan: Plan, folders: Folders) -> dict[str, str]:
    """The cache key of every planned node, computed in run order (fingerprints are read now)."""
    keys: dict[str, str] = {}
    for node_id in plan.order:
        keys[node_id] = cache_key(plan[node_id], keys, folders)
    return keys
