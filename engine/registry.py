"""The node registry: an explicit object that core nodes and plugins register into.

``main.py`` creates one, registers the core library and the plugins, and passes it down.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from engine.node import NativeNodeDef, Node, NodeDef, contained
from engine.schema import DynamicOptions, export_all

log = logging.getLogger("loom.registry")


class RegistryError(ValueError):
    """A registration was refused (duplicate name, core collision)."""


@dataclass(frozen=True)
class Collision:
    node_id: str
    kept_origin: str
    refused_origin: str


class NodeRegistry:
    def __init__(self) -> None:
        self._defs: dict[str, NodeDef] = {}
        self._options: dict[str, Callable[[], list[str]]] = {}
        self.collisions: list[Collision] = []

    # --- registration -------------------------------------------------------------------------
    def register(self, node: type[Node] | NodeDef, *, origin: str = "core") -> NodeDef:
        """Register a native node class or an adapted :class:`NodeDef`.

        A class whose schema is malformed raises ``SchemaError`` naming the class and field.
        A name already taken is refused with ``RegistryError`` (and recorded in ``collisions``):
        a plugin can never replace a core node.
        """
        node_def = node if isinstance(node, NodeDef) else NativeNodeDef(node, origin=origin)
        name = node_def.schema.node_id
        existing = self._defs.get(name)
        if existing is not None:
            self.collisions.append(Collision(name, existing.origin, node_def.origin))
            raise RegistryError(
                f"node {name!r} from {node_def.origin!r} collides with the one from {existing.origin!r}; "
                f"the first registration is kept. Rename the class in {node_def.origin!r}."
            )
        self._defs[name] = node_def
        return node_def

    def register_all(self, nodes: Iterable[type[Node] | NodeDef], *, origin: str = "core") -> None:
        for node in nodes:
            self.register(node, origin=origin)

    def add_options_source(self, source: str, provider: Callable[[], list[str]]) -> None:
        """Name a provider of combo options, e.g. ``"checkpoints"`` → files in that folder."""
        self._options[source] = provider

    def extended(self, nodes: Iterable[type[Node] | NodeDef], *, origin: str = "core") -> NodeRegistry:
        """A new registry with this one's nodes plus ``nodes`` (a name this one has already keeps
        this one's node); this one is not changed. The option sources are shared, not copied:
        a source added to either later is seen by both."""
        derived = NodeRegistry()
        derived._defs = dict(self._defs)
        derived._options = self._options
        for node in nodes:
            node_def = node if isinstance(node, NodeDef) else NativeNodeDef(node, origin=origin)
            if node_def.schema.node_id not in derived:
                derived.register(node_def)
        return derived

    # --- look-up ------------------------------------------------------------------------------
    def get(self, name: str) -> NodeDef | None:
        return self._defs.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._defs

    def __len__(self) -> int:
        return len(self._defs)

    def names(self) -> list[str]:
        return sorted(self._defs)

    def defs(self) -> list[NodeDef]:
        return [self._defs[n] for n in sorted(self._defs)]

    def suggest(self, name: str, n: int = 3) -> list[str]:
        """'Did you mean' candidates for an unknown class name."""
        lowered = {k.lower(): k for k in self._defs}
        close = difflib.get_close_matches(name.lower(), list(lowered), n=n, cutoff=0.6)
        return [lowered[c] for c in close]

    def resolve_options(self, options: DynamicOptions) -> list[str]:
        provider = self._options.get(options.source)
        if provider is None:
            return []
        try:  # a plugin's provider: its failure (even sys.exit()) leaves the combo empty
            with contained(f"the options provider {options.source!r}"):
                return list(provider())
        except Exception:
            log.exception("the options provider %r failed; its combo lists nothing", options.source)
            return []

    def object_info(self, name: str | None = None) -> dict[str, Any]:
        """ComfyUI's ``/object_info`` (all nodes) or ``/object_info/{class}`` (one, or ``{}``)."""
        if name is not None:
            node_def = self._defs.get(name)
            if node_def is None:
                return {}
            node_def.refresh()
            return {name: node_def.schema.export(self.resolve_options)}
        for node_def in self._defs.values():
            node_def.refresh()
        return export_all([d.schema for d in self.defs()], self.resolve_options)
