"""diffusers as an independent reference for Loom's sampling, where the math is the same.

diffusers' pipelines do CFG in eps space and step with their own schedules; ComfyUI (and Loom)
do CFG on denoised predictions over ComfyUI's sigma schedules, with the UNet seeing the integer
timestep nearest each sigma and the start noise scaled by sqrt(1 + sigma0^2) only when the run
starts at sigma_max. :class:`ComfyEulerScheduler` is diffusers' Euler scheduler driven by a given
sigma schedule with exactly those rules, so a diffusers pipeline using it computes what Loom's
``euler`` does (up to float rounding: eps-space and x0-space CFG are equal mathematically).
"""

from __future__ import annotations

from typing import Any

import torch
from diffusers import EulerDiscreteScheduler


class ComfyEulerScheduler(EulerDiscreteScheduler):  # type: ignore[misc]
    """EulerDiscreteScheduler over fixed ``sigmas`` (ending at 0) of a ModelSampling ``ms``."""

    fixed_sigmas: torch.Tensor
    fixed_timesteps: torch.Tensor
    start_scale: float

    @classmethod
    def over(cls, config: dict[str, Any], ms: Any, sigmas: torch.Tensor) -> ComfyEulerScheduler:
        sched = cls.from_config(config)
        sched.fixed_sigmas, sched.fixed_timesteps = sigmas.float(), ms.timestep(sigmas[:-1]).float()
        starts_at_max = float(sigmas[0]) >= float(ms.sigma_max) * (1 - 1e-5)
        sched.start_scale = float((1 + sigmas[0] ** 2) ** 0.5) if starts_at_max else float(sigmas[0])
        sched.set_timesteps(len(sigmas) - 1)
        return sched

    def set_timesteps(self, num_inference_steps: int | None = None, device: Any = None, **_: Any) -> None:
        if not hasattr(self, "fixed_sigmas"):
            super().set_timesteps(num_inference_steps, device=device)  # type: ignore[misc]
            return
        self.num_inference_steps = len(self.fixed_sigmas) - 1
        self.sigmas = self.fixed_sigmas.to(device or "cpu")
        self.timesteps = self.fixed_timesteps.to(device or "cpu")
        self._step_index = None
        self._begin_index = None

    @property
    def init_noise_sigma(self) -> float:
        return getattr(self, "start_scale", 1.0)
