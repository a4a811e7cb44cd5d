"""Schedulers: ComfyUI's 8-step SD1.5 schedules, KSampler's step rules and the scheduler-node functions.

The table is /work/shared/research/comfyui-sampling-facts.md section 6.2, measured with ComfyUI.
"""

from __future__ import annotations

import fnmatch
import math
import tomllib
from pathlib import Path

import pytest
import torch

from nodes.diffusion import model_sampling as ms
from nodes.diffusion import schedulers as sch
from nodes.diffusion.schedulers import SchedulerError

# scheduler: (sigma_0 .. sigma_8 to 4 decimals, UNet timesteps of sigma_0 .. sigma_7)
SD15_8_STEPS = {
    "normal": ("14.6146 6.6780 3.5221 2.0606 1.2768 0.7913 0.4397 0.0292 0", "999 856 714 571 428 285 143 0"),
    "karras": ("14.6146 7.9029 4.0277 1.9104 0.8289 0.3211 0.1072 0.0292 0", "999 890 746 549 299 90 12 0"),
    "exponential": (
        "14.6146 6.0130 2.4739 1.0179 0.4188 0.1723 0.0709 0.0292 0",
        "999 835 622 359 133 31 5 0",
    ),
    "sgm_uniform": (
        "14.6146 7.3020 4.0861 2.4960 1.6156 1.0712 0.6952 0.3997 0",
        "999 874 749 624 500 375 250 125",
    ),
    "simple": (
        "14.6146 7.2974 4.0817 2.4925 1.6129 1.0690 0.6932 0.3977 0",
        "999 874 749 624 499 374 249 124",
    ),
    "ddim_uniform": (
        "7.3718 4.1167 2.5109 1.6237 1.0760 0.6984 0.4022 0.0413 0",
        "876 751 626 501 376 251 126 1",
    ),
    "beta": ("14.6146 10.4835 5.6866 2.9636 1.6183 0.9198 0.5154 0.2433 0", "999 942 823 670 500 329 176 57"),
    "linear_quadratic": (
        "14.6146 14.5233 14.4320 14.3406 14.2493 13.2902 10.5956 6.1656 0",
        "999 998 997 996 995 983 944 840",
    ),
    "kl_optimal": (
        "14.6146 3.4935 1.8781 1.1879 0.7770 0.4832 0.2443 0.0292 0",
        "999 712 544 406 280 162 57 0",
    ),
}


@pytest.fixture(scope="module")
def sd15() -> ms.ModelSampling:
    return ms.discrete()


def test_scheduler_names_in_comfyui_order() -> None:
    assert sch.SCHEDULER_NAMES == [
        "simple",
        "sgm_uniform",
        "karras",
        "exponential",
        "ddim_uniform",
        "beta",
        "normal",
        "linear_quadratic",
        "kl_optimal",
    ]


@pytest.mark.parametrize("name", list(SD15_8_STEPS))
def test_sd15_eight_step_schedules_match_comfyui(sd15: ms.ModelSampling, name: str) -> None:
    sigmas_text, timesteps_text = SD15_8_STEPS[name]
    expected = torch.tensor([float(v) for v in sigmas_text.split()])
    sigmas = sch.calculate_sigmas(sd15, name, 8)
    assert sigmas.dtype == torch.float32 and sigmas.shape == (9,)
    # 4 decimals (the facts table's sgm_uniform 0.6952 is 0.69515 rounded up, hence 1e-4 + rounding)
    assert torch.allclose(sigmas, expected, atol=1.01e-4, rtol=0), sigmas.tolist()
    assert sd15.timestep(sigmas[:-1]).tolist() == [int(t) for t in timesteps_text.split()]


def test_ddim_uniform_six_steps_gives_seven(sd15: ms.ModelSampling) -> None:
    sigmas = sch.calculate_sigmas(sd15, "ddim_uniform", 6)
    assert len(sigmas) == 8
    assert sd15.timestep(sigmas[:-1]).tolist() == [997, 831, 665, 499, 333, 167, 1]


def test_simple_floors_where_diffusers_rounds(sd15: ms.ModelSampling) -> None:
    sigmas = sch.calculate_sigmas(sd15, "simple", 6)
    assert sd15.timestep(sigmas[:-1]).tolist() == [999, 833, 666, 499, 333, 166]


def test_ksampler_drops_the_penultimate_sigma_for_dpm2_and_unipc(sd15: ms.ModelSampling) -> None:
    nine = sch.calculate_sigmas(sd15, "karras", 9)
    for sampler in ("dpm_2", "dpm_2_ancestral", "uni_pc", "uni_pc_bh2"):
        sigmas = sch.ksampler_sigmas(sd15, "karras", sampler, 8)
        assert torch.equal(sigmas, torch.cat([nine[:-2], nine[-1:]])), sampler
    assert torch.equal(
        sch.ksampler_sigmas(sd15, "karras", "euler", 8), sch.calculate_sigmas(sd15, "karras", 8)
    )
    assert sch.DISCARD_PENULTIMATE_SIGMA_SAMPLERS == {"dpm_2", "dpm_2_ancestral", "uni_pc", "uni_pc_bh2"}


def test_ksampler_denoise_keeps_the_tail_of_a_longer_schedule(sd15: ms.ModelSampling) -> None:
    thirteen = sch.calculate_sigmas(sd15, "karras", 13)  # int(8 / 0.6) = 13
    assert torch.equal(sch.ksampler_sigmas(sd15, "karras", "dpmpp_2m", 8, 0.6), thirteen[-9:])
    assert sch.ksampler_sigmas(sd15, "karras", "euler", 8, 0.0).numel() == 0
    assert torch.equal(
        sch.ksampler_sigmas(sd15, "normal", "euler", 8, 0.99995), sch.calculate_sigmas(sd15, "normal", 8)
    )
    assert torch.equal(sch.basic_scheduler_sigmas(sd15, "karras", 8, 0.6), thirteen[-9:])


def test_karras_and_exponential_formulas() -> None:
    rho, lo, hi = 7.0, 0.03, 14.6
    expected = [(hi ** (1 / rho) + r / 4 * (lo ** (1 / rho) - hi ** (1 / rho))) ** rho for r in range(5)]
    assert torch.allclose(sch.karras(5, lo, hi, rho), torch.tensor([*expected, 0.0]), rtol=1e-5)
    expected_exp = [math.exp(math.log(hi) + r / 4 * (math.log(lo) - math.log(hi))) for r in range(5)]
    assert torch.allclose(sch.exponential(5, lo, hi), torch.tensor([*expected_exp, 0.0]), rtol=1e-5)
    assert torch.allclose(sch.polyexponential(5, lo, hi, rho=1.0), sch.exponential(5, lo, hi), rtol=1e-5)


def test_node_schedules() -> None:
    vp = sch.vp(3, beta_d=19.9, beta_min=0.1, eps_s=1e-3)
    assert (
        float(vp[0]) == pytest.approx(math.sqrt(math.expm1(19.9 / 2 + 0.1)), rel=1e-5) and float(vp[-1]) == 0
    )
    laplace = sch.laplace(5, 0.03, 14.6)
    assert laplace.tolist() == pytest.approx(
        [14.6, math.sqrt(2), 1.0, math.sqrt(0.5), 0.03], rel=1e-4
    )  # clamped, no 0
    kl = sch.kl_optimal(3, 0.03, 14.6)
    assert float(kl[1]) == pytest.approx(math.tan((math.atan(0.03) + math.atan(14.6)) / 2), rel=1e-5)
    assert sch.kl_optimal(1, 0.03, 14.6).tolist() == pytest.approx([14.6, 0.0])


def test_sd_turbo_timesteps(sd15: ms.ModelSampling) -> None:
    sigmas = sch.sd_turbo(sd15, 3, denoise=1.0)
    assert sd15.timestep(sigmas[:-1]).tolist() == [999, 899, 799] and float(sigmas[-1]) == 0
    assert sd15.timestep(sch.sd_turbo(sd15, 2, denoise=0.5)[:-1]).tolist() == [499, 399]


def test_align_your_steps_uses_the_ten_decimal_table() -> None:
    sigmas = sch.align_your_steps("SD1", 10)
    assert sigmas.tolist()[:2] == pytest.approx([14.6146412293, 6.4745760956], rel=1e-7)
    assert float(sigmas[-1]) == 0 and len(sigmas) == 11
    interpolated = sch.align_your_steps("SDXL", 20)
    assert len(interpolated) == 21 and float(interpolated[0]) == pytest.approx(14.6146412293, rel=1e-7)
    assert float(interpolated[2]) == pytest.approx(
        6.3184485287, rel=1e-6
    )  # every other point is a table point
    # denoise: the last round(steps * denoise) + 1 values, last set to 0
    assert torch.equal(sch.align_your_steps("SD1", 10, denoise=0.55), sigmas[-7:])  # round(5.5) = 6
    assert sch.align_your_steps("SVD", 10, denoise=0.0).numel() == 0


def test_gits_and_optimal_steps_tables() -> None:
    gits = sch.gits(1.20, 10)
    assert len(gits) == 11 and float(gits[0]) == pytest.approx(14.61464119) and float(gits[-1]) == 0
    assert len(sch.gits(0.80, 2)) == 3 and len(sch.gits(1.5, 30)) == 31
    flux = sch.optimal_steps("FLUX", 10)
    assert flux.tolist()[:3] == pytest.approx([0.9968, 0.9886, 0.9819]) and float(flux[-1]) == 0
    assert len(sch.optimal_steps("Chroma", 20)) == 21
    with pytest.raises(SchedulerError, match="GITS coeff"):
        sch.gits(0.82, 10)


def test_noise_level_tables_are_read_once_and_match_the_model_types() -> None:
    assert tuple(sch.ays_noise_levels()) == sch.AYS_MODEL_TYPES
    assert tuple(sch.optimal_steps_noise_levels()) == sch.OPTIMAL_STEPS_MODEL_TYPES
    assert all(len(levels) == 11 for levels in sch.ays_noise_levels().values())
    gits = sch.gits_noise_levels()
    assert sch.gits_noise_levels() is gits  # cached
    assert list(gits) == [round(0.80 + 0.05 * i, 2) for i in range(15)]
    for rows in gits.values():
        assert [len(row) for row in rows] == list(range(3, 22))  # 2..20 steps, steps + 1 values each
        assert all(row[0] == 14.61464119 and row[-1] == 0.02916753 for row in rows)
        assert all(list(row) == sorted(row, reverse=True) for row in rows)
    with pytest.raises(TypeError):
        gits[0.80] = ()  # type: ignore[index]


def test_noise_level_tables_ship_as_package_data() -> None:
    root = Path(__file__).resolve().parents[3]
    package_data = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    tables = sorted((root / "nodes" / "diffusion" / "data").glob("*.json"))
    assert [t.name for t in tables] == [
        "ays_noise_levels.json",
        "gits_noise_levels.json",
        "optimal_steps_noise_levels.json",
    ]
    for table in tables:  # some package's pattern (relative to that package's folder) covers the file
        covered = [
            package
            for package, patterns in package_data.items()
            if table.is_relative_to(root.joinpath(*package.split(".")))
            and any(
                fnmatch.fnmatch(table.relative_to(root.joinpath(*package.split("."))).as_posix(), pattern)
                for pattern in patterns
            )
        ]
        assert covered, f"{table.name} is not in pyproject.toml's package-data"


def test_flow_model_schedules_end_at_zero() -> None:
    sd3 = ms.flow(shift=3.0)
    for name in sch.SCHEDULER_NAMES:
        sigmas = sch.calculate_sigmas(sd3, name, 6)
        assert float(sigmas[-1]) == 0.0 and float(sigmas[0]) <= 1.0 + 1e-6, name
        assert bool((sigmas[1:] <= sigmas[:-1]).all()), name


def test_unknown_scheduler_lists_the_names(sd15: ms.ModelSampling) -> None:
    with pytest.raises(SchedulerError, match="unknown scheduler 'linear'.*simple, sgm_uniform"):
        sch.calculate_sigmas(sd15, "linear", 8)
    with pytest.raises(SchedulerError, match="at least 1"):
        sch.calculate_sigmas(sd15, "karras", 0)
