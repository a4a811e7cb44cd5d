"""Stand-in for ComfyUI's ``comfy_execution.graph_utils``: ``ExecutionBlocker`` is Loom's own.

``ExecutionBlocker(None)`` silently stops the nodes downstream; ``ExecutionBlocker("why")`` fails
the run with that message when a node would consume it. Node expansion (``GraphBuilder``) is not
supported by Loom.
"""

from __future__ import annotations

from typing import Any

from engine.node import ExecutionBlocker


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    raise ImportError(
        f"comfy_execution.graph_utils.{name} is not provided by Loom (only ExecutionBlocker is); "
        "node expansion is not supported"
    )


__all__ = ["ExecutionBlocker"]
