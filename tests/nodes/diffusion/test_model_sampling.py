"""ModelSampling: the SD1.5 training table, sigma <-> timestep maps and each prediction's formulas."""

from __future__ import annotations

import math

import pytest
import torch

from nodes.diffusion import model_sampling as ms
from nodes.diffusion.model_sampling import ModelSamplingError


@pytest.fixture(scope="module")
def sd15() -> ms.ModelSampling:
    return ms.discrete()


def test_sd15_table_is_float32_from_float64_betas(sd15: ms.ModelSampling) -> None:
    betas = torch.linspace(0.00085**0.5, 0.012**0.5, 1000, dtype=torch.float64) ** 2
    alphas_bar = torch.cumprod(1 - betas, dim=0)
    expected = (((1 - alphas_bar) / alphas_bar) ** 0.5).float()
    assert sd15.sigmas.dtype == torch.float32
    assert torch.equal(sd15.sigmas, expected)
    assert float(sd15.sigma_min) == pytest.approx(0.0291672, rel=1e-5)
    assert float(sd15.sigma_max) == pytest.approx(14.6146412, rel=1e-7)


def test_discrete_timestep_is_the_nearest_table_index_in_log_space(sd15: ms.ModelSampling) -> None:
    table = sd15.sigmas
    assert torch.equal(sd15.timestep(table), torch.arange(1000))
    between = (table[10].log() * 0.4 + table[11].log() * 0.6).exp()  # nearer to index 11 in log space
    assert int(sd15.timestep(between)) == 11
    assert sd15.timestep(torch.tensor([100.0, 1e-4])).tolist() == [999, 0]


def test_discrete_sigma_interpolates_log_sigma(sd15: ms.ModelSampling) -> None:
    table = sd15.sigmas
    assert torch.allclose(sd15.sigma(torch.arange(1000).float()), table, rtol=1e-6)
    geometric_mean = (table[10] * table[11]).sqrt()
    assert float(sd15.sigma(torch.tensor(10.5))) == pytest.approx(float(geometric_mean), rel=1e-6)
    assert float(sd15.sigma(torch.tensor(5000.0))) == pytest.approx(float(table[-1]), rel=1e-6)  # clamped


def test_percent_to_sigma_edges(sd15: ms.ModelSampling) -> None:
    assert sd15.percent_to_sigma(0.0) == 999999999.9
    assert sd15.percent_to_sigma(-1.0) == 999999999.9
    assert sd15.percent_to_sigma(1.0) == 0.0
    assert sd15.percent_to_sigma(0.5) == pytest.approx(float(sd15.sigma(torch.tensor(499.5))), rel=1e-7)


X = torch.tensor([[[[1.0, -2.0]]], [[[0.5, 3.0]]]])  # [2, 1, 1, 2]
OUT = torch.tensor([[[[0.25, 1.0]]], [[[-1.0, 2.0]]]])
SIGMA = torch.tensor([2.0, 0.5])


def per_item(values: list[float]) -> torch.Tensor:
    return torch.tensor(values).reshape(2, 1, 1, 1)


def test_eps_formulas(sd15: ms.ModelSampling) -> None:
    assert torch.allclose(sd15.calculate_input(SIGMA, X), X / per_item([math.sqrt(5), math.sqrt(1.25)]))
    assert torch.allclose(sd15.calculate_denoised(SIGMA, OUT, X), X - OUT * per_item([2.0, 0.5]))
    noise, latent = OUT, X
    assert torch.allclose(
        sd15.noise_scaling(torch.tensor(2.0), noise, latent, max_denoise=True), latent + noise * math.sqrt(5)
    )
    assert torch.allclose(sd15.noise_scaling(torch.tensor(2.0), noise, latent), latent + noise * 2)
    assert torch.equal(sd15.inverse_noise_scaling(torch.tensor(0.0), X), X)


def test_v_prediction_formula() -> None:
    v = ms.discrete("v_prediction")
    expected = X / per_item([5.0, 1.25]) - OUT * per_item([2 / math.sqrt(5), 0.5 / math.sqrt(1.25)])
    assert torch.allclose(v.calculate_denoised(SIGMA, OUT, X), expected)


def test_edm_formula_with_sigma_data() -> None:
    edm = ms.continuous_edm("edm", sigma_data=0.5)
    denom = per_item([4.25, 0.5])
    expected = X * 0.25 / denom + OUT * per_item([2.0, 0.5]) * 0.5 / denom.sqrt()
    assert torch.allclose(edm.calculate_denoised(SIGMA, OUT, X), expected)
    assert torch.allclose(edm.calculate_input(SIGMA, X), X / denom.sqrt())


def test_x0_and_img_to_img() -> None:
    x0 = ms.discrete("x0")
    assert torch.equal(x0.calculate_denoised(SIGMA, OUT, X), OUT)
    assert torch.allclose(x0.calculate_input(SIGMA, X), X / per_item([math.sqrt(5), math.sqrt(1.25)]))
    img = ms.discrete("img_to_img")
    assert torch.equal(img.calculate_input(SIGMA, X), X)
    assert torch.equal(img.calculate_denoised(SIGMA, OUT, X), OUT)


def test_flow_formulas_and_shift() -> None:
    sd3 = ms.flow(shift=3.0)
    sigma = torch.tensor([0.8, 0.2])
    assert sd3.is_flow
    assert torch.equal(sd3.calculate_input(sigma, X), X)
    assert torch.allclose(sd3.calculate_denoised(sigma, OUT, X), X - OUT * per_item([0.8, 0.2]))
    assert torch.allclose(sd3.noise_scaling(torch.tensor(0.8), OUT, X), 0.8 * OUT + 0.2 * X)
    assert torch.allclose(sd3.inverse_noise_scaling(torch.tensor(0.2), X), X / 0.8)
    assert float(sd3.sigma(torch.tensor(500.0))) == pytest.approx(0.75)  # 3 * 0.5 / (1 + 2 * 0.5)
    assert float(sd3.timestep(torch.tensor(0.75))) == pytest.approx(750.0)
    assert float(sd3.sigma_max) == pytest.approx(1.0) and len(sd3.sigmas) == 1000
    assert (sd3.percent_to_sigma(0.0), sd3.percent_to_sigma(1.0)) == (1.0, 0.0)
    assert sd3.percent_to_sigma(0.25) == pytest.approx(0.9)  # shift(0.75) = 2.25 / 2.5
    aura = ms.flow(shift=1.73, multiplier=1.0)
    assert float(aura.timestep(torch.tensor(0.5))) == pytest.approx(0.5)


def test_flux_time_shift() -> None:
    flux = ms.flux(shift=1.15)
    assert flux.is_flow and len(flux.sigmas) == 10000
    assert float(flux.sigma(torch.tensor(0.5))) == pytest.approx(1 / (1 + math.exp(-1.15)), rel=1e-6)
    assert float(flux.timestep(torch.tensor(0.3))) == pytest.approx(0.3)
    assert ms.flux_mu(1024, 1024) == pytest.approx(1.15)  # 4096 tokens -> max_shift
    assert ms.flux_mu(256, 256) == pytest.approx(0.5 + (1.15 - 0.5) / 3840 * (256 - 256))


def test_continuous_schedules() -> None:
    edm = ms.continuous_edm(sigma_min=0.002, sigma_max=120.0)
    assert float(edm.sigma_min) == pytest.approx(0.002, rel=1e-5)
    assert float(edm.sigma_max) == pytest.approx(120.0, rel=1e-5)
    assert float(edm.timestep(torch.tensor(math.e))) == pytest.approx(0.25)
    assert float(edm.sigma(torch.tensor(0.25))) == pytest.approx(math.e, rel=1e-6)
    assert edm.percent_to_sigma(0.5) == pytest.approx(math.sqrt(0.002 * 120.0), rel=1e-5)
    cont_v = ms.continuous_v()
    assert float(cont_v.timestep(torch.tensor(1.0))) == pytest.approx(0.5)
    assert float(cont_v.sigma(torch.tensor(0.5))) == pytest.approx(1.0)


def test_zero_terminal_snr_rescale() -> None:
    plain, zsnr = ms.discrete(), ms.discrete("v_prediction", zsnr=True)
    last_alpha_bar = 4.8973451890853435e-08
    assert float(zsnr.sigma_max) == pytest.approx(math.sqrt((1 - last_alpha_bar) / last_alpha_bar), rel=1e-5)
    assert float(zsnr.sigma_min) == pytest.approx(float(plain.sigma_min), rel=1e-5)
    assert bool((zsnr.sigmas[1:] > zsnr.sigmas[:-1]).all())


def test_lcm_distilled_table_and_boundary_condition() -> None:
    lcm, full = ms.discrete("lcm"), ms.discrete()
    assert len(lcm.sigmas) == 50
    assert torch.equal(lcm.sigmas, full.sigmas[19::20])  # indices 19, 39, ..., 999
    assert lcm.timestep(lcm.sigmas).tolist() == list(range(19, 1000, 20))
    assert float(lcm.sigma(torch.tensor(999.0))) == pytest.approx(float(full.sigma_max), rel=1e-6)
    sigma = lcm.sigmas[[5, 40]]
    t = lcm.timestep(sigma).float().reshape(2, 1, 1, 1) * 10
    x0 = X - OUT * sigma.reshape(2, 1, 1, 1)
    expected = t / (t**2 + 0.25) ** 0.5 * x0 + 0.25 / (t**2 + 0.25) * X
    assert torch.allclose(lcm.calculate_denoised(sigma, OUT, X), expected)


def test_discrete_from_keeps_the_models_beta_schedule() -> None:
    custom = ms.discrete(linear_start=0.0001, linear_end=0.02, beta_schedule="sqrt_linear")
    v_zsnr = ms.discrete_from(custom, "v_prediction", zsnr=True)
    assert v_zsnr.kind == "v_prediction" and v_zsnr.key != custom.key
    assert v_zsnr.schedule == ms.DiscreteSchedule("sqrt_linear", 0.0001, 0.02, 1000, True)
    assert ms.discrete_from(ms.discrete("lcm"), "eps").key == ms.discrete().key
    assert ms.discrete_from(ms.flow(shift=3.0), "lcm").key == ms.discrete("lcm").key


def test_apply_runs_a_network_as_comfyui_does(sd15: ms.ModelSampling) -> None:
    seen: dict[str, torch.Tensor] = {}

    def network(x_in: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        seen["x_in"], seen["t"] = x_in, t
        return torch.ones_like(x_in)  # eps = 1

    sigma = sd15.sigmas[[999, 500]]
    denoised = sd15.apply(network, X, sigma, dtype=torch.float16)
    assert seen["x_in"].dtype == torch.float16 and seen["t"].tolist() == [999.0, 500.0]
    assert torch.allclose(seen["x_in"].float(), sd15.calculate_input(sigma, X), rtol=1e-3)
    assert denoised.dtype == torch.float32
    assert torch.allclose(denoised, X - sigma.reshape(2, 1, 1, 1))


def test_keys_identify_behaviour() -> None:
    assert ms.discrete().key == ms.discrete().key
    keys = {
        ms.discrete().key,
        ms.discrete("v_prediction").key,
        ms.discrete(zsnr=True).key,
        ms.flow(shift=3.0).key,
        ms.flow(shift=2.0).key,
        ms.flux().key,
        ms.continuous_edm().key,
    }
    assert len(keys) == 7


def test_bad_parameters_are_named() -> None:
    with pytest.raises(ModelSamplingError, match="beta schedule 'cubic'"):
        ms.discrete(beta_schedule="cubic")
    with pytest.raises(ModelSamplingError, match="prediction type 'epsilon'"):
        ms.discrete("epsilon")
    with pytest.raises(ModelSamplingError, match="sigma_min < sigma_max"):
        ms.continuous_edm(sigma_min=5.0, sigma_max=1.0)
