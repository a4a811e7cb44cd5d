"""Loom's node library. ``register_core`` puts every core node into a registry."""

from __future__ import annotations

from pathlib import Path

from engine.context import ModelFiles
from engine.registry import NodeRegistry


def register_core(registry: NodeRegistry, model_files: ModelFiles | None = None, input_dir: Path | None = None) -> None:
    """Register the core nodes (modules are imported here, not at package import) and the combo
    option sources: users' model files (``model_files``) and input images (``input_dir``)."""
    from nodes.cfg_patches import CFG_PATCH_NODES
    from nodes.clip_vision import CLIP_VISION_NODES
    from nodes.conditioning import CONDITIONING_NODES
    from nodes.families import family_nodes
    from nodes.image import IMAGE_NODES, register_image_options
    from nodes.ipadapter import IPADAPTER_NODES
    from nodes.latent import LATENT_NODES
    from nodes.loaders import LOADER_NODES, register_model_options
    from nodes.loaders_components import COMPONENT_LOADER_NODES
    from nodes.model_sampling_nodes import MODEL_SAMPLING_NODES
    from nodes.patches import patch_nodes
    from nodes.perf_batch import KSamplerAdvancedBatched, KSamplerBatched
    from nodes.safety import SAFETY_NODES
    from nodes.sampler_nodes import SAMPLER_NODES
    from nodes.sampling import SAMPLING_NODES
    from nodes.sampling_custom import CUSTOM_SAMPLING_NODES
    from nodes.sigmas import SIGMA_NODES
    from nodes.utility import UTILITY_NODES

    batched = [KSamplerBatched, KSamplerAdvancedBatched]  # the samplers' batching variants (coalesced jobs)
    groups = (UTILITY_NODES, LOADER_NODES, CONDITIONING_NODES, SAMPLING_NODES, batched, LATENT_NODES, IMAGE_NODES,
              CLIP_VISION_NODES, IPADAPTER_NODES, SAFETY_NODES, patch_nodes(), SAMPLER_NODES, SIGMA_NODES,
              CUSTOM_SAMPLING_NODES, CFG_PATCH_NODES, MODEL_SAMPLING_NODES, COMPONENT_LOADER_NODES, family_nodes())
    for group in groups:
        registry.register_all(group, origin="core")
    if model_files is not None:
        register_model_options(registry, model_files)
    if input_dir is not None:
        register_image_options(registry, input_dir)
