"""Loom's node library. ``register_core`` puts every core node into a registry."""

from __future__ import annotations

from typing import Any

from engine.registry import NodeRegistry


def register_core(registry: NodeRegistry, model_files: Any = None) -> None:
    """Register the core nodes (modules are imported here, not at package import) and the
    combo option sources that list users' model files."""
    from nodes.utility import UTILITY_NODES

    registry.register_all(UTILITY_NODES, origin="core")
