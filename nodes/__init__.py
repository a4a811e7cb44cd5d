"""Loom's node library. ``register_core`` puts every core node into a registry."""

from __future__ import annotations

from engine.context import ModelFiles
from engine.registry import NodeRegistry


def register_core(registry: NodeRegistry, model_files: ModelFiles | None = None) -> None:
    """Register the core nodes (modules are imported here, not at package import) and the
    combo option sources that list users' model files."""
    from nodes.loaders import LOADER_NODES, register_model_options
    from nodes.utility import UTILITY_NODES

    for group in (UTILITY_NODES, LOADER_NODES):
        registry.register_all(group, origin="core")
    if model_files is not None:
        register_model_options(registry, model_files)
