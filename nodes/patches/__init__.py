"""MODEL patches that change how the denoiser runs, each with its node: ``TomePatchModel``
(token merging, ``tome.py``), ``DeepCache`` (UNet step caching, ``deepcache.py``), ComfyUI's
``EasyCache`` and ``LazyCache`` (``easycache.py``) and Loom's ``FirstBlockCache`` for transformers
(``first_block_cache.py``). A patch changes
the built module in ``apply`` and takes part in sampling through ``sampling_hooks``
(``nodes.hooks``); both trade a little quality for speed and are off unless in the workflow."""

from __future__ import annotations

from engine.node import Node


def patch_nodes() -> list[type[Node]]:
    from nodes.patches.deepcache import DeepCache
    from nodes.patches.easycache import EasyCache, LazyCache
    from nodes.patches.first_block_cache import FirstBlockCache
    from nodes.patches.tome import TomePatchModel

    return [TomePatchModel, DeepCache, EasyCache, LazyCache, FirstBlockCache]
