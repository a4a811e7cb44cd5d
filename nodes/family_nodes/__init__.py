"""ComfyUI's family-specific nodes (Flux, Flux.2, SD3, Z-Image, Qwen-Image, Wan video), over the model layer in
nodes/families. A family's nodes are a module here that declares ``NODES``: the station finds it
(``NODE_MODULES``, read through the package's ``__getattr__``), nothing lists it."""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any


def node_modules() -> tuple[str, ...]:
    """The modules of this station that declare nodes (each has ``NODES``), by name."""
    names = sorted(info.name for info in pkgutil.iter_modules(__path__) if not info.ispkg)
    return tuple(name for name in names if hasattr(importlib.import_module(f"{__name__}.{name}"), "NODES"))


def __getattr__(name: str) -> Any:
    if name == "NODE_MODULES":
        return node_modules()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
