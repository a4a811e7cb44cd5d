"""MODEL patches that change how the denoiser runs, each with its node: ``TomePatchModel``
(token merging, ``tome.py``), ``DeepCache`` (step caching, ``deepcache.py``), FreeU / FreeU_V2 /
PatchModelAddDownscale (``freeu.py``), PAG / SAG (``attention_guidance.py``), ``HyperTile``, the
attention multipliers (``attention_multiply.py``), ``TorchCompileModel`` (``compile.py``),
ComfyUI's ``EasyCache`` and ``LazyCache`` (``easycache.py``) and Loom's ``FirstBlockCache`` for
transformers (``first_block_cache.py``). A patch changes the built module in ``apply`` (weights, compiled call) or acts only through
``sampling_hooks`` (``nodes.hooks``: block patches, guidance); each is off unless in the workflow."""

from __future__ import annotations

from engine.node import Node


def patch_nodes() -> list[type[Node]]:
    from nodes.patches.attention_guidance import PerturbedAttentionGuidance, SelfAttentionGuidance
    from nodes.patches.attention_multiply import (
        CLIPAttentionMultiply,
        UNetCrossAttentionMultiply,
        UNetSelfAttentionMultiply,
        UNetTemporalAttentionMultiply,
    )
    from nodes.patches.compile import TorchCompileModel
    from nodes.patches.deepcache import DeepCache
    from nodes.patches.easycache import EasyCache, LazyCache
    from nodes.patches.first_block_cache import FirstBlockCache
    from nodes.patches.freeu import FreeU, FreeU_V2, PatchModelAddDownscale
    from nodes.patches.hypertile import HyperTile
    from nodes.patches.tome import TomePatchModel

    return [
        TomePatchModel,
        DeepCache,
        FreeU,
        FreeU_V2,
        PatchModelAddDownscale,
        PerturbedAttentionGuidance,
        SelfAttentionGuidance,
        HyperTile,
        UNetSelfAttentionMultiply,
        UNetCrossAttentionMultiply,
        UNetTemporalAttentionMultiply,
        CLIPAttentionMultiply,
        TorchCompileModel,
        EasyCache,
        LazyCache,
        FirstBlockCache,
    ]
