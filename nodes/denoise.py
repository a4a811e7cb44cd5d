"""The denoising loop on a diffusers scheduler, as the diffusers pipelines run it.

One model call per scheduler timestep (``predict`` batches the CFG branches itself); a step
window ``[start, end)`` of a ``total``-step schedule gives img2img (``denoise`` < 1, or
``start_at_step``) and split sampling (``end_at_step``). References:
``diffusers/pipelines/stable_diffusion/pipeline_stable_diffusion.py`` (``__call__`` loop),
``pipeline_stable_diffusion_img2img.py`` (``get_timesteps``: window start = ``t_start * order``),
``pipeline_stable_diffusion_inpaint.py`` (re-noised original outside the mask after each step),
ComfyUI ``comfy/samplers.py`` (``KSampler.sample``: denoise → ``steps / denoise`` total steps).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from diffusers.schedulers.scheduling_utils import SchedulerMixin

Predict = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (model input, t) -> model output
X0Thunk = Callable[[], torch.Tensor]
StepCallback = Callable[[int, int, X0Thunk], None]  # (done, total, x0 preview)


@dataclass(frozen=True)
class Window:
    """Which steps of a ``total``-step schedule to run, in user steps (not scheduler calls)."""

    total: int
    start: int
    end: int
    force_full_denoise: bool  # stopping early still returns a fully denoised latent

    @classmethod
    def from_denoise(cls, steps: int, denoise: float) -> Window:
        """ComfyUI's KSampler: ``denoise`` < 1 runs the last ``steps`` of ``int(steps / denoise)``."""
        if denoise <= 0:
            return cls(steps, steps, steps, True)
        total = max(steps, int(steps / denoise)) if denoise < 1 else steps
        return cls(total, total - steps, total, True)

    @property
    def full(self) -> bool:
        return self.start == 0


@dataclass
class Inpaint:
    """Keep the original outside the mask: ``mask`` [B|1, 1, h, w], 1 = repaint."""

    original: torch.Tensor
    noise: torch.Tensor
    mask: torch.Tensor


def _alpha(sched: Any, t: torch.Tensor, index: int) -> float:
    """ᾱ of the current model input (the VP-space sample the UNet sees)."""
    scale = float(sched.scale_model_input(torch.ones(1), t))  # k-diffusion: 1/sqrt(σ²+1)
    if scale != 1.0:
        return scale * scale
    sigmas = getattr(sched, "sigmas", None)
    if sigmas is not None:
        sigma = float(sigmas[index])
        return 1.0 / (1.0 + sigma * sigma)
    return float(sched.alphas_cumprod[int(t)])


def predicted_x0(
    sched: Any, model_out: torch.Tensor, x_in: torch.Tensor, t: torch.Tensor, index: int
) -> torch.Tensor:
    """The clean latent the model predicts from its input ``x_in`` at ``t``."""
    alpha = _alpha(sched, t, index)
    a, s = alpha**0.5, (1.0 - alpha) ** 0.5
    kind = sched.config.prediction_type
    if kind == "epsilon":
        return (x_in - s * model_out) / a
    if kind == "v_prediction":
        return a * x_in - s * model_out
    return model_out  # "sample"


def start_latent(
    sched: Any, latent: torch.Tensor, noise: torch.Tensor, window: Window, add_noise: bool
) -> torch.Tensor:
    """The sample the loop starts from (diffusers' txt2img and img2img initial latents)."""
    if hasattr(sched, "set_begin_index"):
        sched.set_begin_index(window.start * sched.order)
    if not add_noise:
        return latent
    if window.full:
        return latent + noise * sched.init_noise_sigma
    t = sched.timesteps[window.start * sched.order : window.start * sched.order + 1]
    return sched.add_noise(latent, noise, t)


def run_loop(
    scheduler: SchedulerMixin,
    x: torch.Tensor,
    window: Window,
    predict: Predict,
    *,
    generators: Sequence[torch.Generator] | None = None,
    inpaint: Inpaint | None = None,
    on_step: StepCallback | None = None,
) -> torch.Tensor:
    """Run the window's steps from sample ``x``; ``scheduler.set_timesteps`` must have been called."""
    sched: Any = scheduler
    timesteps = sched.timesteps
    order = sched.order
    begin = window.start * order
    stop = len(timesteps) if window.end >= window.total else min(window.end * order, len(timesteps))
    force_zero = window.force_full_denoise and window.end < window.total
    if hasattr(sched, "set_begin_index"):
        sched.set_begin_index(begin)
    step_kwargs: dict[str, Any] = {"return_dict": True}
    if generators is not None and "generator" in _step_params(sched):
        step_kwargs["generator"] = list(generators)
    calls = stop - begin
    for i in range(begin, stop):
        t = timesteps[i]
        index = sched.step_index if getattr(sched, "step_index", None) is not None else i
        x_in = sched.scale_model_input(x, t)
        out = predict(x_in, t)
        if force_zero and i == stop - 1:
            x = predicted_x0(sched, out, x_in, t, index)
        else:
            x = sched.step(out, t, x, **step_kwargs).prev_sample
        if inpaint is not None:
            x = _keep_unmasked(sched, x, inpaint, timesteps, i, stop)
        if on_step is not None:
            on_step(i - begin + 1, calls, _x0_thunk(sched, out, x_in, t, index))
    return x


def _x0_thunk(sched: Any, out: torch.Tensor, x_in: torch.Tensor, t: torch.Tensor, index: int) -> X0Thunk:
    return lambda: predicted_x0(sched, out, x_in, t, index)


def _keep_unmasked(
    sched: Any, x: torch.Tensor, inpaint: Inpaint, timesteps: torch.Tensor, i: int, stop: int
) -> torch.Tensor:
    original = inpaint.original
    if i < stop - 1:
        original = sched.add_noise(original, inpaint.noise, timesteps[i + 1 : i + 2])
    return (1 - inpaint.mask) * original + inpaint.mask * x


def _step_params(sched: Any) -> Sequence[str]:
    import inspect

    return tuple(inspect.signature(sched.step).parameters)


def cfg_combine(
    uncond: torch.Tensor, cond: torch.Tensor, cfg: float, guidance_rescale: float
) -> torch.Tensor:
    """Classifier-free guidance, with diffusers' ``rescale_noise_cfg`` (Lin et al. 2023, §3.4)."""
    guided = uncond + cfg * (cond - uncond)
    if guidance_rescale <= 0:
        return guided
    dims = list(range(1, cond.ndim))
    rescaled = guided * (cond.std(dim=dims, keepdim=True) / guided.std(dim=dims, keepdim=True))
    return guidance_rescale * rescaled + (1 - guidance_rescale) * guided
