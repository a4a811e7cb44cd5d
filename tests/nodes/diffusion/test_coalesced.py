"""Coalesced runs: several jobs sampled as one batch with SeedGroups give each job's own result."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import pytest
import torch

from nodes.diffusion import model_sampling as ms
from nodes.diffusion import schedulers as sch
from nodes.diffusion.ksampler import sampler_object
from nodes.diffusion.noise import SeedGroups, brownian_noise_sampler, default_noise_sampler, prepare_noise
from tests.nodes.diffusion.toy import ToyDenoiser

JOBS = ((5, 1), (9, 2))  # (seed, batch size) of two runs
SHAPE = (4, 6, 5)  # C*H*W = 120: not a multiple of 16, so per-item draws would differ from batched ones


@pytest.fixture(autouse=True)
def _quiet_torchsde() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        yield


def test_grouped_per_step_noise_equals_each_runs_own_draws() -> None:
    together = default_noise_sampler(torch.zeros(3, *SHAPE), SeedGroups(JOBS))
    alone = [default_noise_sampler(torch.zeros(count, *SHAPE), seed) for seed, count in JOBS]
    sigma = torch.tensor(1.0)
    for _ in range(2):
        assert torch.equal(together(sigma, sigma), torch.cat([draw(sigma, sigma) for draw in alone]))


def test_grouped_brownian_noise_equals_each_runs_own_tree() -> None:
    sigmas = torch.tensor([14.6, 2.0, 0.03, 0.0])
    together = brownian_noise_sampler(torch.zeros(3, *SHAPE), sigmas, SeedGroups(JOBS))
    alone = [brownian_noise_sampler(torch.zeros(count, *SHAPE), sigmas, seed) for seed, count in JOBS]
    expected = torch.cat([tree(sigmas[0], sigmas[1]) for tree in alone])
    assert torch.equal(together(sigmas[0], sigmas[1]), expected)


def test_seed_groups_must_cover_the_batch() -> None:
    with pytest.raises(ValueError, match="cover 3 batch items but the latent has 4"):
        default_noise_sampler(torch.zeros(4, *SHAPE), SeedGroups(JOBS))
    with pytest.raises(ValueError, match="batch_size >= 1"):
        SeedGroups(((1, 0),))


@pytest.mark.parametrize(
    "name",
    [
        "euler_ancestral",
        "dpm_2_ancestral",
        "dpmpp_2s_ancestral",
        "dpmpp_sde",
        "dpmpp_2m_sde",
        "dpmpp_3m_sde_gpu",
        "lcm",
        "ddpm",
        "ddim",
    ],
)
def test_coalesced_batch_reproduces_separate_runs(name: str) -> None:
    sampling = ms.discrete()
    sigmas = sch.ksampler_sigmas(sampling, "karras", name, 5)
    latents = [torch.full((count, *SHAPE), 0.3) for _, count in JOBS]
    masks = [torch.ones(count, 1, 6, 5) for _, count in JOBS]
    for mask in masks:
        mask[..., :2] = 0.0  # keep two columns: exercises the inpaint noise (fresh noise for ddim)
    noises = [prepare_noise(latent, seed) for latent, (seed, _) in zip(latents, JOBS, strict=True)]
    sampler = sampler_object(name)
    alone = [
        sampler.sample(ToyDenoiser(sampling), sigmas, {"seed": seed}, None, noise, latent, mask)
        for (seed, _), noise, latent, mask in zip(JOBS, noises, latents, masks, strict=True)
    ]
    together = sampler.sample(
        ToyDenoiser(sampling),
        sigmas,
        {"seed": SeedGroups(JOBS)},
        None,
        torch.cat(noises),
        torch.cat(latents),
        torch.cat(masks),
    )
    assert torch.allclose(together, torch.cat(alone), rtol=1e-6, atol=1e-6)
