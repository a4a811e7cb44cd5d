"""Coefficients and single steps checked against values derived independently (closed forms, float64
quadrature, hand-derived UniPC steps)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from nodes.diffusion.k_deis import deis_coefficients, sigma_to_vp_time
from nodes.diffusion.k_multistep import ADAMS_BASHFORTH, ipndm_v_weights
from nodes.diffusion.sa_solver import adams_weights, exponential_moments
from nodes.diffusion.uni_pc import sample_unipc, sample_unipc_bh2
from tests.nodes.diffusion.gaussian_toys import EPS, GaussianToy, karras, start_noise

torch.set_num_threads(1)

GRID = torch.tensor([14.6, 8.0, 4.0, 2.0, 1.0, 0.5, 0.2, 0.0])


def test_deis_tab_coefficients_integrate_constants_and_lines() -> None:
    """Σⱼ Cᵢⱼ = σᵢ₊₁ − σᵢ (the weight integrates dσ), and Σⱼ Cᵢⱼ·t_{i−j} = ∫ w(τ)·τ dτ (a float64 quadrature)."""
    table = deis_coefficients(GRID, max_order=3)
    times, beta_0, beta_1 = (v.double().numpy() for v in sigma_to_vp_time(GRID))
    b0, b1 = float(beta_0), float(beta_1)

    def weight(tau: np.ndarray) -> np.ndarray:
        alpha = np.exp(-0.5 * tau**2 * (b1 - b0) - tau * b0)
        return -0.5 * (-tau * (b1 - b0) - b0) / np.sqrt(alpha * (1 - alpha))

    assert table[0] == [] and table[-1] == []  # Euler first, Euler into σ = 0
    for i, row in enumerate(table[1:-1], start=1):
        assert len(row) == min(i + 1, 3)
        assert float(sum(row)) == pytest.approx(float(GRID[i + 1] - GRID[i]), rel=2e-5)
        taus = np.linspace(times[i], times[i + 1], 200_001)
        line = np.trapezoid(weight(taus) * taus, taus)
        assert sum(float(c) * times[i - j] for j, c in enumerate(row)) == pytest.approx(line, rel=5e-5)


def test_deis_rhoab_is_adams_bashforth_in_sigma() -> None:
    table = deis_coefficients(GRID.double(), max_order=3, mode="rhoab")
    for i, row in enumerate(table[1:-1], start=1):
        s, s_next = float(GRID[i]), float(GRID[i + 1])
        nodes = [float(GRID[i - j]) for j in range(len(row))]
        for degree in range(len(row)):  # exact for polynomials below the order
            exact = (s_next ** (degree + 1) - s ** (degree + 1)) / (degree + 1)
            assert sum(float(c) * n**degree for c, n in zip(row, nodes, strict=True)) == pytest.approx(
                exact, rel=1e-9
            )


def test_deis_rejects_unknown_modes_and_orders() -> None:
    with pytest.raises(ValueError, match="deis_mode"):
        deis_coefficients(GRID, 3, mode="nope")
    with pytest.raises(ValueError, match="max_order"):
        deis_coefficients(GRID, 5)


def test_ipndm_v_weights_reduce_to_adams_bashforth_on_a_uniform_grid() -> None:
    uniform = torch.linspace(10, 2, 9, dtype=torch.float64)
    for order in (1, 2, 3):
        numerators, denominator = ADAMS_BASHFORTH[order - 1]
        expected = [n / denominator for n in numerators]
        assert [float(w) for w in ipndm_v_weights(uniform, 4, order)] == pytest.approx(expected, rel=1e-12)
    # Order 4 as the reference writes it (zju-pi/diff-sampler via ComfyUI) is not AB4's (55, −59, 37, −9)/24;
    # pinned so that changing it is a deliberate break with ComfyUI.
    assert [float(w) for w in ipndm_v_weights(uniform, 4, 4)] == pytest.approx(
        [57 / 24, -65 / 24, 43 / 24, -11 / 24]
    )


def test_ipndm_v_second_order_weights_integrate_lines_on_any_grid() -> None:
    grid = torch.tensor([10.0, 7.0, 5.5, 3.0], dtype=torch.float64)
    w0, w1 = (float(w) for w in ipndm_v_weights(grid, 2, 2))
    h = float(grid[3] - grid[2])
    for degree in (0, 1):
        exact = (float(grid[3]) ** (degree + 1) - float(grid[2]) ** (degree + 1)) / (degree + 1)
        assert h * (w0 * float(grid[2]) ** degree + w1 * float(grid[1]) ** degree) == pytest.approx(exact)


@pytest.mark.parametrize("tau", [0.0, 0.7])
def test_sa_solver_moments_and_weights_match_quadrature(tau: float) -> None:
    lambdas = torch.tensor([-2.1, -1.3, -0.8, -0.2], dtype=torch.float64)
    lam_s, lam_t, sigma_next = (
        lambdas[-1],
        torch.tensor(0.4, dtype=torch.float64),
        torch.tensor(0.67, dtype=torch.float64),
    )
    k = 1 + tau**2
    grid = np.linspace(float(lam_s), float(lam_t), 400_001)
    kernel = k * np.exp(k * (grid - float(lam_t)))
    moments = exponential_moments(lam_s, lam_t, 4, tau)
    for p in range(4):
        assert float(moments[p]) == pytest.approx(np.trapezoid(kernel * grid**p, grid), rel=1e-8, abs=1e-10)
    weights = adams_weights(sigma_next, lambdas, lam_s, lam_t, tau)
    alpha_t = float(sigma_next) * math.exp(float(lam_t))
    nodes = lambdas.numpy()
    for i in range(4):
        basis = np.prod([(grid - nodes[j]) / (nodes[i] - nodes[j]) for j in range(4) if j != i], axis=0)
        assert float(weights[i]) == pytest.approx(
            alpha_t * np.trapezoid(kernel * basis, grid), rel=1e-7, abs=1e-9
        )


def test_sa_solver_simple_order_2_weights_sum_to_the_first_order_weight() -> None:
    lambdas = torch.tensor([-1.0, -0.4])
    lam_t, sigma_next = torch.tensor(0.3), torch.tensor(0.74)
    total = float(sigma_next * lam_t.exp() * -torch.expm1(-(lam_t - lambdas[-1]) * 1.25))
    for corrector in (False, True):
        w = adams_weights(
            sigma_next, lambdas, lambdas[-1], lam_t, 0.5, simple_order_2=True, corrector=corrector
        )
        assert float(w.sum()) == pytest.approx(total, rel=1e-6)


def d_gauss(x: torch.Tensor, sigma: float, scale: float = 0.5) -> torch.Tensor:
    return x * scale**2 / (scale**2 + sigma**2)


@pytest.mark.parametrize("variant", ["bh1", "bh2"])
def test_unipc_two_steps_match_the_hand_derived_update(variant: str) -> None:
    """σ₀ → σ₁ → 0 (run to 0.001): step 1 is the order-1 predictor plus the ρ = ½ corrector, step 2 the
    order-1 predictor alone. In σ-space with h = log(σ/σ'): x' = (σ'/σ)x + (1 − e^(−h))D + c·(D' − D)/2 with
    c = h (bh1) or 1 − e^(−h) (bh2), D' the prediction at the *predicted* point, which is also the history
    the next step uses (UniPC spends no extra model call on the corrected point)."""
    s0, s1, s2 = 6.0, 1.2, 0.001
    x = start_noise(EPS, s0, (1, 4, 8, 8)).double()
    out = sample_unipc(
        GaussianToy(EPS), x, torch.tensor([s0, s1, 0.0], dtype=torch.float64), {}, variant=variant
    )

    def predictor(z: torch.Tensor, sa: float, sb: float, denoised: torch.Tensor) -> torch.Tensor:
        return (sb / sa) * z + (1 - math.exp(-math.log(sa / sb))) * denoised

    h1 = math.log(s0 / s1)
    d0 = d_gauss(x, s0)
    x1_predicted = predictor(x, s0, s1, d0)
    d1 = d_gauss(x1_predicted, s1)
    c = h1 if variant == "bh1" else 1 - math.exp(-h1)
    x1 = x1_predicted + c * 0.5 * (d1 - d0)
    expected = predictor(x1, s1, s2, d1)
    torch.testing.assert_close(out, expected, rtol=1e-9, atol=1e-9)


def test_unipc_variants_differ_and_both_converge() -> None:
    sigmas = karras(12)
    x = start_noise(EPS, float(sigmas[0]), (1, 4, 8, 8)).double()
    bh1 = sample_unipc(GaussianToy(EPS), x, sigmas.double(), {})
    bh2 = sample_unipc_bh2(GaussianToy(EPS), x, sigmas.double(), {})
    exact = x * (math.sqrt(0.25 + 0.001**2) / math.sqrt(0.25 + float(sigmas[0]) ** 2))  # the ODE to σ = 0.001
    assert not torch.allclose(bh1, bh2, rtol=0, atol=1e-6)
    assert float((bh1 - exact).abs().max()) < 0.05 and float((bh2 - exact).abs().max()) < 0.05


def test_unipc_model_calls_one_per_sigma_but_the_last() -> None:
    sigmas = karras(9)  # 10 sigmas: 9 steps, order 3
    model = GaussianToy(EPS)
    sample_unipc(model, start_noise(EPS, float(sigmas[0]), (1, 4, 8, 8)), sigmas, {})
    assert model.calls == 9


def test_unipc_single_step_integrates_nothing_like_comfyui() -> None:
    """Two sigmas give order min(3, 0) = 0: ComfyUI evaluates the model once and returns the start, only
    rescaled by √(1 + σ_last²)/√(1 + σ₀²) (σ_last = 0.001 when the schedule ends at 0)."""
    x = torch.randn(1, 4, 8, 8, dtype=torch.float64) * 14.6
    out = sample_unipc(GaussianToy(EPS), x, torch.tensor([14.6, 0.0], dtype=torch.float64), {})
    torch.testing.assert_close(out, x * math.sqrt(1 + 0.001**2) / math.sqrt(1 + 14.6**2))


def test_unipc_rejects_unknown_variants() -> None:
    with pytest.raises(ValueError, match="variant"):
        sample_unipc(GaussianToy(EPS), torch.randn(1, 4, 8, 8), karras(4), {}, variant="bh3")
