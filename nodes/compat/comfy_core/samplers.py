"""Stand-in for ComfyUI's ``comfy.samplers``: the sampler and scheduler names Loom's KSampler takes.

Packs read ``comfy.samplers.KSampler.SAMPLERS`` / ``SCHEDULERS`` to declare their own combo inputs,
so these are Loom's lists (``nodes.diffusion.names``), in ComfyUI's order.
"""

from __future__ import annotations

from typing import Any

from nodes.diffusion.names import KSAMPLER_NAMES, SAMPLER_NAMES, SCHEDULER_NAMES

SCHEDULER_HANDLERS: dict[str, Any] = dict.fromkeys(SCHEDULER_NAMES)


class KSampler:
    """ComfyUI's ``KSampler`` class, for its name lists (sampling runs through Loom's nodes)."""

    SCHEDULERS = list(SCHEDULER_NAMES)
    SAMPLERS = list(SAMPLER_NAMES)
    DISCARD_PENULTIMATE_SIGMA_SAMPLERS = {"dpm_2", "dpm_2_ancestral", "uni_pc", "uni_pc_bh2"}


__all__ = ["KSAMPLER_NAMES", "SAMPLER_NAMES", "SCHEDULER_NAMES", "SCHEDULER_HANDLERS", "KSampler"]
