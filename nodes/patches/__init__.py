"""MODEL patches that change how the denoiser runs, each with its node: ``TomePatchModel``
(token merging, ``tome.py``), ``DeepCache`` (step caching, ``deepcache.py``), FreeU / FreeU_V2 /
PatchModelAddDownscale (``freeu.py``), PAG / SAG (``attention_guidance.py``), ``HyperTile``, the
attention multipliers (``attention_multiply.py``), ``TorchCompileModel`` (``compile.py``),
ComfyUI's ``EasyCache`` and ``LazyCache`` (``easycache.py``), the video CFG ramps (``video_cfg.py``), the device and attention-backend choices (``placement.py``) and Loom's ``FirstBlockCache`` for
transformers (``first_block_cache.py``). A patch changes the built module in ``apply`` (weights, compiled call) or acts only through
``sampling_hooks`` (``nodes.core.sampling_hooks``: block patches, guidance); each is off unless in the workflow."""

# The modules of this station that declare nodes (each has ``NODES``), in registration order.
NODE_MODULES: tuple[str, ...] = (
    "tome",
    "deepcache",
    "freeu",
    "attention_guidance",
    "hypertile",
    "attention_multiply",
    "compile",
    "easycache",
    "first_block_cache",
    "guidance",
    "cfg_schedule",
    "hypernetwork",
    "video_cfg",
    "placement",
)
