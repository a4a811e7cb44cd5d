"""Shared sampler helpers: the Karras derivative, the ancestral split, half-log-SNR and post-CFG hooks."""

from __future__ import annotations

import math

import pytest
import torch

from nodes.diffusion import model_sampling as ms
from nodes.diffusion.k_samplers import (
    append_dims,
    get_ancestral_step,
    half_log_snr_to_sigma,
    is_flow,
    model_sampling_of,
    offset_first_sigma_for_snr,
    sigma_to_half_log_snr,
    to_d,
    with_post_cfg,
)
from tests.nodes.diffusion.toy import ToyDenoiser


def test_to_d_is_the_karras_derivative_per_item() -> None:
    x = torch.ones(2, 1, 2, 2)
    denoised = torch.zeros(2, 1, 2, 2)
    d = to_d(x, torch.tensor([2.0, 4.0]), denoised)
    assert d[0].unique().tolist() == [0.5] and d[1].unique().tolist() == [0.25]
    assert append_dims(torch.tensor([1.0, 2.0]), 4).shape == (2, 1, 1, 1)
    with pytest.raises(ValueError, match="less"):
        append_dims(torch.zeros(2, 2), 1)


def test_ancestral_split() -> None:
    sigma_down, sigma_up = get_ancestral_step(torch.tensor(2.0), torch.tensor(1.0), eta=1.0)
    assert float(sigma_up) == pytest.approx(math.sqrt(1 * (4 - 1) / 4))
    assert float(sigma_down) ** 2 + float(sigma_up) ** 2 == pytest.approx(1.0)
    assert get_ancestral_step(2.0, 1.0, eta=0.0) == (1.0, 0.0)
    down, up = get_ancestral_step(torch.tensor(2.0), torch.tensor(0.0))
    assert float(down) == 0.0 and float(up) == 0.0
    _, capped = get_ancestral_step(torch.tensor(2.0), torch.tensor(1.9), eta=100.0)
    assert float(capped) == pytest.approx(1.9)  # sigma_up never exceeds sigma_next


def test_half_log_snr_for_eps_and_flow() -> None:
    sigma = torch.tensor([0.2, 0.5, 0.9])
    eps, flow = ms.discrete(), ms.flow(shift=3.0)
    assert torch.allclose(sigma_to_half_log_snr(sigma, eps), -sigma.log())
    assert torch.allclose(sigma_to_half_log_snr(sigma, flow), ((1 - sigma) / sigma).log())
    for sampling in (eps, flow):
        assert torch.allclose(half_log_snr_to_sigma(sigma_to_half_log_snr(sigma, sampling), sampling), sigma)


def test_flow_schedules_starting_at_one_are_nudged() -> None:
    flow, eps = ms.flow(shift=3.0), ms.discrete()
    sigmas = torch.tensor([1.0, 0.5, 0.0])
    nudged = offset_first_sigma_for_snr(sigmas, flow)
    assert float(nudged[0]) == pytest.approx(flow.percent_to_sigma(1e-4)) and float(sigmas[0]) == 1.0
    assert offset_first_sigma_for_snr(sigmas, eps) is sigmas


def test_model_sampling_of_and_is_flow() -> None:
    assert is_flow(ToyDenoiser(ms.flow())) and not is_flow(ToyDenoiser(ms.discrete()))
    with pytest.raises(TypeError, match="must expose .model_sampling"):
        model_sampling_of(object())


def test_with_post_cfg_appends_without_touching_the_original() -> None:
    def first(args: dict) -> torch.Tensor:
        return args["denoised"]

    def second(args: dict) -> torch.Tensor:
        return args["uncond_denoised"]

    original = {"sampler_post_cfg_function": [first], "transformer_options": {}}
    options = with_post_cfg(original, second, disable_cfg1_optimization=True)
    assert options["sampler_post_cfg_function"] == [first, second]
    assert options["disable_cfg1_optimization"] is True
    assert original == {"sampler_post_cfg_function": [first], "transformer_options": {}}
    assert "disable_cfg1_optimization" not in with_post_cfg(None, first)
