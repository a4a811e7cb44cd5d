"""DEIS coefficients (Zhang & Chen 2023, "Fast Sampling of Diffusion Models with Exponential Integrator",
arXiv:2204.13902), in the form ComfyUI's ``deis`` sampler uses (``comfy/k_diffusion/deis.py``, itself after
zju-pi/diff-sampler).

``tab`` (the default): each σ is mapped to the time t of a VP-SDE fitted to EDM's σ range
(σ_min 0.002, σ_max 80, ε 1e-3; the same constants whatever the model). The step t_i → t_{i+1} integrates
the Lagrange basis through the last ``order`` times against the exponential-integrator weight
−½·(d log α/dτ)/√(α(1−α)), with a 10 000-point sum in float32, as the reference does.
``rhoab``: Adams–Bashforth in σ itself (exact integrals of the Lagrange basis).

The sampler's update is x_{i+1} = x_i + Σⱼ C[i][j]·d_{i−j}, with d = (x − D)/σ.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

DEIS_MODES = ("tab", "rhoab")
_EDM_SIGMA_MIN, _EDM_SIGMA_MAX, _EPS_S = 0.002, 80.0, 1e-3
_INTEGRATION_POINTS = 10_000


def vp_fit() -> tuple[Tensor, Tensor]:
    """(β_d, β_min) of the linear VP-SDE through EDM's σ range.

    Precision follows the reference: log(σ_min² + 1) in float32 with NumPy's log (σ_min is a float32 tensor
    there; torch's float32 log differs in the last bit), log(σ_max² + 1) in float64 (σ_max is the integer
    80), so the result is float64.
    """
    sigma_min = np.float32(_EDM_SIGMA_MIN)
    log_min = torch.tensor(float(np.log(sigma_min * sigma_min + np.float32(1))), dtype=torch.float32)
    log_max = torch.tensor(math.log(int(_EDM_SIGMA_MAX) ** 2 + 1), dtype=torch.float64)
    beta_d = 2 * (log_min / _EPS_S - log_max) / (_EPS_S - 1)
    beta_min = log_max - 0.5 * beta_d
    return beta_d, beta_min


def sigma_to_vp_time(sigmas: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """VP times t(σ) = (√(β_min² + 2β_d·log(σ²+1)) − β_min)/β_d, with the schedule's β₀ and β₁."""
    beta_d, beta_min = vp_fit()
    sigmas = sigmas.detach().cpu()
    times = ((beta_min**2 + 2 * beta_d * (sigmas**2 + 1).log()).sqrt() - beta_min) / beta_d
    return times, beta_min, beta_d + beta_min


def _lagrange_basis(nodes: Tensor, j: int, taus: Tensor) -> Tensor:
    basis = torch.ones_like(taus)
    for k in range(nodes.shape[0]):
        if k != j:
            basis = basis * ((taus - nodes[k]) / (nodes[j] - nodes[k]))
    return basis


def _tab_weight(beta_0: Tensor, beta_1: Tensor, taus: Tensor) -> Tensor:
    """−½·(d log α/dτ)/√(α(1−α)) for α(τ) = exp(−½τ²(β₁−β₀) − τβ₀).

    d log α/dτ is taken by autograd through log(exp(·)), as the reference does, so the float32 weights
    (and the coefficients summed from them) match it bit for bit.
    """
    with torch.inference_mode(False), torch.enable_grad():
        taus = taus.clone().requires_grad_(True)
        alpha = torch.exp(-0.5 * taus**2 * (beta_1.clone() - beta_0.clone()) - taus * beta_0.clone())
        (dlog_alpha,) = torch.autograd.grad(alpha.log().sum(), taus)
    alpha = alpha.detach()
    return -0.5 * dlog_alpha / torch.sqrt(alpha * (1 - alpha))


def _tab_coefficients(sigmas: Tensor, max_order: int) -> list[list[Tensor]]:
    times, beta_0, beta_1 = sigma_to_vp_time(sigmas)
    table: list[list[Tensor]] = []
    for i in range(len(times) - 1):
        order = min(i + 1, max_order)
        if order == 1 or sigmas[i + 1] <= 0:  # first-order (Euler) steps need no table
            table.append([])
            continue
        t_cur, t_next = times[i], times[i + 1]
        taus = torch.linspace(float(t_cur), float(t_next), _INTEGRATION_POINTS)
        dtau = (t_next - t_cur) / _INTEGRATION_POINTS
        nodes = times[[i - k for k in range(order)]]
        weight = _tab_weight(beta_0, beta_1, taus)
        table.append([torch.sum(weight * _lagrange_basis(nodes, j, taus)) * dtau for j in range(order)])
    return table


def _rhoab_coefficients(sigmas: Tensor, max_order: int) -> list[list[Tensor]]:
    points = sigmas.detach().cpu().double().numpy()
    table: list[list[Tensor]] = []
    for i in range(len(points) - 1):
        order = min(i + 1, max_order)
        if order == 1 or points[i + 1] <= 0:
            table.append([])
            continue
        nodes = points[[i - k for k in range(order)]]
        row = []
        for j in range(order):
            others = np.delete(nodes, j)
            poly = np.polynomial.Polynomial.fromroots(others) / math.prod(nodes[j] - o for o in others)
            antiderivative = poly.integ()
            row.append(
                torch.tensor(antiderivative(points[i + 1]) - antiderivative(points[i]), dtype=sigmas.dtype)
            )
        table.append(row)
    return table


def deis_coefficients(sigmas: Tensor, max_order: int, mode: str = "tab") -> list[list[Tensor]]:
    """Per step i, the weights of d_i, d_{i−1}, … (empty for first-order steps and the step to σ = 0)."""
    if not 1 <= max_order <= 4:
        raise ValueError(f"deis max_order must be 1..4, got {max_order}")
    if mode == "tab":
        return _tab_coefficients(sigmas, max_order)
    if mode == "rhoab":
        return _rhoab_coefficients(sigmas, max_order)
    raise ValueError(f"deis_mode must be one of {DEIS_MODES}, got {mode!r}")
