"""UniPC: unified predictor–corrector (Zhao et al. 2023, arXiv:2302.04867; reference wl-zhao/UniPC), run the
way ComfyUI's ``uni_pc`` / ``uni_pc_bh2`` samplers run it (``comfy/extra_samplers/uni_pc.py``,
``sample_unipc``):

- multistep, data (x0) prediction, B(h) = h (``bh1``) or eʰ − 1 (``bh2``);
- order min(3, steps − 1), lower orders for the first steps and, with ``lower_order_final``, near the end;
- every step but the last is corrected with the model output at the predicted point, which then also
  serves as that point's history entry (one model call per σ except the last);
- the σ-space latent is mapped to a variance-preserving one: the start is divided by √(1 + σ₀²), α(σ) =
  1/√(1 + σ²), σ_vp = σ·α, λ = −log σ; a final σ of 0 is replaced by 0.001 and the result is divided by
  α(σ_last). With one step (two sigmas) the order is 0 and, as in ComfyUI, nothing is integrated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from nodes.diffusion.k_samplers import StepCallback, report

UNI_PC_VARIANTS = ("bh1", "bh2")
FINAL_SIGMA = 0.001
"""UniPC integrates to this σ when the schedule ends at 0 (ComfyUI writes it into the sigmas in place, so its
KSAMPLER then un-scales flow latents with σ_last = 0.001; this module leaves the caller's sigmas alone)."""


@dataclass(frozen=True)
class _VP:
    """Variance-preserving view of one σ: α, σ_vp and λ = log(α/σ_vp) (computed as the reference does)."""

    sigma: Tensor
    alpha: Tensor
    std: Tensor
    lam: Tensor

    @staticmethod
    def of(sigma: Tensor) -> _VP:
        log_alpha = 0.5 * torch.log(1 / (sigma * sigma + 1))
        log_std = 0.5 * torch.log(1.0 - torch.exp(2.0 * log_alpha))
        return _VP(
            sigma, torch.exp(log_alpha), torch.sqrt(1.0 - torch.exp(2.0 * log_alpha)), log_alpha - log_std
        )


@dataclass
class _History:
    """The last ``size`` (time, data prediction) pairs, oldest first."""

    size: int
    times: list[_VP] = field(default_factory=list)
    outputs: list[Tensor] = field(default_factory=list)

    def push(self, time: _VP, output: Tensor) -> None:
        self.times = [*self.times, time][-self.size :]
        self.outputs = [*self.outputs, output][-self.size :]


def unipc_coefficients(rks: Tensor, hh: Tensor, order: int, variant: str) -> tuple[Tensor, Tensor, Tensor]:
    """(B(h), ρ_predictor, ρ_corrector) for one step of ``order`` with relative node positions ``rks``.

    ``hh`` is −h (data prediction). Rows of R are rksᵏ (k < order); gᵢ = i!·hφ_{i+1}(hh)/B(h). The
    predictor solves the leading (order−1) system (ρ = ½ at order 2), the corrector the full one
    (ρ = ½ at order 1).
    """
    if variant == "bh1":
        b_h = hh
    elif variant == "bh2":
        b_h = torch.expm1(hh)
    else:
        raise ValueError(f"uni_pc variant must be one of {UNI_PC_VARIANTS}, got {variant!r}")
    phi_k = torch.expm1(hh) / hh - 1
    rows, g = [], []
    for i in range(1, order + 1):
        rows.append(torch.pow(rks, i - 1))
        g.append(phi_k * math.factorial(i) / b_h)
        phi_k = phi_k / hh - 1 / math.factorial(i + 1)
    r_matrix, g_vector = torch.stack(rows), torch.stack(g)
    half = torch.tensor([0.5], dtype=rks.dtype, device=rks.device)
    if order >= 3:
        rho_p = torch.linalg.solve(r_matrix[:-1, :-1], g_vector[:-1])
    else:
        rho_p = half[: order - 1]  # order 2: ½; order 1: no predictor terms
    rho_c = half if order == 1 else torch.linalg.solve(r_matrix, g_vector)
    return b_h, rho_p, rho_c


def _weighted(differences: list[Tensor], rho: Tensor) -> Tensor:
    stacked = torch.stack(differences, dim=1)  # (B, K, ...)
    return torch.tensordot(stacked, rho.to(stacked.device), dims=([1], [0]))  # (B, ...)


class _UniPC:
    def __init__(self, model: Any, extra_args: dict[str, Any], variant: str) -> None:
        self.model, self.extra_args, self.variant = model, extra_args, variant

    def data_prediction(self, x: Tensor, time: _VP) -> Tensor:
        """x0 from the variance-preserving latent, via the model's ε at the σ-space point."""
        sigma_in = time.sigma * x.new_ones([x.shape[0]])
        sigma = sigma_in.view(sigma_in.shape[:1] + (1,) * (x.ndim - 1))
        x_sigma = x * ((sigma**2 + 1.0) ** 0.5)
        eps = (x_sigma - self.model(x_sigma, sigma_in, **self.extra_args)) / sigma
        return (x - time.std * eps) / time.alpha

    def step(
        self, x: Tensor, history: _History, target: _VP, order: int, correct: bool
    ) -> tuple[Tensor, Tensor | None]:
        last, out_last = history.times[-1], history.outputs[-1]
        h = target.lam - last.lam
        rks, differences = [], []
        for i in range(1, order):
            rk = (history.times[-(i + 1)].lam - last.lam) / h
            rks.append(rk)
            differences.append((history.outputs[-(i + 1)] - out_last) / rk)
        rks.append(torch.ones_like(h))
        b_h, rho_p, rho_c = unipc_coefficients(torch.stack(rks), -h, order, self.variant)
        h_phi_1 = torch.expm1(-h)
        x_base = (target.std / last.std) * x - (target.alpha * h_phi_1) * out_last
        scale = target.alpha * b_h
        x_new = x_base - scale * _weighted(differences, rho_p) if differences else x_base
        if not correct:
            return x_new, None
        out_new = self.data_prediction(x_new, target)
        corr = rho_c[-1] * (out_new - out_last)
        if differences:
            corr = _weighted(differences, rho_c[:-1]) + corr
        return x_base - scale * corr, out_new


@torch.no_grad()
def sample_unipc(
    model: Any,
    x: Tensor,
    sigmas: Tensor,
    extra_args: dict[str, Any] | None = None,
    callback: StepCallback | None = None,
    disable: bool | None = None,
    variant: str = "bh1",
    lower_order_final: bool = True,
) -> Tensor:
    """UniPC multistep (``variant`` bh1 | bh2) over ``sigmas``; ComfyUI's ``uni_pc`` and ``uni_pc_bh2``."""
    if variant not in UNI_PC_VARIANTS:
        raise ValueError(f"uni_pc variant must be one of {UNI_PC_VARIANTS}, got {variant!r}")
    if len(sigmas) <= 1:
        return x
    times = sigmas.clone()
    if sigmas[-1] == 0:
        times[-1] = FINAL_SIGMA
    vp = [_VP.of(s) for s in times]
    steps = len(times) - 1
    order = min(3, steps - 1)
    solver = _UniPC(model, {} if extra_args is None else extra_args, variant)

    x = x / torch.sqrt(1.0 + times[0] ** 2.0)
    history = _History(size=max(order, 1))
    history.push(vp[0], solver.data_prediction(x, vp[0]))
    report(callback, x / vp[0].alpha, 0, vp[0].sigma, history.outputs[-1])  # x in the package's scale
    for k in range(1, steps + 1 if order >= 1 else 1):
        step_order = min(k, order, steps + 1 - k) if lower_order_final else min(k, order)
        x, output = solver.step(x, history, vp[k], step_order, correct=k < steps)
        if output is not None:  # every step but the last is corrected, which evaluates the model there
            history.push(vp[k], output)
        if k != steps - 1:
            report(callback, x / vp[k].alpha, min(k, steps - 1), vp[k].sigma, history.outputs[-1])
    return x / vp[-1].alpha


def sample_unipc_bh2(
    model: Any,
    x: Tensor,
    sigmas: Tensor,
    extra_args: dict[str, Any] | None = None,
    callback: StepCallback | None = None,
    disable: bool | None = None,
) -> Tensor:
    """UniPC with B(h) = eʰ − 1 (ComfyUI's ``uni_pc_bh2``)."""
    return sample_unipc(model, x, sigmas, extra_args, callback, disable, variant="bh2")
