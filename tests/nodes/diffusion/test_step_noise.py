"""Per-step noise of the samplers beyond the Euler / DPM families: drawn where ComfyUI draws it (so seeded
runs line up draw for draw), from the seed + 1 generator by default, and reproducible."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from nodes.diffusion.k_seeds import er_sde_options
from nodes.diffusion.sa_solver import sa_solver_options, tau_interval
from tests.nodes.diffusion.gaussian_toys import (
    EPS,
    FLOW,
    CountingNoise,
    GaussianToy,
    GuidedToy,
    flow_sigmas,
    karras,
    start_noise,
)
from tests.nodes.diffusion.sampler_groups import OTHER_SAMPLERS

torch.set_num_threads(1)

SHAPE = (1, 4, 8, 8)


def toy(name: str, sampling: Any) -> Any:
    return GuidedToy(sampling) if "cfg_pp" in name else GaussianToy(sampling)


def draws(name: str, sigmas: torch.Tensor, **options: Any) -> list[tuple[float, float]]:
    noise = CountingNoise(SHAPE)
    x = start_noise(EPS, float(sigmas[0]), SHAPE)
    OTHER_SAMPLERS[name](toy(name, EPS), x, sigmas, {"seed": 4}, noise_sampler=noise, **options)
    return noise.calls


SIGMAS = karras(5)  # 5 steps, the last one to 0
STEPS = [(float(SIGMAS[i]), float(SIGMAS[i + 1])) for i in range(4)]  # the steps that end above 0


@pytest.mark.parametrize(
    "name",
    [
        "euler_ancestral_cfg_pp",
        "dpmpp_2s_ancestral_cfg_pp",
        "res_multistep",
        "res_multistep_cfg_pp",
        "res_multistep_ancestral",
        "res_multistep_ancestral_cfg_pp",
        "er_sde",
    ],
)
def test_one_draw_per_step_that_ends_above_zero(name: str) -> None:
    # res_multistep draws even with η = 0 (the noise is scaled by σ_up = 0), as ComfyUI does.
    assert draws(name, SIGMAS) == STEPS


def test_dpmpp_2s_ancestral_cfg_pp_draws_even_without_ancestral_noise() -> None:
    assert draws("dpmpp_2s_ancestral_cfg_pp", SIGMAS, eta=0.0) == STEPS


@pytest.mark.parametrize(("name", "stages"), [("seeds_2", 2), ("exp_heun_2_x0_sde", 2), ("seeds_3", 3)])
def test_seeds_draw_once_per_stage_along_the_step(name: str, stages: int) -> None:
    calls = draws(name, SIGMAS)
    assert len(calls) == stages * len(STEPS)
    for k, (sigma, sigma_next) in enumerate(STEPS):
        segment = calls[k * stages : (k + 1) * stages]
        assert segment[0][0] == pytest.approx(sigma) and segment[-1][1] == pytest.approx(sigma_next)
        assert all(
            a[1] == pytest.approx(b[0]) for a, b in zip(segment, segment[1:], strict=False)
        )  # contiguous
        assert all(s >= t - 1e-5 for s, t in segment)  # exp_heun (r = 1) ends with a zero-length segment


@pytest.mark.parametrize(
    ("name", "options"),
    [
        ("seeds_2", {"eta": 0.0}),
        ("seeds_3", {"s_noise": 0.0}),
        ("er_sde", er_sde_options("ODE")),
        ("euler_ancestral_cfg_pp", {"eta": 0.0}),
        ("sa_solver", {"tau_func": tau_interval(100.0, 50.0)}),  # the SDE window lies above every sigma
    ],
)
def test_deterministic_settings_draw_nothing(name: str, options: dict[str, Any]) -> None:
    assert draws(name, SIGMAS, **options) == []


@pytest.mark.parametrize(
    "name",
    [
        "euler_cfg_pp",
        "exp_heun_2_x0",
        "ipndm",
        "ipndm_v",
        "deis",
        "res_multistep",
        "gradient_estimation",
        "uni_pc",
        "uni_pc_bh2",
        "dpmpp_2m_cfg_pp",
    ],
)
def test_deterministic_samplers_ignore_the_seed(name: str) -> None:
    x = start_noise(EPS, float(SIGMAS[0]), SHAPE)
    a = OTHER_SAMPLERS[name](toy(name, EPS), x, SIGMAS, {"seed": 1})
    b = OTHER_SAMPLERS[name](toy(name, EPS), x, SIGMAS, {"seed": 2})
    assert torch.equal(a, b)


def test_sa_solver_draws_only_inside_its_sde_window() -> None:
    options = sa_solver_options(EPS, eta=1.0, sde_start_percent=0.2, sde_end_percent=0.8)
    tau = options.pop("tau_func")
    calls = draws("sa_solver", SIGMAS, tau_func=tau, **options)
    assert calls == [(s, t) for s, t in STEPS if tau(torch.tensor(t)) > 0]
    assert 0 < len(calls) < len(STEPS)


STOCHASTIC = [
    "euler_ancestral_cfg_pp",
    "dpmpp_2s_ancestral_cfg_pp",
    "res_multistep_ancestral",
    "res_multistep_ancestral_cfg_pp",
    "exp_heun_2_x0_sde",
    "seeds_2",
    "seeds_3",
    "er_sde",
    "sa_solver",
    "sa_solver_pece",
]


@pytest.mark.parametrize("sampling", [EPS, FLOW], ids=["eps", "flow"])
@pytest.mark.parametrize("name", STOCHASTIC)
def test_seeded_runs_reproduce_and_seeds_differ(name: str, sampling: Any) -> None:
    sigmas = karras(6) if sampling is EPS else flow_sigmas(6)
    x = start_noise(sampling, float(sigmas[0]), SHAPE)
    first = OTHER_SAMPLERS[name](toy(name, sampling), x, sigmas, {"seed": 123})
    again = OTHER_SAMPLERS[name](toy(name, sampling), x, sigmas, {"seed": 123})
    other = OTHER_SAMPLERS[name](toy(name, sampling), x, sigmas, {"seed": 124})
    assert torch.equal(first, again)
    assert not torch.allclose(first, other)


@pytest.mark.parametrize("name", STOCHASTIC)
def test_default_noise_is_the_seed_plus_one_generator(name: str) -> None:
    x = start_noise(EPS, float(SIGMAS[0]), SHAPE)
    seeded = OTHER_SAMPLERS[name](toy(name, EPS), x, SIGMAS, {"seed": 41})
    explicit = OTHER_SAMPLERS[name](
        toy(name, EPS), x, SIGMAS, {"seed": 0}, noise_sampler=CountingNoise(SHAPE, seed=42)
    )
    assert torch.equal(seeded, explicit)
