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
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

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


AYS_NOISE_LEVELS: dict[str, list[float]] = {
    "SD1": [
        14.6146412293,
        6.4745760956,
        3.8636745985,
        2.6946151520,
        1.8841921177,
        1.3943805092,
        0.9642583904,
        0.6523686016,
        0.3977456272,
        0.1515232662,
        0.0291671582,
    ],
    "SDXL": [
        14.6146412293,
        6.3184485287,
        3.7681790315,
        2.1811480769,
        1.3405244945,
        0.8620721141,
        0.5550693289,
        0.3798540708,
        0.2332364134,
        0.1114188177,
        0.0291671582,
    ],
    "SVD": [700.00, 54.5, 15.886, 7.977, 4.248, 1.789, 0.981, 0.403, 0.173, 0.034, 0.002],
}
"""Align Your Steps 10-step noise levels (Sabour et al. 2024)."""

OPTIMAL_STEPS_NOISE_LEVELS: dict[str, list[float]] = {
    "FLUX": [0.9968, 0.9886, 0.9819, 0.975, 0.966, 0.9471, 0.9158, 0.8287, 0.5512, 0.2808, 0.001],
    "Wan": [
        1.0,
        0.997,
        0.995,
        0.993,
        0.991,
        0.989,
        0.987,
        0.985,
        0.98,
        0.975,
        0.973,
        0.968,
        0.96,
        0.946,
        0.927,
        0.902,
        0.864,
        0.776,
        0.539,
        0.208,
        0.001,
    ],
    "Chroma": [
        0.992,
        0.99,
        0.988,
        0.985,
        0.982,
        0.978,
        0.973,
        0.968,
        0.961,
        0.953,
        0.943,
        0.931,
        0.917,
        0.9,
        0.881,
        0.858,
        0.832,
        0.802,
        0.769,
        0.731,
        0.69,
        0.646,
        0.599,
        0.55,
        0.501,
        0.451,
        0.402,
        0.355,
        0.311,
        0.27,
        0.232,
        0.199,
        0.169,
        0.143,
        0.12,
        0.101,
        0.084,
        0.07,
        0.058,
        0.048,
        0.001,
    ],
}
"""Optimal Stepsize noise levels (bebebe666/OptimalSteps) for flow models."""


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
    if model_type not in AYS_NOISE_LEVELS:
        raise SchedulerError(
            f"unknown AYS model type {model_type!r}; expected one of {', '.join(AYS_NOISE_LEVELS)}"
        )
    return _tabulated(AYS_NOISE_LEVELS[model_type], steps, denoise)


def optimal_steps(model_type: str, steps: int, denoise: float = 1.0) -> torch.Tensor:
    """OptimalStepsScheduler for ``model_type`` FLUX, Wan or Chroma."""
    if model_type not in OPTIMAL_STEPS_NOISE_LEVELS:
        raise SchedulerError(
            f"unknown optimal-steps model type {model_type!r}; expected one of {', '.join(OPTIMAL_STEPS_NOISE_LEVELS)}"
        )
    return _tabulated(OPTIMAL_STEPS_NOISE_LEVELS[model_type], steps, denoise)


def gits(coeff: float, steps: int, denoise: float = 1.0) -> torch.Tensor:
    """GITSScheduler: the tabulated schedule for ``coeff`` (0.80-1.50 in 0.05 steps) and 2-20 steps;
    more steps resample the 20-step row log-linearly."""
    from nodes.diffusion.gits_tables import GITS_NOISE_LEVELS

    key = round(coeff, 2)
    if key not in GITS_NOISE_LEVELS:
        raise SchedulerError(f"GITS coeff must be one of 0.80, 0.85, ..., 1.50; got {coeff}")
    if steps < 2:
        raise SchedulerError(f"GITS needs at least 2 steps, got {steps}")
    rows = GITS_NOISE_LEVELS[key]
    levels = rows[steps - 2] if steps <= 20 else rows[-1]
    return _tabulated(levels, steps, denoise)
