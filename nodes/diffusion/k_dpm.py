"""DPM-Solver samplers: dpm_2, dpm_2_ancestral, dpm_fast, dpm_adaptive.

``dpm_2`` is k-diffusion's DPM-Solver-2-inspired Heun variant (midpoint in log sigma). ``dpm_fast``
and ``dpm_adaptive`` are DPM-Solver (Lu et al. 2022, arXiv:2206.00927) in t = -log(sigma) with
fixed (3/2/1-order mix) and adaptive (embedded 2/3-order pair with a PID step controller) steps;
they take ``(sigma_min, sigma_max)`` rather than a sigma list, and ``dpm_fast_function`` /
``dpm_adaptive_function`` wrap them so they fit the common sampler signature, as ComfyUI does.
References: k-diffusion ``sampling.py`` (MIT); ComfyUI ``comfy/k_diffusion/sampling.py``.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from nodes.diffusion.k_euler import INF, ChurnedModel, rf_ancestral_split
from nodes.diffusion.k_samplers import (
    StepCallback,
    get_ancestral_step,
    is_flow,
    noise_sampler_for,
    report,
    step_range,
    to_d,
)
from nodes.diffusion.noise import NoiseSampler


def _log_midpoint(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The geometric mean of two sigmas, computed as ComfyUI does (lerp of logs)."""
    return a.log().lerp(b.log(), 0.5).exp()


@torch.no_grad()
def sample_dpm_2(
    model: Any,
    x: torch.Tensor,
    sigmas: torch.Tensor,
    extra_args: dict[str, Any] | None = None,
    callback: StepCallback | None = None,
    disable: bool | None = None,
    s_churn: float = 0.0,
    s_tmin: float = 0.0,
    s_tmax: float = INF,
    s_noise: float = 1.0,
) -> torch.Tensor:
    """Second-order steps through the log-sigma midpoint; Euler on the last step to 0."""
    extra_args = {} if extra_args is None else extra_args
    s_in = x.new_ones([x.shape[0]])
    evaluate = ChurnedModel(model, extra_args, callback, s_churn, s_tmin, s_tmax, s_noise)
    for i in step_range(len(sigmas) - 1, disable):
        x, sigma_hat, _, d = evaluate(x, sigmas, i)
        if sigmas[i + 1] == 0:
            x = x + d * (sigmas[i + 1] - sigma_hat)
            continue
        sigma_mid = _log_midpoint(sigma_hat, sigmas[i + 1])
        x_2 = x + d * (sigma_mid - sigma_hat)
        denoised_2 = model(x_2, sigma_mid * s_in, **extra_args)
        d_2 = to_d(x_2, sigma_mid, denoised_2)
        x = x + d_2 * (sigmas[i + 1] - sigma_hat)
    return x


@torch.no_grad()
def sample_dpm_2_ancestral(
    model: Any,
    x: torch.Tensor,
    sigmas: torch.Tensor,
    extra_args: dict[str, Any] | None = None,
    callback: StepCallback | None = None,
    disable: bool | None = None,
    eta: float = 1.0,
    s_noise: float = 1.0,
    noise_sampler: NoiseSampler | None = None,
) -> torch.Tensor:
    """dpm_2 down to sigma_down, then ancestral noise of std sigma_up (RF form for flow models)."""
    flow = is_flow(model)
    extra_args = {} if extra_args is None else extra_args
    noise = noise_sampler_for(x, extra_args, noise_sampler)
    s_in = x.new_ones([x.shape[0]])
    for i in step_range(len(sigmas) - 1, disable):
        denoised = model(x, sigmas[i] * s_in, **extra_args)
        if flow:
            sigma_down, alpha_ratio, sigma_up = rf_ancestral_split(sigmas[i], sigmas[i + 1], eta)
        else:
            sigma_down, sigma_up = get_ancestral_step(sigmas[i], sigmas[i + 1], eta=eta)
        report(callback, x, i, sigmas[i], denoised)
        d = to_d(x, sigmas[i], denoised)
        if sigma_down == 0:
            x = x + d * (sigma_down - sigmas[i])
            continue
        sigma_mid = _log_midpoint(sigmas[i], sigma_down)
        x_2 = x + d * (sigma_mid - sigmas[i])
        denoised_2 = model(x_2, sigma_mid * s_in, **extra_args)
        d_2 = to_d(x_2, sigma_mid, denoised_2)
        x = x + d_2 * (sigma_down - sigmas[i])
        step_noise = noise(sigmas[i], sigmas[i + 1]) * s_noise * sigma_up
        x = alpha_ratio * x + step_noise if flow else x + step_noise
    return x


class PIDStepSizeController:
    """PID control of the step size h of an adaptive ODE solver (Söderlind 2003)."""

    def __init__(
        self,
        h: float | torch.Tensor,
        pcoeff: float,
        icoeff: float,
        dcoeff: float,
        order: float = 1,
        accept_safety: float = 0.81,
        eps: float = 1e-8,
    ) -> None:
        self.h = h
        self.b1 = (pcoeff + icoeff + dcoeff) / order
        self.b2 = -(pcoeff + 2 * dcoeff) / order
        self.b3 = dcoeff / order
        self.accept_safety = accept_safety
        self.eps = eps
        self.errs: list[float] = []

    @staticmethod
    def limiter(x: float) -> float:
        return 1 + math.atan(x - 1)

    def propose_step(self, error: torch.Tensor | float) -> bool:
        inv_error = 1 / (float(error) + self.eps)
        if not self.errs:
            self.errs = [inv_error, inv_error, inv_error]
        self.errs[0] = inv_error
        factor = self.limiter(self.errs[0] ** self.b1 * self.errs[1] ** self.b2 * self.errs[2] ** self.b3)
        accept = factor >= self.accept_safety
        if accept:
            self.errs[2] = self.errs[1]
            self.errs[1] = self.errs[0]
        self.h *= factor
        return accept


class DPMSolver:
    """DPM-Solver-1/2/3 single steps in t = -log(sigma) on the eps the denoiser implies."""

    def __init__(
        self, model: Any, extra_args: dict[str, Any] | None = None, info_callback: StepCallback | None = None
    ) -> None:
        self.model = model
        self.extra_args = {} if extra_args is None else extra_args
        self.info_callback = info_callback

    @staticmethod
    def t(sigma: torch.Tensor) -> torch.Tensor:
        return -sigma.log()

    @staticmethod
    def sigma(t: torch.Tensor) -> torch.Tensor:
        return t.neg().exp()

    def eps(
        self, cache: dict[str, torch.Tensor], key: str, x: torch.Tensor, t: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        if key in cache:
            return cache[key], cache
        sigma = self.sigma(t) * x.new_ones([x.shape[0]])
        eps = (x - self.model(x, sigma, **self.extra_args)) / self.sigma(t)
        return eps, {key: eps, **cache}

    def step_1(
        self, x: torch.Tensor, t: torch.Tensor, t_next: torch.Tensor, cache: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        h = t_next - t
        eps, cache = self.eps(cache, "eps", x, t)
        return x - self.sigma(t_next) * h.expm1() * eps, cache

    def step_2(
        self,
        x: torch.Tensor,
        t: torch.Tensor,
        t_next: torch.Tensor,
        cache: dict[str, torch.Tensor],
        r1: float = 1 / 2,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        h = t_next - t
        eps, cache = self.eps(cache, "eps", x, t)
        s1 = t + r1 * h
        u1 = x - self.sigma(s1) * (r1 * h).expm1() * eps
        eps_r1, cache = self.eps(cache, "eps_r1", u1, s1)
        sig = self.sigma(t_next)
        x_2 = x - sig * h.expm1() * eps - sig / (2 * r1) * h.expm1() * (eps_r1 - eps)
        return x_2, cache

    def step_3(
        self,
        x: torch.Tensor,
        t: torch.Tensor,
        t_next: torch.Tensor,
        cache: dict[str, torch.Tensor],
        r1: float = 1 / 3,
        r2: float = 2 / 3,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        h = t_next - t
        eps, cache = self.eps(cache, "eps", x, t)
        s1, s2 = t + r1 * h, t + r2 * h
        u1 = x - self.sigma(s1) * (r1 * h).expm1() * eps
        eps_r1, cache = self.eps(cache, "eps_r1", u1, s1)
        u2 = (
            x
            - self.sigma(s2) * (r2 * h).expm1() * eps
            - self.sigma(s2) * (r2 / r1) * ((r2 * h).expm1() / (r2 * h) - 1) * (eps_r1 - eps)
        )
        eps_r2, cache = self.eps(cache, "eps_r2", u2, s2)
        sig = self.sigma(t_next)
        x_3 = x - sig * h.expm1() * eps - sig / r2 * (h.expm1() / h - 1) * (eps_r2 - eps)
        return x_3, cache

    def _ancestral(
        self, s: torch.Tensor, t: torch.Tensor, t_end: torch.Tensor, eta: float
    ) -> tuple[torch.Tensor, torch.Tensor | float]:
        """The t actually stepped to and the noise std added after it."""
        if not eta:
            return t, 0.0
        sd, _ = get_ancestral_step(self.sigma(s), self.sigma(t), eta)
        t_down = torch.minimum(t_end, self.t(sd))
        return t_down, (self.sigma(t) ** 2 - self.sigma(t_down) ** 2) ** 0.5

    def _info(self, payload: dict[str, Any]) -> None:
        if self.info_callback is not None:
            self.info_callback(payload)

    def fast(
        self,
        x: torch.Tensor,
        t_start: torch.Tensor,
        t_end: torch.Tensor,
        nfe: int,
        eta: float = 0.0,
        s_noise: float = 1.0,
        noise_sampler: NoiseSampler | None = None,
    ) -> torch.Tensor:
        """DPM-Solver-fast: ``nfe`` model evaluations split into 3rd-order steps plus a 2/1 tail."""
        noise = noise_sampler_for(x, self.extra_args, noise_sampler)
        if not t_end > t_start and eta:
            raise ValueError("eta must be 0 for reverse sampling")
        m = math.floor(nfe / 3) + 1
        ts = torch.linspace(float(t_start), float(t_end), m + 1, device=x.device)
        orders = [3] * (m - 2) + [2, 1] if nfe % 3 == 0 else [3] * (m - 1) + [nfe % 3]
        for i, order in enumerate(orders):
            cache: dict[str, torch.Tensor] = {}
            t, t_next = ts[i], ts[i + 1]
            t_next_, su = self._ancestral(t, t_next, t_end, eta)
            eps, cache = self.eps(cache, "eps", x, t)
            self._info({"x": x, "i": i, "t": ts[i], "t_up": t, "denoised": x - self.sigma(t) * eps})
            if order == 1:
                x, cache = self.step_1(x, t, t_next_, cache)
            elif order == 2:
                x, cache = self.step_2(x, t, t_next_, cache)
            else:
                x, cache = self.step_3(x, t, t_next_, cache)
            x = x + su * s_noise * noise(self.sigma(t), self.sigma(t_next))
        return x

    def adaptive(
        self,
        x: torch.Tensor,
        t_start: torch.Tensor,
        t_end: torch.Tensor,
        order: int = 3,
        rtol: float = 0.05,
        atol: float = 0.0078,
        h_init: float = 0.05,
        pcoeff: float = 0.0,
        icoeff: float = 1.0,
        dcoeff: float = 0.0,
        accept_safety: float = 0.81,
        eta: float = 0.0,
        s_noise: float = 1.0,
        noise_sampler: NoiseSampler | None = None,
    ) -> tuple[torch.Tensor, dict[str, int]]:
        """DPM-Solver-12/23 with error control; returns (x, {"steps", "nfe", "n_accept", "n_reject"})."""
        noise = noise_sampler_for(x, self.extra_args, noise_sampler)
        if order not in {2, 3}:
            raise ValueError(f"dpm_adaptive order must be 2 or 3, got {order}")
        forward = bool(t_end > t_start)
        if not forward and eta:
            raise ValueError("eta must be 0 for reverse sampling")
        h_init = abs(h_init) * (1 if forward else -1)
        atol_t, rtol_t = torch.tensor(atol), torch.tensor(rtol)
        s, x_prev = t_start, x
        pid = PIDStepSizeController(h_init, pcoeff, icoeff, dcoeff, 1.5 if eta else order, accept_safety)
        info = {"steps": 0, "nfe": 0, "n_accept": 0, "n_reject": 0}
        while (s < t_end - 1e-5) if forward else (s > t_end + 1e-5):
            cache: dict[str, torch.Tensor] = {}
            t = torch.minimum(t_end, s + pid.h) if forward else torch.maximum(t_end, s + pid.h)
            t_, su = self._ancestral(s, t, t_end, eta)
            eps, cache = self.eps(cache, "eps", x, s)
            denoised = x - self.sigma(s) * eps
            if order == 2:
                x_low, cache = self.step_1(x, s, t_, cache)
                x_high, cache = self.step_2(x, s, t_, cache)
            else:
                x_low, cache = self.step_2(x, s, t_, cache, r1=1 / 3)
                x_high, cache = self.step_3(x, s, t_, cache)
            delta = torch.maximum(atol_t, rtol_t * torch.maximum(x_low.abs(), x_prev.abs()))
            error = torch.linalg.norm((x_low - x_high) / delta) / x.numel() ** 0.5
            if pid.propose_step(error):
                x_prev = x_low
                x = x_high + su * s_noise * noise(self.sigma(s), self.sigma(t))
                s = t
                info["n_accept"] += 1
            else:
                info["n_reject"] += 1
            info["nfe"] += order
            info["steps"] += 1
            self._info(
                {
                    "x": x,
                    "i": info["steps"] - 1,
                    "t": s,
                    "t_up": s,
                    "denoised": denoised,
                    "error": error,
                    "h": pid.h,
                    **info,
                }
            )
        return x, info


def _solver(model: Any, extra_args: dict[str, Any] | None, callback: StepCallback | None) -> DPMSolver:
    solver = DPMSolver(model, extra_args)
    if callback is not None:

        def info_callback(info: dict[str, Any]) -> None:
            callback({"sigma": solver.sigma(info["t"]), "sigma_hat": solver.sigma(info["t_up"]), **info})

        solver.info_callback = info_callback
    return solver


def _check_range(sigma_min: Any, sigma_max: Any) -> tuple[torch.Tensor, torch.Tensor]:
    lo, hi = torch.as_tensor(sigma_min).float(), torch.as_tensor(sigma_max).float()
    if lo <= 0 or hi <= 0:
        raise ValueError(
            f"dpm_fast/dpm_adaptive need positive sigma_min and sigma_max, got {float(lo)} and {float(hi)}"
        )
    return lo, hi


@torch.no_grad()
def sample_dpm_fast(
    model: Any,
    x: torch.Tensor,
    sigma_min: Any,
    sigma_max: Any,
    n: int,
    extra_args: dict[str, Any] | None = None,
    callback: StepCallback | None = None,
    disable: bool | None = None,
    eta: float = 0.0,
    s_noise: float = 1.0,
    noise_sampler: NoiseSampler | None = None,
) -> torch.Tensor:
    """DPM-Solver-fast from sigma_max down to sigma_min with ``n`` model evaluations."""
    lo, hi = _check_range(sigma_min, sigma_max)
    solver = _solver(model, extra_args, callback)
    return solver.fast(x, solver.t(hi), solver.t(lo), n, eta, s_noise, noise_sampler)


@torch.no_grad()
def sample_dpm_adaptive(
    model: Any,
    x: torch.Tensor,
    sigma_min: Any,
    sigma_max: Any,
    extra_args: dict[str, Any] | None = None,
    callback: StepCallback | None = None,
    disable: bool | None = None,
    order: int = 3,
    rtol: float = 0.05,
    atol: float = 0.0078,
    h_init: float = 0.05,
    pcoeff: float = 0.0,
    icoeff: float = 1.0,
    dcoeff: float = 0.0,
    accept_safety: float = 0.81,
    eta: float = 0.0,
    s_noise: float = 1.0,
    noise_sampler: NoiseSampler | None = None,
    return_info: bool = False,
) -> Any:
    """Adaptive DPM-Solver-12/23 from sigma_max to sigma_min (``return_info`` adds the step counts)."""
    lo, hi = _check_range(sigma_min, sigma_max)
    solver = _solver(model, extra_args, callback)
    x, info = solver.adaptive(
        x,
        solver.t(hi),
        solver.t(lo),
        order,
        rtol,
        atol,
        h_init,
        pcoeff,
        icoeff,
        dcoeff,
        accept_safety,
        eta,
        s_noise,
        noise_sampler,
    )
    return (x, info) if return_info else x


def dpm_fast_function(
    model: Any,
    x: torch.Tensor,
    sigmas: torch.Tensor,
    extra_args: dict[str, Any] | None = None,
    callback: StepCallback | None = None,
    disable: bool | None = None,
    **options: Any,
) -> torch.Tensor:
    """``dpm_fast`` in the common signature: sigma_max = sigmas[0], sigma_min = the last non-zero
    sigma, len(sigmas) - 1 model evaluations (ComfyUI's ``ksampler("dpm_fast")``)."""
    if len(sigmas) <= 1:
        return x
    sigma_min = sigmas[-1] if sigmas[-1] != 0 else sigmas[-2]
    return sample_dpm_fast(
        model,
        x,
        sigma_min,
        sigmas[0],
        len(sigmas) - 1,
        extra_args=extra_args,
        callback=callback,
        disable=disable,
        **options,
    )


def dpm_adaptive_function(
    model: Any,
    x: torch.Tensor,
    sigmas: torch.Tensor,
    extra_args: dict[str, Any] | None = None,
    callback: StepCallback | None = None,
    disable: bool | None = None,
    **options: Any,
) -> torch.Tensor:
    """``dpm_adaptive`` in the common signature (only the first and last non-zero sigma are used)."""
    if len(sigmas) <= 1:
        return x
    sigma_min = sigmas[-1] if sigmas[-1] != 0 else sigmas[-2]
    return sample_dpm_adaptive(
        model, x, sigma_min, sigmas[0], extra_args=extra_args, callback=callback, disable=disable, **options
    )
