"""Noise as ComfyUI draws it: the initial latent noise, per-step Gaussian noise, Brownian-tree noise.

- :func:`prepare_noise` reproduces ``comfy/sample.py``: ComfyUI seeds torch's *global* CPU generator
  (``torch.manual_seed(seed)``) and draws one float32 ``randn`` of the latent's shape; with a
  ``batch_index`` it draws one ``[1, C, H, W]`` sample per index from 0 up to the largest index and
  keeps the chosen ones. Loom uses a private ``torch.Generator`` seeded the same way, which gives
  the same numbers without touching global state.
- :func:`default_noise_sampler` reproduces k-diffusion's per-step noise as ComfyUI seeds it: a fresh
  generator per sampler run, seeded with ``seed + 1`` on the CPU (``seed`` on other devices), each
  call one ``randn`` of the whole batch.
- :class:`BrownianTreeNoiseSampler` is the SDE samplers' noise: torchsde's ``BrownianTree`` over
  [smallest positive sigma, largest sigma] with ``entropy=seed``; a call for (sigma, sigma_next)
  returns the sign-normalised increment (W(t1) - W(t0)) / sqrt(|t1 - t0|) with t0 < t1 sorted.
- :class:`SeedGroups` lets one batch carry several runs (seed, batch size): each noise source draws
  every run's slice as that run alone would, so coalesced jobs reproduce their separate results.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

NoiseSampler = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""``noise_sampler(sigma, sigma_next) -> unit-variance noise shaped like x``."""


@dataclass(frozen=True)
class SeedGroups:
    """The seeds of several runs coalesced into one batch: ``groups`` is ((seed, batch_size), ...) in
    batch order. Passed as ``extra_args["seed"]``, every noise source here draws each group's slice
    exactly as that run alone would, so a coalesced batch reproduces the separate runs."""

    groups: tuple[tuple[int, int], ...]

    def __post_init__(self) -> None:
        if not self.groups or any(count < 1 for _, count in self.groups):
            raise ValueError(f"SeedGroups needs (seed, batch_size >= 1) pairs, got {self.groups!r}")

    @property
    def batch_size(self) -> int:
        return sum(count for _, count in self.groups)

    def check(self, x: torch.Tensor) -> None:
        if x.shape[0] != self.batch_size:
            raise ValueError(
                f"seed groups cover {self.batch_size} batch items but the latent has {x.shape[0]}"
            )


def grouped_randn(x: torch.Tensor, seeds: SeedGroups, generators: Sequence[torch.Generator]) -> torch.Tensor:
    """One ``randn`` per group (its slice's shape) from that group's generator, concatenated."""
    parts = [
        torch.randn(
            [count, *x.shape[1:]],
            dtype=x.dtype,
            layout=x.layout,
            device=generator.device,
            generator=generator,
        )
        for (_, count), generator in zip(seeds.groups, generators, strict=True)
    ]
    return torch.cat(parts).to(x.device)


def seeded_cpu_generator(seed: int) -> torch.Generator:
    """A CPU generator in the state ``torch.manual_seed(seed)`` leaves the global one in."""
    generator = torch.Generator(device="cpu")
    generator.manual_seed(int(seed))
    return generator


def prepare_noise(latent: torch.Tensor, seed: int, batch_index: Sequence[int] | None = None) -> torch.Tensor:
    """Initial noise for ``latent`` ([B, C, ...]) as ComfyUI's ``prepare_noise``: float32 on the CPU,
    then cast to the latent's dtype. ``batch_index`` (a LATENT's ``batch_index``) selects per-item
    draws so item k of a split batch gets the noise it had in the full batch."""
    generator = seeded_cpu_generator(seed)
    if batch_index is None:
        noise = torch.randn(
            latent.size(), dtype=torch.float32, layout=latent.layout, generator=generator, device="cpu"
        )
        return noise.to(dtype=latent.dtype)
    indices = np.asarray(list(batch_index), dtype=np.int64)
    if indices.size == 0 or indices.min() < 0:
        raise ValueError(f"batch_index must be non-negative integers, got {list(batch_index)!r}")
    unique, inverse = np.unique(indices, return_inverse=True)
    wanted = set(int(i) for i in unique)
    item_shape = [1, *latent.size()[1:]]
    drawn = []
    for i in range(int(unique[-1]) + 1):
        sample = torch.randn(
            item_shape, dtype=torch.float32, layout=latent.layout, generator=generator, device="cpu"
        )
        if i in wanted:
            drawn.append(sample)
    noise = torch.cat([drawn[int(j)] for j in inverse.reshape(-1)], dim=0)
    return noise.to(dtype=latent.dtype)


def default_noise_sampler(x: torch.Tensor, seed: int | SeedGroups | None = None) -> NoiseSampler:
    """k-diffusion's Gaussian noise sampler as ComfyUI seeds it (``seed + 1`` on CPU, ``seed``
    elsewhere). With ``seed=None`` it draws from torch's global generator, like ComfyUI."""
    if isinstance(seed, SeedGroups):
        seed.check(x)
        offset = 1 if x.device.type == "cpu" else 0
        generators = [torch.Generator(device=x.device).manual_seed(s + offset) for s, _ in seed.groups]
        return lambda sigma, sigma_next: grouped_randn(x, seed, generators)
    generator: torch.Generator | None = None
    if seed is not None:
        generator = torch.Generator(device=x.device)
        generator.manual_seed(int(seed) + 1 if x.device.type == "cpu" else int(seed))

    def sample(sigma: torch.Tensor, sigma_next: torch.Tensor) -> torch.Tensor:
        return torch.randn(x.size(), dtype=x.dtype, layout=x.layout, device=x.device, generator=generator)

    return sample


class BatchedBrownianTree:
    """One torchsde ``BrownianTree`` (or one per batch item for a list of seeds) over [t0, t1],
    answering increments W(b) - W(a) for any a, b in the interval (sign-correct for a > b)."""

    def __init__(
        self,
        x: torch.Tensor,
        t0: torch.Tensor,
        t1: torch.Tensor,
        seed: int | Sequence[int] | SeedGroups | None = None,
        cpu: bool = True,
    ) -> None:
        import torchsde  # lazy: torchsde; only the SDE samplers need it

        self.cpu_tree = cpu
        t0, t1, self.sign = self._sort(t0, t1)
        w0 = torch.zeros_like(x)
        self.batched = False
        self.grouped = isinstance(seed, SeedGroups)
        if isinstance(seed, SeedGroups):  # one tree per coalesced run, each over its own slice
            seed.check(x)
            if self.cpu_tree:
                t0, t1 = t0.detach().cpu(), t1.detach().cpu()
            self.trees = tuple(
                torchsde.BrownianTree(t0, torch.zeros_like(w0[:count]).to(t0.device), t1, entropy=s)
                for s, count in seed.groups
            )
            return
        if seed is None:
            seeds: tuple[int, ...] = (int(torch.randint(0, 2**63 - 1, ()).item()),)
        elif isinstance(seed, (tuple, list)):
            if len(seed) != x.shape[0]:
                raise ValueError(
                    f"got {len(seed)} seeds for a batch of {x.shape[0]}; pass one seed or one per item"
                )
            seeds = tuple(int(s) for s in seed)
            self.batched = True
            w0 = w0[0]
        else:
            seeds = (int(seed),)  # type: ignore[arg-type]
        if self.cpu_tree:
            t0, w0, t1 = t0.detach().cpu(), w0.detach().cpu(), t1.detach().cpu()
        self.trees = tuple(torchsde.BrownianTree(t0, w0, t1, entropy=s) for s in seeds)

    @staticmethod
    def _sort(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
        return (a, b, 1) if a < b else (b, a, -1)

    def __call__(self, t0: torch.Tensor, t1: torch.Tensor) -> torch.Tensor:
        t0, t1, sign = self._sort(t0, t1)
        device, dtype = t0.device, t0.dtype
        if self.cpu_tree:
            t0, t1 = t0.detach().cpu().float(), t1.detach().cpu().float()
        draws = [tree(t0, t1) for tree in self.trees]
        if self.grouped:
            return torch.cat(draws).to(device=device, dtype=dtype) * (self.sign * sign)
        w = torch.stack(draws).to(device=device, dtype=dtype) * (self.sign * sign)
        return w if self.batched else w[0]


class BrownianTreeNoiseSampler:
    """Brownian-tree noise for SDE samplers (``dpmpp_sde``, ``dpmpp_2m_sde``, ``dpmpp_3m_sde``, ...).

    ``sigma_min``/``sigma_max`` bound the interval (ComfyUI passes the smallest positive and the
    largest sigma of the schedule), ``seed`` is the sampler's seed (not +1), ``transform`` maps sigma
    to the tree's time (identity, or e.g. half-log-SNR), ``cpu`` builds the tree on the CPU (the
    non-``_gpu`` samplers)."""

    def __init__(
        self,
        x: torch.Tensor,
        sigma_min: float | torch.Tensor,
        sigma_max: float | torch.Tensor,
        seed: int | Sequence[int] | SeedGroups | None = None,
        transform: Callable[[torch.Tensor], torch.Tensor] = lambda t: t,
        cpu: bool = False,
    ) -> None:
        self.transform = transform
        t0 = self.transform(torch.as_tensor(sigma_min))
        t1 = self.transform(torch.as_tensor(sigma_max))
        self.tree = BatchedBrownianTree(x, t0, t1, seed, cpu=cpu)

    def __call__(self, sigma: torch.Tensor | float, sigma_next: torch.Tensor | float) -> torch.Tensor:
        t0 = self.transform(torch.as_tensor(sigma))
        t1 = self.transform(torch.as_tensor(sigma_next))
        return self.tree(t0, t1) / (t1 - t0).abs().sqrt()


def brownian_noise_sampler(
    x: torch.Tensor,
    sigmas: torch.Tensor,
    seed: int | SeedGroups | None,
    cpu: bool = True,
    transform: Callable[[torch.Tensor], torch.Tensor] = lambda t: t,
) -> BrownianTreeNoiseSampler:
    """The Brownian sampler an SDE sampler builds for ``sigmas``: t0 = smallest positive sigma,
    t1 = largest sigma (ComfyUI's ``sigmas[sigmas > 0].min()`` and ``sigmas.max()``)."""
    positive = sigmas[sigmas > 0]
    return BrownianTreeNoiseSampler(x, positive.min(), sigmas.max(), seed=seed, cpu=cpu, transform=transform)
