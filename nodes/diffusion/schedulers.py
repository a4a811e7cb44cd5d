"""Schedulers: (model sampling, steps) -> a descending float32 sigma list, usually ending in 0.

``calculate_sigmas`` covers ComfyUI's 9 scheduler names (``SCHEDULER_NAMES``); the other functions
are what the custom-sampling scheduler nodes compute (Karras, exponential, polyexponential, VP,
Laplace, beta with alpha/beta, Align Your Steps, GITS, optimal steps, SDTurbo). ``ksampler_sigmas``
applies KSampler's rules for denoise < 1 and for the samplers that drop the penultimate sigma.
Numerics follow ComfyUI's ``comfy/samplers.py`` and ``comfy/k_diffusion/sampling.py`` (float32
torch ramps with float64 Python scalars, numpy/scipy where ComfyUI uses them).
References: Karras et al. 2022 (arXiv:2206.00364); Lee et al. 2024 (beta schedule, arXiv:2407.12173);
Sabour et al. 2024 (Align Your Steps); Chen et al. 2024 (GITS); Tiankai et al. 2024 (Laplace);
Genmo Mochi (linear-quadratic); A1111 PR 15608 (KL-optimal); bebebe666/OptimalSteps.
The AYS, GITS and optimal-steps noise levels are data: ``data/*_noise_levels.json``, each read once.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
import scipy.stats
import torch

from nodes.diffusion.model_sampling import ModelSampling
from nodes.diffusion.names import DISCARD_PENULTIMATE_SIGMA_SAMPLERS, SCHEDULER_NAMES

__all__ = ["DISCARD_PENULTIMATE_SIGMA_SAMPLERS", "SCHEDULER_NAMES", "calculate_sigmas", "ksampler_sigmas"]


class SchedulerError(ValueError):
    """A scheduler name or parameter that cannot be used; the message says what is accepted."""


def append_zero(x: torch.Tensor) -> torch.Tensor:
    return torch.cat([x, x.new_zeros([1])])


# ---------------------------------------------------------------------------------------------
# Schedules over (n, sigma_min, sigma_max)
# ---------------------------------------------------------------------------------------------


def karras(n: int, sigma_min: float, sigma_max: float, rho: float = 7.0) -> torch.Tensor:
    """Karras et al. (2022) eq. 5: uniform in sigma^(1/rho); n sigmas then 0."""
    ramp = torch.linspace(0, 1, n)
    min_inv_rho, max_inv_rho = sigma_min ** (1 / rho), sigma_max ** (1 / rho)
    return append_zero((max_inv_rho + ramp * (min_inv_rho - max_inv_rho)) ** rho)


def exponential(n: int, sigma_min: float, sigma_max: float) -> torch.Tensor:
    """Uniform in log sigma; n sigmas then 0."""
    return append_zero(torch.linspace(math.log(sigma_max), math.log(sigma_min), n).exp())


def polyexponential(n: int, sigma_min: float, sigma_max: float, rho: float = 1.0) -> torch.Tensor:
    """A polynomial ramp (power rho) in log sigma; n sigmas then 0."""
    ramp = torch.linspace(1, 0, n) ** rho
    return append_zero(torch.exp(ramp * (math.log(sigma_max) - math.log(sigma_min)) + math.log(sigma_min)))


def vp(n: int, beta_d: float = 19.9, beta_min: float = 0.1, eps_s: float = 1e-3) -> torch.Tensor:
    """The continuous VP-SDE schedule (Song et al. 2021) at t = linspace(1, eps_s, n); then 0."""
    t = torch.linspace(1, eps_s, n)
    return append_zero(torch.sqrt(torch.special.expm1(beta_d * t**2 / 2 + beta_min * t)))


def laplace(n: int, sigma_min: float, sigma_max: float, mu: float = 0.0, beta: float = 0.5) -> torch.Tensor:
    """Laplace-distributed log sigma (Tiankai et al. 2024), clamped to [sigma_min, sigma_max].
    As in ComfyUI it returns n sigmas and no trailing 0."""
    x = torch.linspace(0, 1, n)
    lmb = mu - beta * torch.sign(0.5 - x) * torch.log(1 - 2 * torch.abs(0.5 - x) + 1e-5)
    return torch.clamp(torch.exp(lmb), min=sigma_min, max=sigma_max)


def kl_optimal(n: int, sigma_min: float, sigma_max: float) -> torch.Tensor:
    """tan of a linear ramp between atan(sigma_max) and atan(sigma_min); n sigmas then 0.
    (For n = 1 ComfyUI divides by zero; Loom returns [sigma_max, 0].)"""
    w = torch.arange(n, dtype=torch.float).div_(max(n - 1, 1))
    sigmas = w.new_zeros(n + 1)
    sigmas[:-1] = (w * math.atan(sigma_min) + (1 - w) * math.atan(sigma_max)).tan_()
    return sigmas


# ---------------------------------------------------------------------------------------------
# Schedules over the model's sigma table
# ---------------------------------------------------------------------------------------------


def simple(model_sampling: ModelSampling, steps: int) -> torch.Tensor:
    """Every (len(table) / steps)-th training sigma from the top (floor of the index), then 0."""
    table = model_sampling.sigmas
    stride = len(table) / steps
    values = [float(table[-(1 + int(i * stride))]) for i in range(steps)]
    return torch.FloatTensor([*values, 0.0])


def ddim_uniform(model_sampling: ModelSampling, steps: int) -> torch.Tensor:
    """Training sigmas at indices 1, 1 + s, 1 + 2s, ... (s = len(table) // steps), reversed, then 0
    (no 0 is added when the table's entry 1 is already ~0)."""
    table = model_sampling.sigmas
    values: list[float] = []
    if math.isclose(float(table[1]), 0, abs_tol=0.00001):
        steps += 1
    else:
        values = [0.0]
    stride = max(len(table) // steps, 1)
    for index in range(1, len(table), stride):
        values.append(float(table[index]))
    return torch.FloatTensor(values[::-1])


def normal(model_sampling: ModelSampling, steps: int, sgm: bool = False) -> torch.Tensor:
    """Sigmas at timesteps uniform between timestep(sigma_max) and timestep(sigma_min), then 0.
    ``sgm=True`` (sgm_uniform) takes steps + 1 points and drops the last instead."""
    ms = model_sampling
    start, end = ms.timestep(ms.sigma_max), ms.timestep(ms.sigma_min)
    append = True
    if sgm:
        timesteps = torch.linspace(start, end, steps + 1)[:-1]
    else:
        if math.isclose(float(ms.sigma(end)), 0, abs_tol=0.00001):
            steps += 1
            append = False
        timesteps = torch.linspace(start, end, steps)
    values = [float(ms.sigma(t)) for t in timesteps]
    return torch.FloatTensor(values + [0.0] if append else values)


def beta(model_sampling: ModelSampling, steps: int, alpha: float = 0.6, beta: float = 0.6) -> torch.Tensor:
    """Training sigmas at timesteps rint(Beta(alpha, beta).ppf(1 - i/steps) * (T - 1)), consecutive
    duplicates dropped, then 0 (Lee et al. 2024)."""
    table = model_sampling.sigmas
    total = len(table) - 1
    ts = np.rint(scipy.stats.beta.ppf(1 - np.linspace(0, 1, steps, endpoint=False), alpha, beta) * total)
    values: list[float] = []
    last = -1.0
    for t in ts:
        if t != last:
            values.append(float(table[int(t)]))
        last = t
    return torch.FloatTensor([*values, 0.0])


def linear_quadratic(
    model_sampling: ModelSampling, steps: int, threshold_noise: float = 0.025, linear_steps: int | None = None
) -> torch.Tensor:
    """Mochi's schedule: linear to ``threshold_noise`` for half the steps, then quadratic to 1,
    flipped and scaled by sigma_max."""
    if steps == 1:
        schedule = [1.0, 0.0]
    else:
        linear_steps = steps // 2 if linear_steps is None else linear_steps
        linear = [i * threshold_noise / linear_steps for i in range(linear_steps)]
        step_diff = linear_steps - threshold_noise * steps
        quadratic_steps = steps - linear_steps
        quadratic_coef = step_diff / (linear_steps * quadratic_steps**2)
        linear_coef = threshold_noise / linear_steps - 2 * step_diff / (quadratic_steps**2)
        const = quadratic_coef * (linear_steps**2)
        quadratic = [quadratic_coef * (i**2) + linear_coef * i + const for i in range(linear_steps, steps)]
        schedule = [1.0 - v for v in [*linear, *quadratic, 1.0]]
    return torch.FloatTensor(schedule) * model_sampling.sigma_max.cpu()


def sd_turbo(model_sampling: ModelSampling, steps: int, denoise: float = 1.0) -> torch.Tensor:
    """SDTurboScheduler: timesteps 999, 899, ..., 99 starting at 10 - int(10 * denoise), then 0."""
    start = 10 - int(10 * denoise)
    timesteps = torch.flip(torch.arange(1, 11) * 100 - 1, (0,))[start : start + steps]
    return append_zero(model_sampling.sigma(timesteps))


_TABLE_SCHEDULERS: dict[str, Callable[[ModelSampling, int], torch.Tensor]] = {
    "simple": simple,
    "sgm_uniform": lambda ms, steps: normal(ms, steps, sgm=True),
    "ddim_uniform": ddim_uniform,
    "beta": beta,
    "normal": normal,
    "linear_quadratic": linear_quadratic,
}
_RANGE_SCHEDULERS: dict[str, Callable[[int, float, float], torch.Tensor]] = {
    "karras": karras,
    "exponential": exponential,
    "kl_optimal": kl_optimal,
}


def calculate_sigmas(model_sampling: ModelSampling, name: str, steps: int) -> torch.Tensor:
    """The sigma schedule of scheduler ``name`` with ``steps`` steps (float32, CPU)."""
    if steps < 1:
        raise SchedulerError(f"steps must be at least 1, got {steps}")
    if name in _TABLE_SCHEDULERS:
        return _TABLE_SCHEDULERS[name](model_sampling, steps)
    if name in _RANGE_SCHEDULERS:
        return _RANGE_SCHEDULERS[name](
            steps, float(model_sampling.sigma_min), float(model_sampling.sigma_max)
        )
    raise SchedulerError(f"unknown scheduler {name!r}; expected one of {', '.join(SCHEDULER_NAMES)}")


def ksampler_sigmas(
    model_sampling: ModelSampling, scheduler: str, sampler_name: str, steps: int, denoise: float | None = 1.0
) -> torch.Tensor:
    """The sigmas ComfyUI's KSampler uses: for denoise < 1, int(steps / denoise) steps of which the
    last steps + 1 sigmas are kept (denoise <= 0: no sigmas); for dpm_2, dpm_2_ancestral, uni_pc and
    uni_pc_bh2, one extra step whose penultimate sigma is dropped."""

    def full(n: int) -> torch.Tensor:
        if sampler_name in DISCARD_PENULTIMATE_SIGMA_SAMPLERS:
            sigmas = calculate_sigmas(model_sampling, scheduler, n + 1)
            return torch.cat([sigmas[:-2], sigmas[-1:]])
        return calculate_sigmas(model_sampling, scheduler, n)

    if denoise is None or denoise > 0.9999:
        return full(steps)
    if denoise <= 0.0:
        return torch.FloatTensor([])
    return full(int(steps / denoise))[-(steps + 1) :]


def basic_scheduler_sigmas(
    model_sampling: ModelSampling, scheduler: str, steps: int, denoise: float = 1.0
) -> torch.Tensor:
    """BasicScheduler: like KSampler (int(steps / denoise) steps, keep the last steps + 1) but
    without the sampler-specific penultimate drop."""
    if denoise >= 1.0:
        return calculate_sigmas(model_sampling, scheduler, steps)
    if denoise <= 0.0:
        return torch.FloatTensor([])
    return calculate_sigmas(model_sampling, scheduler, int(steps / denoise))[-(steps + 1) :]


# ---------------------------------------------------------------------------------------------
# Tabulated schedules (AYS, GITS, optimal steps)
# ---------------------------------------------------------------------------------------------


def loglinear_interp(values: Sequence[float], num_steps: int) -> np.ndarray:
    """Resample a decreasing sequence to ``num_steps`` points, linearly in log space (AYS how-to)."""
    xs = np.linspace(0, 1, len(values))
    ys = np.log(np.asarray(values, dtype=np.float64)[::-1])
    new_ys = np.interp(np.linspace(0, 1, num_steps), xs, ys)
    return np.exp(new_ys)[::-1].copy()


DATA = Path(__file__).parent / "data"
"""The tabulated noise levels: ``<table>.json`` holds ``{"source": ..., "levels": {model type: levels}}``."""

AYS_MODEL_TYPES: tuple[str, ...] = ("SD1", "SDXL", "SVD")
"""AlignYourStepsScheduler's model types: the keys of ``data/ays_noise_levels.json``."""

OPTIMAL_STEPS_MODEL_TYPES: tuple[str, ...] = ("FLUX", "Wan", "Chroma")
"""OptimalStepsScheduler's model types: the keys of ``data/optimal_steps_noise_levels.json``."""


@functools.cache
def noise_level_table(table: str) -> Mapping[str, Any]:
    """``data/<table>.json``'s ``levels``, read once (read-only; rows are tuples)."""
    path = DATA / f"{table}.json"
    try:
        levels = json.loads(path.read_text(encoding="utf-8"))["levels"]
    except (OSError, ValueError, KeyError) as error:
        raise SchedulerError(
            f"the noise-level table {path} could not be read ({error}); expected a JSON object with a "
            f'"levels" entry, shipped with Loom; reinstall Loom or restore the file'
        ) from error
    return MappingProxyType({key: _frozen(rows) for key, rows in levels.items()})


def _frozen(rows: Any) -> Any:
    """A JSON list (of lists) of numbers as tuples, so the cached table cannot be changed."""
    return tuple(_frozen(row) for row in rows) if isinstance(rows, list) else rows


def ays_noise_levels() -> Mapping[str, tuple[float, ...]]:
    """Align Your Steps 10-step noise levels by model type (Sabour et al. 2024)."""
    return noise_level_table("ays_noise_levels")


def optimal_steps_noise_levels() -> Mapping[str, tuple[float, ...]]:
    """Optimal Stepsize noise levels by flow model type (bebebe666/OptimalSteps)."""
    return noise_level_table("optimal_steps_noise_levels")


@functools.cache
def gits_noise_levels() -> Mapping[float, tuple[tuple[float, ...], ...]]:
    """GITS noise levels (Chen et al. 2024, arXiv:2405.11326; zju-pi/diff-sampler) by coefficient
    0.80-1.50: the SD1.5 sigma schedules of 2..20 steps (``[coeff][steps - 2]``, steps + 1 values)."""
    rows_by_key = noise_level_table("gits_noise_levels")
    return MappingProxyType({float(key): rows for key, rows in rows_by_key.items()})


def _tabulated(levels: Sequence[float], steps: int, denoise: float) -> torch.Tensor:
    """The shared rule of the tabulated schedulers: resample to steps + 1 values if needed, keep the
    last round(steps * denoise) + 1, set the last to 0 (denoise <= 0: no sigmas)."""
    total = steps
    if denoise < 1.0:
        if denoise <= 0.0:
            return torch.FloatTensor([])
        total = round(steps * denoise)
    sigmas = list(levels) if steps + 1 == len(levels) else list(loglinear_interp(levels, steps + 1))
    sigmas = sigmas[-(total + 1) :]
    sigmas[-1] = 0
    return torch.FloatTensor(sigmas)


def align_your_steps(model_type: str, steps: int, denoise: float = 1.0) -> torch.Tensor:
    """AlignYourStepsScheduler for ``model_type`` SD1, SDXL or SVD."""
    levels = ays_noise_levels()
    if model_type not in levels:
        raise SchedulerError(f"unknown AYS model type {model_type!r}; expected one of {', '.join(levels)}")
    return _tabulated(levels[model_type], steps, denoise)


def optimal_steps(model_type: str, steps: int, denoise: float = 1.0) -> torch.Tensor:
    """OptimalStepsScheduler for ``model_type`` FLUX, Wan or Chroma."""
    levels = optimal_steps_noise_levels()
    if model_type not in levels:
        raise SchedulerError(
            f"unknown optimal-steps model type {model_type!r}; expected one of {', '.join(levels)}"
        )
    return _tabulated(levels[model_type], steps, denoise)


def gits(coeff: float, steps: int, denoise: float = 1.0) -> torch.Tensor:
    """GITSScheduler: the tabulated schedule for ``coeff`` (0.80-1.50 in 0.05 steps) and 2-20 steps;
    more steps resample the 20-step row log-linearly."""
    table = gits_noise_levels()
    key = round(coeff, 2)
    if key not in table:
        raise SchedulerError(f"GITS coeff must be one of 0.80, 0.85, ..., 1.50; got {coeff}")
    if steps < 2:
        raise SchedulerError(f"GITS needs at least 2 steps, got {steps}")
    rows = table[key]
    levels = rows[steps - 2] if steps <= 20 else rows[-1]
    return _tabulated(levels, steps, denoise)
