"""The everyday IMAGE and MASK nodes of ComfyUI's core, gathered for ``register_core``."""

from __future__ import annotations

from pathlib import Path

from engine.node import Node
from engine.registry import NodeRegistry


def everyday_image_nodes() -> list[type[Node]]:
    """Crop/pad/batch/stitch, filters, compositing, resizing, files and mask nodes."""
    from nodes.image_compose import COMPOSE_NODES
    from nodes.image_files import IMAGE_FILE_NODES
    from nodes.image_filters import IMAGE_FILTER_NODES
    from nodes.image_ops import IMAGE_OPS_NODES
    from nodes.image_resize import IMAGE_RESIZE_NODES
    from nodes.mask import MASK_NODES

    return [
        *IMAGE_OPS_NODES,
        *IMAGE_FILTER_NODES,
        *COMPOSE_NODES,
        *IMAGE_RESIZE_NODES,
        *IMAGE_FILE_NODES,
        *MASK_NODES,
    ]


def register_everyday_image(registry: NodeRegistry, output_dir: Path | None = None) -> None:
    """Register the nodes, and LoadImageOutput's choices when the output folder is known."""
    from nodes.image_files import register_output_options

    registry.register_all(everyday_image_nodes(), origin="core")
    if output_dir is not None:
        register_output_options(registry, output_dir)
