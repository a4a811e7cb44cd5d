"""ComfyUI's sampler and scheduler names mapped onto diffusers' schedulers, and seeded noise.

``sampler_name`` picks a diffusers scheduler class (the stepping rule); ``scheduler`` picks how
the noise levels are spaced, expressed as that class's config (``timestep_spacing``,
``use_karras_sigmas``...) or, for ``ays``, as explicit sigmas:

==============  ===========================================================================
scheduler       diffusers equivalent
==============  ===========================================================================
normal          ``timestep_spacing="linspace"`` (ComfyUI: linear in timestep from 999 to 0)
karras          ``use_karras_sigmas=True`` (Karras et al. 2022, rho 7)
exponential     ``use_exponential_sigmas=True`` (log-linear sigmas)
sgm_uniform     ``timestep_spacing="trailing"``
simple          ``timestep_spacing="trailing"`` (ComfyUI takes every n-th training sigma from
                the end, which is the trailing spacing)
ddim_uniform    ``timestep_spacing="leading"``, ``steps_offset=1``
beta            ``use_beta_sigmas=True`` (Lee et al. 2024, alpha = beta = 0.6; needs scipy)
ays             Align Your Steps sigma tables (Sabour et al. 2024, NVIDIA's published 10-step
                tables for SD1.5 and SDXL) log-linearly interpolated to the step count
==============  ===========================================================================

Not every class accepts every spacing (e.g. ``euler_ancestral`` has no Karras sigmas); such a
pair raises :class:`SamplerError` naming the schedulers that do work with that sampler.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from diffusers import (
    DDIMScheduler,
    DPMSolverMultistepScheduler,
    EulerAncestralDiscreteScheduler,
    EulerDiscreteScheduler,
    HeunDiscreteScheduler,
    KDPM2AncestralDiscreteScheduler,
    KDPM2DiscreteScheduler,
    LCMScheduler,
    LMSDiscreteScheduler,
    UniPCMultistepScheduler,
)
from diffusers.schedulers.scheduling_utils import SchedulerMixin


class SamplerError(ValueError):
    """A sampler/scheduler choice that cannot run; the message says which ones can."""


@dataclass(frozen=True)
class SamplerSpec:
    cls: type[Any]
    config: Mapping[str, Any]
    ancestral: bool = False  # draws fresh noise every step (uses the per-item generators)


_SAMPLERS: dict[str, SamplerSpec] = {
    "euler": SamplerSpec(EulerDiscreteScheduler, {}),
    "euler_ancestral": SamplerSpec(EulerAncestralDiscreteScheduler, {}, ancestral=True),
    "heun": SamplerSpec(HeunDiscreteScheduler, {}),
    "dpm_2": SamplerSpec(KDPM2DiscreteScheduler, {}),
    "dpm_2_ancestral": SamplerSpec(KDPM2AncestralDiscreteScheduler, {}, ancestral=True),
    "lms": SamplerSpec(LMSDiscreteScheduler, {}),
    "dpmpp_2m": SamplerSpec(
        DPMSolverMultistepScheduler, {"algorithm_type": "dpmsolver++", "solver_order": 2}
    ),
    "dpmpp_2m_sde": SamplerSpec(
        DPMSolverMultistepScheduler, {"algorithm_type": "sde-dpmsolver++", "solver_order": 2}, ancestral=True
    ),
    "ddim": SamplerSpec(DDIMScheduler, {"set_alpha_to_one": False, "clip_sample": False}),
    "uni_pc": SamplerSpec(UniPCMultistepScheduler, {}),
    "uni_pc_bh2": SamplerSpec(UniPCMultistepScheduler, {"solver_type": "bh2"}),
    "lcm": SamplerSpec(LCMScheduler, {"set_alpha_to_one": False, "clip_sample": False}),
}
if importlib.util.find_spec("torchsde") is not None:  # DPMSolverSDEScheduler needs its Brownian tree
    from diffusers import DPMSolverSDEScheduler

    _SAMPLERS["dpmpp_sde"] = SamplerSpec(DPMSolverSDEScheduler, {}, ancestral=True)

SAMPLER_NAMES: tuple[str, ...] = tuple(_SAMPLERS)

_SPACING: dict[str, dict[str, Any]] = {
    "normal": {"timestep_spacing": "linspace"},
    "karras": {"timestep_spacing": "linspace", "use_karras_sigmas": True},
    "exponential": {"timestep_spacing": "linspace", "use_exponential_sigmas": True},
    "sgm_uniform": {"timestep_spacing": "trailing"},
    "simple": {"timestep_spacing": "trailing"},
    "ddim_uniform": {"timestep_spacing": "leading", "steps_offset": 1},
    "beta": {"timestep_spacing": "linspace", "use_beta_sigmas": True},
    "ays": {"timestep_spacing": "linspace"},
}
if importlib.util.find_spec("scipy") is None:  # diffusers computes beta sigmas with scipy.stats
    del _SPACING["beta"]
SCHEDULER_NAMES: tuple[str, ...] = tuple(_SPACING)

# Align Your Steps: the 10-step sigma tables are the families' (``family.sampling.ays_sigmas``).


def ays_sigmas(table: Sequence[float], steps: int) -> list[float]:
    """An AYS table log-linearly interpolated to ``steps + 1`` sigmas, ending at 0 (as ComfyUI)."""
    if len(table) == steps + 1:
        sigmas = list(table)
    else:
        xs = np.linspace(0.0, 1.0, len(table))
        ys = np.log(np.asarray(table[::-1], dtype=np.float64))
        new = np.exp(np.interp(np.linspace(0.0, 1.0, steps + 1), xs, ys))[::-1]
        sigmas = [float(s) for s in new]
    sigmas[-1] = 0.0
    return sigmas


def _accepts(cls: type[Any], key: str) -> bool:
    import inspect

    return key in inspect.signature(cls.__init__).parameters


def _set_timesteps_accepts(cls: type[Any], key: str) -> bool:
    import inspect

    return key in inspect.signature(cls.set_timesteps).parameters  # type: ignore[attr-defined]


def compatible_schedulers(sampler_name: str) -> list[str]:
    """Scheduler names that work with ``sampler_name``."""
    cls = _SAMPLERS[sampler_name].cls
    ok = []
    for name, extra in _SPACING.items():
        if name == "ays":  # explicit sigmas (Euler) or explicit integer timesteps
            if cls is EulerDiscreteScheduler or _set_timesteps_accepts(cls, "timesteps"):
                ok.append(name)
        elif all(_accepts(cls, k) for k in extra):
            ok.append(name)
    return ok


def make_scheduler(sampler_name: str, scheduler_name: str, base_config: Mapping[str, Any]) -> SchedulerMixin:
    """A fresh diffusers scheduler for a ComfyUI sampler/scheduler pair.

    ``base_config`` is the model's scheduler config (betas, ``prediction_type``, ...); keys the
    class does not take are dropped.
    """
    spec = _SAMPLERS.get(sampler_name)
    if spec is None:
        raise SamplerError(f"unknown sampler_name {sampler_name!r}; expected one of {list(SAMPLER_NAMES)}")
    if scheduler_name not in _SPACING:
        raise SamplerError(f"unknown scheduler {scheduler_name!r}; expected one of {list(SCHEDULER_NAMES)}")
    if scheduler_name not in compatible_schedulers(sampler_name):
        raise SamplerError(
            f"scheduler {scheduler_name!r} does not work with sampler {sampler_name!r}; "
            f"pick one of {compatible_schedulers(sampler_name)} or another sampler"
        )
    wanted = {**base_config, **spec.config, **_SPACING[scheduler_name]}
    config = {k: v for k, v in wanted.items() if _accepts(spec.cls, k)}
    return spec.cls.from_config(config)  # type: ignore[attr-defined,no-any-return]


def is_ancestral(sampler_name: str) -> bool:
    return _SAMPLERS[sampler_name].ancestral


def set_schedule(
    scheduler: SchedulerMixin, steps: int, scheduler_name: str, ays_table: Sequence[float] | None
) -> None:
    """``scheduler.set_timesteps`` for ``steps`` steps; ``ays`` passes explicit sigmas or timesteps."""
    sched: Any = scheduler
    if scheduler_name != "ays":
        sched.set_timesteps(steps)
        return
    if ays_table is None:
        raise SamplerError("scheduler 'ays' has no Align Your Steps table for this model family; pick karras")
    sigmas = ays_sigmas(ays_table, steps)
    if isinstance(scheduler, EulerDiscreteScheduler):
        sched.set_timesteps(sigmas=sigmas)
        return
    alphas = sched.alphas_cumprod.double().numpy()
    log_train = np.log(((1 - alphas) / alphas) ** 0.5)  # increasing with t
    ts = np.interp(np.log(np.asarray(sigmas[:-1])), log_train, np.arange(len(log_train)))
    timesteps = sorted({int(round(t)) for t in ts}, reverse=True)
    sched.set_timesteps(timesteps=timesteps)


def make_noise(seed: int, shape: Sequence[int], batch_index: Sequence[int] | None = None) -> torch.Tensor:
    """Initial noise [B, C, h, w] from a CPU generator seeded by ``seed``.

    Item ``i`` of a batch is the ``i``-th draw of one item's shape from that generator, so batch
    item ``k`` equals item ``k`` of any larger batch with the same seed; a latent carrying
    ``batch_index`` (ComfyUI's convention) gets the draws of those indices.
    """
    indices = list(batch_index) if batch_index is not None else list(range(shape[0]))
    if len(indices) != shape[0]:
        raise SamplerError(f"batch_index has {len(indices)} entries for a batch of {shape[0]}")
    generator = torch.Generator("cpu").manual_seed(int(seed))
    item_shape = [1, *shape[1:]]
    draws = [torch.randn(item_shape, generator=generator) for _ in range(max(indices) + 1)]
    return torch.cat([draws[i] for i in indices])


def step_generators(seed: int, batch_index: Sequence[int]) -> list[torch.Generator]:
    """One CPU generator per batch item for the per-step noise of ancestral/SDE samplers."""
    return [torch.Generator("cpu").manual_seed((int(seed) + 1 + i * 7919) % 2**64) for i in batch_index]
