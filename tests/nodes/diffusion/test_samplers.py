"""The Euler, DPM and DPM++ samplers on a toy denoiser with a known answer (tests/nodes/diffusion/toy.py).

Golden values come from re-deriving each update by hand on the linear toy denoiser D = c(sigma) x,
where a whole run is a scalar recursion; noise draw points are checked with recording noise samplers.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from nodes.diffusion import model_sampling as ms
from nodes.diffusion import schedulers as sch
from nodes.diffusion.k_dpm import sample_dpm_adaptive
from nodes.diffusion.k_euler import sample_euler, sample_euler_ancestral, sample_lms
from nodes.diffusion.noise import default_noise_sampler
from tests.nodes.diffusion.sampler_groups import EULER_DPM_SAMPLERS
from tests.nodes.diffusion.toy import DATA_STD, ToyDenoiser, start_noise

EPS = ms.discrete()
FLOW = ms.flow(shift=3.0)
ANCESTRAL = ("euler_ancestral", "dpm_2_ancestral", "dpmpp_2s_ancestral", "ddpm", "lcm")
BROWNIAN = ("dpmpp_sde", "dpmpp_2m_sde", "dpmpp_2m_sde_heun", "dpmpp_3m_sde")
CONVERGING = sorted(name for name in EULER_DPM_SAMPLERS if name != "lcm" and not name.endswith("_gpu"))
"""lcm keeps jumping to the posterior mean (its golden path is checked instead); the _gpu twins equal
their CPU samplers on CPU (checked below)."""


@pytest.fixture(autouse=True)
def _quiet_torchsde() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        yield


def run(
    name: str,
    sampling: ms.ModelSampling,
    steps: int,
    seed: int = 1,
    scheduler: str = "karras",
    **options: Any,
) -> tuple[torch.Tensor, ToyDenoiser, torch.Tensor]:
    sigmas = sch.ksampler_sigmas(sampling, scheduler, name, steps)
    model = ToyDenoiser(sampling)
    x = start_noise((2, 4, 32, 32), seed=0) * sigmas[0]
    out = EULER_DPM_SAMPLERS[name](
        model, x, sigmas, extra_args={"seed": seed, "model_options": {}}, **options
    )
    return out, model, sigmas


def toy_c(sigma: float, flow: bool = False) -> float:
    s2 = DATA_STD**2
    if flow:
        return (1 - sigma) * s2 / ((1 - sigma) ** 2 * s2 + sigma**2)
    return s2 / (s2 + sigma**2)


def test_euler_dpm_sampler_set() -> None:
    assert sorted(EULER_DPM_SAMPLERS) == sorted(
        [
            "euler",
            "euler_ancestral",
            "heun",
            "heunpp2",
            "lms",
            "ddpm",
            "lcm",
            "dpm_2",
            "dpm_2_ancestral",
            "dpm_fast",
            "dpm_adaptive",
            "dpmpp_2s_ancestral",
            "dpmpp_sde",
            "dpmpp_sde_gpu",
            "dpmpp_2m",
            "dpmpp_2m_sde",
            "dpmpp_2m_sde_gpu",
            "dpmpp_2m_sde_heun",
            "dpmpp_2m_sde_heun_gpu",
            "dpmpp_3m_sde",
            "dpmpp_3m_sde_gpu",
        ]
    )


@pytest.mark.parametrize("name", CONVERGING)
def test_eps_samplers_reach_the_data_distribution(name: str) -> None:
    out, _, _ = run(name, EPS, 40)
    tolerance = (
        0.06 if name in ("euler_ancestral", "ddpm") else 0.025
    )  # first-order ancestral converges slowly
    assert out.shape == (2, 4, 32, 32) and bool(torch.isfinite(out).all())
    assert float(out.std()) == pytest.approx(DATA_STD, abs=tolerance)


@pytest.mark.parametrize("name", CONVERGING)
def test_flow_samplers_reach_the_data_distribution(name: str) -> None:
    out, _, _ = run(name, FLOW, 40, scheduler="simple")
    assert bool(torch.isfinite(out).all())
    assert float(out.std()) == pytest.approx(DATA_STD, abs=0.08)


def test_euler_golden_recursion() -> None:
    out, model, sigmas = run("euler", EPS, 6)
    factor = 1.0
    s = [float(v) for v in sigmas]
    for i in range(len(s) - 1):
        factor *= 1 + (1 - toy_c(s[i])) / s[i] * (s[i + 1] - s[i])
    x = start_noise((2, 4, 32, 32), seed=0) * sigmas[0]
    assert torch.allclose(out, x * factor, rtol=1e-4, atol=1e-6)
    assert model.calls == 6


def test_heun_golden_recursion_and_final_euler_step() -> None:
    out, model, sigmas = run("heun", EPS, 5)
    s, factor = [float(v) for v in sigmas], 1.0
    for i in range(len(s) - 1):
        dt = s[i + 1] - s[i]
        d = (1 - toy_c(s[i])) / s[i]
        if s[i + 1] == 0:
            factor *= 1 + d * dt
            continue
        x2 = 1 + d * dt
        d2 = x2 * (1 - toy_c(s[i + 1])) / s[i + 1]
        factor *= 1 + (d + d2) / 2 * dt
    x = start_noise((2, 4, 32, 32), seed=0) * sigmas[0]
    assert torch.allclose(out, x * factor, rtol=1e-4, atol=1e-6)
    assert model.calls == 2 * 5 - 1


def test_dpmpp_2m_golden_recursion() -> None:
    out, _, sigmas = run("dpmpp_2m", EPS, 6)
    s = [float(v) for v in sigmas]
    x, old_denoised = 1.0, None
    for i in range(len(s) - 1):
        denoised = toy_c(s[i]) * x
        if s[i + 1] == 0:
            x = denoised
        else:
            h = math.log(s[i]) - math.log(s[i + 1])
            used = denoised
            if old_denoised is not None:
                r = (math.log(s[i - 1]) - math.log(s[i])) / h
                used = (1 + 1 / (2 * r)) * denoised - 1 / (2 * r) * old_denoised
            x = s[i + 1] / s[i] * x - math.expm1(-h) * used
        old_denoised = denoised
    start = start_noise((2, 4, 32, 32), seed=0) * sigmas[0]
    assert torch.allclose(out, start * x, rtol=1e-4, atol=1e-6)


def test_lcm_golden_path_with_seed_plus_one_noise() -> None:
    out, _, sigmas = run("lcm", EPS, 4, seed=10)
    generator = torch.Generator().manual_seed(11)
    x = start_noise((2, 4, 32, 32), seed=0).double() * float(sigmas[0])
    s = [float(v) for v in sigmas]
    for i in range(len(s) - 1):
        x = toy_c(s[i]) * x
        if s[i + 1] > 0:
            x = x + s[i + 1] * torch.randn([2, 4, 32, 32], generator=generator).double()
    assert torch.allclose(out.double(), x, rtol=1e-4, atol=1e-5)


class RecordingNoise:
    """A noise sampler drawing like default_noise_sampler(x, seed) and recording each query."""

    def __init__(self, x: torch.Tensor, seed: int) -> None:
        self.generator = torch.Generator().manual_seed(seed + 1)
        self.shape = x.shape
        self.queries: list[tuple[float, float]] = []

    def __call__(self, sigma: torch.Tensor, sigma_next: torch.Tensor) -> torch.Tensor:
        self.queries.append((float(sigma), float(sigma_next)))
        return torch.randn(self.shape, generator=self.generator)


@pytest.mark.parametrize("sampling", [EPS, FLOW], ids=["eps", "flow"])
@pytest.mark.parametrize("name", ANCESTRAL)
def test_ancestral_samplers_draw_once_per_noisy_step_from_seed_plus_one(
    name: str, sampling: ms.ModelSampling
) -> None:
    scheduler = "karras" if sampling is EPS else "simple"
    default, _, sigmas = run(name, sampling, 7, seed=21, scheduler=scheduler)
    x = start_noise((2, 4, 32, 32), seed=0) * sigmas[0]
    recorder = RecordingNoise(x, seed=21)
    recorded = EULER_DPM_SAMPLERS[name](
        ToyDenoiser(sampling), x, sigmas, extra_args={"seed": 21}, noise_sampler=recorder
    )
    assert torch.equal(default, recorded)
    noisy_steps = [
        (float(sigmas[i]), float(sigmas[i + 1])) for i in range(len(sigmas) - 1) if sigmas[i + 1] > 0
    ]
    assert recorder.queries == noisy_steps
    other_seed, _, _ = run(name, sampling, 7, seed=22, scheduler=scheduler)
    assert not torch.allclose(default, other_seed)


def test_ancestral_with_eta_zero_is_euler() -> None:
    for sampling, scheduler in ((EPS, "karras"), (FLOW, "simple")):
        sigmas = sch.calculate_sigmas(sampling, scheduler, 6)
        x = start_noise((1, 4, 8, 8)) * sigmas[0]
        euler = sample_euler(ToyDenoiser(sampling), x, sigmas)
        ancestral = sample_euler_ancestral(ToyDenoiser(sampling), x, sigmas, extra_args={"seed": 3}, eta=0.0)
        assert torch.allclose(euler, ancestral, rtol=1e-5, atol=1e-6), sampling.kind


def test_lms_of_order_one_is_euler() -> None:
    sigmas = sch.calculate_sigmas(EPS, "exponential", 6)
    x = start_noise((1, 4, 8, 8)) * sigmas[0]
    assert torch.allclose(
        sample_lms(ToyDenoiser(EPS), x, sigmas, order=1),
        sample_euler(ToyDenoiser(EPS), x, sigmas),
        rtol=1e-4,
        atol=1e-6,
    )


@pytest.mark.parametrize("name", BROWNIAN)
def test_sde_samplers_query_the_brownian_tree_at_comfyui_points(name: str) -> None:
    sigmas = sch.calculate_sigmas(EPS, "karras", 5)
    x = start_noise((1, 4, 8, 8)) * sigmas[0]
    recorder = RecordingNoise(x, seed=0)
    EULER_DPM_SAMPLERS[name](ToyDenoiser(EPS), x, sigmas, extra_args={"seed": 0}, noise_sampler=recorder)
    s = [float(v) for v in sigmas]
    expected = []
    for i in range(len(s) - 2):  # the last step (to 0) returns the denoised prediction
        if name == "dpmpp_sde":  # half step at the geometric mean of sigma_i and sigma_i+1 first
            expected.append((s[i], pytest.approx(math.sqrt(s[i] * s[i + 1]), rel=1e-5)))
        expected.append((s[i], s[i + 1]))
    assert recorder.queries == expected


@pytest.mark.parametrize("name", BROWNIAN)
def test_sde_samplers_are_reproducible_per_seed_and_gpu_twins_agree_on_cpu(name: str) -> None:
    first, _, _ = run(name, EPS, 6, seed=5)
    again, _, _ = run(name, EPS, 6, seed=5)
    twin, _, _ = run(f"{name}_gpu", EPS, 6, seed=5)
    other, _, _ = run(name, EPS, 6, seed=6)
    assert torch.equal(first, again) and torch.equal(first, twin)
    assert not torch.allclose(first, other)


def test_callback_reports_each_step() -> None:
    seen: list[dict[str, Any]] = []
    sigmas = sch.calculate_sigmas(EPS, "normal", 4)
    x = start_noise((1, 4, 8, 8)) * sigmas[0]
    EULER_DPM_SAMPLERS["dpmpp_2m"](ToyDenoiser(EPS), x, sigmas, callback=seen.append)
    assert [info["i"] for info in seen] == [0, 1, 2, 3]
    assert set(seen[0]) >= {"x", "i", "sigma", "sigma_hat", "denoised"}
    assert float(seen[1]["sigma"]) == float(sigmas[1])


def test_dpm_fast_uses_one_model_call_per_step_and_dpm_adaptive_reports_its_work() -> None:
    out, model, sigmas = run("dpm_fast", EPS, 9)
    assert model.calls == 9 and bool(torch.isfinite(out).all())
    assert model.sigmas_seen[0] == pytest.approx(float(sigmas[0]), rel=1e-5)
    x = start_noise((1, 4, 8, 8)) * 14.6
    _, info = sample_dpm_adaptive(ToyDenoiser(EPS), x, 0.03, 14.6, return_info=True)
    assert info["nfe"] == 3 * info["steps"] and info["n_accept"] > 0
    with pytest.raises(ValueError, match="positive sigma_min"):
        sample_dpm_adaptive(ToyDenoiser(EPS), x, 0.0, 14.6)


def test_single_sigma_runs_return_the_input() -> None:
    x = start_noise((1, 4, 8, 8))
    for name in ("dpm_fast", "dpm_adaptive", *BROWNIAN):
        assert torch.equal(EULER_DPM_SAMPLERS[name](ToyDenoiser(EPS), x, torch.tensor([1.0])), x), name


def test_default_noise_sampler_is_what_ancestral_samplers_use() -> None:
    sigmas = sch.calculate_sigmas(EPS, "karras", 4)
    x = start_noise((1, 4, 8, 8)) * sigmas[0]
    explicit = sample_euler_ancestral(
        ToyDenoiser(EPS), x, sigmas, noise_sampler=default_noise_sampler(x, seed=8)
    )
    implicit = sample_euler_ancestral(ToyDenoiser(EPS), x, sigmas, extra_args={"seed": 8})
    assert torch.equal(explicit, implicit)
