"""Loom's node library. ``register_core`` puts every core node into a registry.

Plugins written for ComfyUI ``import nodes`` expecting ComfyUI's module of that name; the names they
read that Loom's package lacks go to the installed plugin shim (:func:`__getattr__`,
``nodes/compat/shim.py``)."""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from engine.context import ModelFiles
from engine.registry import NodeRegistry
from nodes.core.options import OptionSources

# The stations whose packages declare nodes (``NODE_MODULES`` in each ``__init__``), in registration
# order. Nothing else registers core nodes.
STATIONS: tuple[str, ...] = (
    "text",
    "load",
    "encode",
    "control",
    "sample",
    "patches",
    "latent",
    "image",
    "family_nodes",
)


def station_modules() -> Iterator[types.ModuleType]:
    """Every module that declares core nodes, station by station (imported here, not at package import)."""
    for station in STATIONS:
        package = importlib.import_module(f"nodes.{station}")
        for name in package.NODE_MODULES:
            yield importlib.import_module(f"nodes.{station}.{name}")


def register_core(
    registry: NodeRegistry,
    model_files: ModelFiles | None = None,
    input_dir: Path | None = None,
    output_dir: Path | None = None,
) -> None:
    """Register the core nodes of every station and the combo option sources: users' model files
    (``model_files``), input images and latents (``input_dir``) and output images (``output_dir``)."""
    sources = OptionSources(model_files, input_dir, output_dir)
    for module in station_modules():
        registry.register_all(module.NODES, origin="core")
        register_options = getattr(module, "register_options", None)
        if register_options is not None:
            register_options(registry, sources)


def __getattr__(name: str) -> Any:
    """A name this package lacks: while a plugin shim is installed it answers (a Loom submodule, a
    name of ComfyUI's ``nodes`` module Loom provides, or an error naming what is absent); otherwise
    ``AttributeError``.

    The installed shim is found on ``sys.meta_path`` (its internal-module blocker has
    ``answer_nodes_attribute``), so this package keeps no state of its own."""
    if not name.startswith("__"):
        for finder in sys.meta_path:
            answer = getattr(finder, "answer_nodes_attribute", None)
            if answer is not None:
                return answer(name)
    raise AttributeError(f"module 'nodes' has no attribute {name!r}")
