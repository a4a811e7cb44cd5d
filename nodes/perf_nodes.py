"""The performance nodes (issue 9) and their registration: ``register_perf(registry)``.

- ``TomePatchModel`` (``nodes/perf_tome.py``): token merging, trades quality for speed
- ``DeepCache`` (``nodes/perf_deepcache.py``): step caching, trades quality for speed
- ``KSamplerBatched`` / ``KSamplerAdvancedBatched`` (``nodes/perf_batch.py``): the samplers' batched variants, used by request
  coalescing (``engine/coalesce.py``) and usable on its own with list inputs
"""

from __future__ import annotations

from engine.node import Node
from engine.registry import NodeRegistry


def perf_nodes() -> list[type[Node]]:
    from nodes.perf_batch import KSamplerAdvancedBatched, KSamplerBatched
    from nodes.perf_deepcache import DeepCache
    from nodes.perf_tome import TomePatchModel

    return [TomePatchModel, DeepCache, KSamplerBatched, KSamplerAdvancedBatched]


def register_perf(registry: NodeRegistry) -> None:
    """Register the performance nodes that are not registered yet."""
    for node in perf_nodes():
        if node.SCHEMA.node_id not in registry:
            registry.register(node, origin="core")
