"""Noise as ComfyUI draws it: initial noise, seed + 1 per-step noise, the Brownian tree."""

from __future__ import annotations

import warnings

import pytest
import torch

from nodes.diffusion.noise import (
    BrownianTreeNoiseSampler,
    brownian_noise_sampler,
    default_noise_sampler,
    prepare_noise,
)


def global_generator_draw(seed: int, shape: list[int]) -> torch.Tensor:
    """What ComfyUI does: seed torch's global CPU generator and draw (global state restored after)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return torch.randn(shape)


def test_prepare_noise_equals_comfyui_global_generator_draw() -> None:
    latent = torch.zeros(2, 4, 8, 8)
    assert torch.equal(prepare_noise(latent, 1025), global_generator_draw(1025, [2, 4, 8, 8]))
    odd = torch.zeros(3, 4, 5, 3)  # C*H*W = 60, not a multiple of 16
    assert torch.equal(prepare_noise(odd, 7), global_generator_draw(7, [3, 4, 5, 3]))


def test_prepare_noise_does_not_touch_global_state() -> None:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(99)
        prepare_noise(torch.zeros(1, 4, 8, 8), 5)
        after = torch.randn(3)
        torch.manual_seed(99)
        assert torch.equal(after, torch.randn(3))


def test_prepare_noise_with_batch_index_draws_per_item_up_to_the_largest_index() -> None:
    latent = torch.zeros(3, 4, 6, 5)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(123)
        items = [torch.randn([1, 4, 6, 5]) for _ in range(4)]  # indices 0..3
    expected = torch.cat([items[3], items[0], items[3]])
    assert torch.equal(prepare_noise(latent, 123, batch_index=[3, 0, 3]), expected)


def test_prepare_noise_casts_to_the_latent_dtype() -> None:
    noise = prepare_noise(torch.zeros(1, 4, 8, 8, dtype=torch.float16), 3)
    assert noise.dtype == torch.float16
    assert torch.equal(noise, global_generator_draw(3, [1, 4, 8, 8]).half())


def test_default_noise_sampler_draws_whole_batches_from_seed_plus_one() -> None:
    x = torch.zeros(2, 4, 8, 8)
    sampler = default_noise_sampler(x, seed=41)
    generator = torch.Generator().manual_seed(42)
    sigma = torch.tensor(1.0)
    for _ in range(3):
        assert torch.equal(sampler(sigma, sigma), torch.randn([2, 4, 8, 8], generator=generator))
    restarted = default_noise_sampler(x, seed=41)  # a new sampler run restarts the sequence
    assert torch.equal(
        restarted(sigma, sigma), torch.randn([2, 4, 8, 8], generator=torch.Generator().manual_seed(42))
    )


@pytest.fixture(autouse=True)
def _quiet_torchsde() -> object:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torchsde's float32 "tb <= t1" notices
        yield


def test_brownian_tree_is_deterministic_per_seed() -> None:
    x = torch.zeros(1, 4, 16, 16)
    sigmas = torch.tensor([14.6, 5.0, 1.0, 0.1, 0.0])
    first = brownian_noise_sampler(x, sigmas, seed=5)(sigmas[0], sigmas[1])
    again = brownian_noise_sampler(x, sigmas, seed=5)(sigmas[0], sigmas[1])
    other = brownian_noise_sampler(x, sigmas, seed=6)(sigmas[0], sigmas[1])
    assert torch.equal(first, again)
    assert not torch.allclose(first, other)


def test_brownian_increments_are_sign_normalised_and_additive() -> None:
    x = torch.zeros(4, 4, 32, 32)
    tree = BrownianTreeNoiseSampler(x, 0.1, 10.0, seed=3, cpu=True)
    a, b, c = torch.tensor(8.0), torch.tensor(4.0), torch.tensor(1.0)
    forward, backward = tree(a, c), tree(c, a)
    assert torch.allclose(forward, -backward)
    # W(c) - W(a) = (W(b) - W(a)) + (W(c) - W(b)), each call divided by sqrt(|t1 - t0|)
    assert torch.allclose(forward * 7**0.5, tree(a, b) * 4**0.5 + tree(b, c) * 3**0.5, atol=1e-4)
    assert float(forward.std()) == pytest.approx(1.0, abs=0.05)
    assert float(forward.mean()) == pytest.approx(0.0, abs=0.05)


def test_brownian_tree_spans_the_smallest_positive_and_largest_sigma() -> None:
    x = torch.zeros(1, 4, 8, 8)
    sigmas = torch.tensor([14.6, 3.0, 0.03, 0.0])
    sampler = brownian_noise_sampler(x, sigmas, seed=9)
    direct = BrownianTreeNoiseSampler(x, torch.tensor(0.03), torch.tensor(14.6), seed=9, cpu=True)
    assert torch.equal(sampler(sigmas[0], sigmas[1]), direct(sigmas[0], sigmas[1]))


def test_brownian_tree_with_one_seed_per_item() -> None:
    x = torch.zeros(2, 4, 8, 8)
    batched = BrownianTreeNoiseSampler(x, 0.1, 10.0, seed=[1, 2], cpu=True)
    single = BrownianTreeNoiseSampler(x[:1], 0.1, 10.0, seed=2, cpu=True)
    noise = batched(torch.tensor(5.0), torch.tensor(2.0))
    assert noise.shape == (2, 4, 8, 8)
    assert torch.equal(noise[1:], single(torch.tensor(5.0), torch.tensor(2.0)))
    with pytest.raises(ValueError, match="2 seeds for a batch of 3"):
        BrownianTreeNoiseSampler(torch.zeros(3, 4, 8, 8), 0.1, 10.0, seed=[1, 2])
