"""Loom's node library. ``register_core`` puts every core node into a registry.

Plugins written for ComfyUI ``import nodes`` expecting ComfyUI's module of that name; the names they
read that Loom's package lacks go to the installed plugin shim (:func:`__getattr__`,
``nodes/compat/shim.py``)."""

from __future__ import annotations

import sys
import types
from pathlib import Path

from engine.context import ModelFiles
from engine.registry import NodeRegistry


def register_core(
    registry: NodeRegistry,
    model_files: ModelFiles | None = None,
    input_dir: Path | None = None,
    output_dir: Path | None = None,
) -> None:
    """Register the core nodes (modules are imported here, not at package import) and the combo
    option sources: users' model files (``model_files``), input images (``input_dir``) and output
    images (``output_dir``, LoadImageOutput)."""
    from nodes.cfg_patches import CFG_PATCH_NODES
    from nodes.clip_vision import CLIP_VISION_NODES
    from nodes.conditioning import CONDITIONING_NODES
    from nodes.conditioning_ops import CONDITIONING_OPS_NODES
    from nodes.controlnet import CONTROLNET_NODES
    from nodes.families import family_nodes
    from nodes.gligen import GLIGEN_NODES
    from nodes.hypernetwork import HYPERNETWORK_NODES
    from nodes.image import IMAGE_NODES, register_image_options
    from nodes.image_nodes import register_everyday_image
    from nodes.ip2p import IP2P_NODES
    from nodes.ipadapter import IPADAPTER_NODES
    from nodes.latent import LATENT_NODES
    from nodes.latent_batch import register_everyday
    from nodes.loaders import LOADER_NODES, register_model_options
    from nodes.loaders_components import COMPONENT_LOADER_NODES
    from nodes.lora_extract import LORA_EXTRACT_NODES
    from nodes.model_merge import MERGE_NODES
    from nodes.model_patch import MODEL_PATCH_NODES
    from nodes.model_sampling_nodes import MODEL_SAMPLING_NODES
    from nodes.model_save import SAVE_NODES
    from nodes.patches import patch_nodes
    from nodes.perf_batch import KSamplerAdvancedBatched, KSamplerBatched
    from nodes.preprocessors import PREPROCESSOR_NODES
    from nodes.quant.nodes import QUANT_NODES
    from nodes.safety import SAFETY_NODES
    from nodes.sampler_nodes import SAMPLER_NODES
    from nodes.sampling import SAMPLING_NODES
    from nodes.sampling_custom import CUSTOM_SAMPLING_NODES
    from nodes.sigmas import SIGMA_NODES
    from nodes.style_model import STYLE_MODEL_NODES
    from nodes.unclip import UNCLIP_NODES
    from nodes.upscale_model import UPSCALE_NODES
    from nodes.utility import UTILITY_NODES

    batched = [KSamplerBatched, KSamplerAdvancedBatched]  # the samplers' batching variants (coalesced jobs)
    groups = (
        UTILITY_NODES,
        LOADER_NODES,
        CONDITIONING_NODES,
        SAMPLING_NODES,
        batched,
        LATENT_NODES,
        IMAGE_NODES,
        CLIP_VISION_NODES,
        IPADAPTER_NODES,
        SAFETY_NODES,
        patch_nodes(),
        SAMPLER_NODES,
        SIGMA_NODES,
        CUSTOM_SAMPLING_NODES,
        CFG_PATCH_NODES,
        MODEL_SAMPLING_NODES,
        UPSCALE_NODES,
        CONTROLNET_NODES,
        PREPROCESSOR_NODES,
        CONDITIONING_OPS_NODES,
        MERGE_NODES,
        SAVE_NODES,
        COMPONENT_LOADER_NODES,
        UNCLIP_NODES,
        IP2P_NODES,
        LORA_EXTRACT_NODES,
        STYLE_MODEL_NODES,
        QUANT_NODES,
        HYPERNETWORK_NODES,
        GLIGEN_NODES,
        MODEL_PATCH_NODES,
        family_nodes(),
    )
    for group in groups:
        registry.register_all(group, origin="core")
    # the everyday latent and text nodes: nodes/latent_ops.py, latent_operations.py, latent_batch.py,
    # latent_files.py (with LoadLatent's file choices) and text_ops.py
    register_everyday(registry, input_dir)
    register_everyday_image(registry, output_dir)  # issue 17: image/mask nodes (nodes/image_nodes.py)
    if model_files is not None:
        register_model_options(registry, model_files)
    if input_dir is not None:
        register_image_options(registry, input_dir)


def __getattr__(name: str) -> types.ModuleType:
    """A name this package lacks: while a plugin shim is installed it answers (a Loom submodule, or an
    error explaining that ComfyUI's ``nodes`` module is absent); otherwise ``AttributeError``.

    The installed shim is found on ``sys.meta_path`` (its internal-module blocker has
    ``answer_nodes_attribute``), so this package keeps no state of its own."""
    if not name.startswith("__"):
        for finder in sys.meta_path:
            answer = getattr(finder, "answer_nodes_attribute", None)
            if answer is not None:
                module: types.ModuleType = answer(name)
                return module
    raise AttributeError(f"module 'nodes' has no attribute {name!r}")
