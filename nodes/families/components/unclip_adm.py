"""unCLIP image conditioning: CLIP vision image embeddings, noise-augmented, as a UNet input.

An SD2.1 unCLIP UNet takes ``[noisy image embeds, noise-level embedding]`` through its class
embedding (LDM ``label_emb``; diffusers ``class_embedding`` of type ``projection``). SDXL takes the
noisy embeds (without the level embedding) in place of its pooled text output ("revision").

The augmentation is ComfyUI's (``CLIPEmbeddingNoiseAugmentation``): a 1000-step
``squaredcos_cap_v2`` schedule (betas from ``alpha_bar(t) = cos((t + 0.008) / 1.008 · π/2)²``, capped
at 0.999); the level is ``round(999 · noise_augmentation)``; the embeds become
``√ᾱ[level] · x + √(1 − ᾱ[level]) · noise`` with ``noise`` drawn from a CPU generator seeded with the
sampler's seed − 10; the level's embedding is the sinusoidal timestep embedding (cos half first)
of the embeds' width. ComfyUI never loads CLIP statistics, so the data mean and std are 0 and 1.

Several unCLIP conditionings on one prompt (and several images in one) are each augmented and
scaled by their strength; more than one are then summed and augmented again at the merge level
(0.05 for SD2.1 unCLIP, 0 for SDXL). ComfyUI draws that second noise from the global generator;
Loom seeds it with the same seed so a run is reproducible.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from torch import Tensor

MAX_NOISE_LEVEL = 1000
SEED_OFFSET = 10  # ComfyUI seeds the augmentation with the sampler's seed minus 10
MERGE_LEVEL_SD21 = 0.05


@dataclass(frozen=True)
class UnclipInput:
    """One unCLIPConditioning: a CLIP_VISION_OUTPUT's image embeds, its strength and noise level."""

    image_embeds: Any  # (images, width)
    strength: float
    noise_augmentation: float


@lru_cache(maxsize=2)
def alphas_cumprod(steps: int = MAX_NOISE_LEVEL) -> tuple[float, ...]:
    """ᾱ of the ``squaredcos_cap_v2`` schedule, accumulated in float64 like numpy's cumprod."""

    def alpha_bar(t: float) -> float:
        return math.cos((t + 0.008) / 1.008 * math.pi / 2) ** 2

    out, acc = [], 1.0
    for i in range(steps):
        beta = min(1 - alpha_bar((i + 1) / steps) / alpha_bar(i / steps), 0.999)
        acc *= 1 - beta
        out.append(acc)
    return tuple(out)


def level_embedding(level: int, dim: int) -> Tensor:
    """The sinusoidal embedding (cos half, then sin half) of noise level ``level``: (1, dim)."""

    half = dim // 2
    freqs = torch.exp(-math.log(10000) * torch.arange(half, dtype=torch.float32) / half)
    args = torch.tensor([float(level)])[:, None] * freqs[None]
    emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
    return torch.cat([emb, torch.zeros_like(emb[:, :1])], dim=-1) if dim % 2 else emb


def noise_level(noise_augmentation: float) -> int:
    return round((MAX_NOISE_LEVEL - 1) * float(noise_augmentation))


def augment(embeds: Tensor, level: int, seed: int) -> tuple[Tensor, Tensor]:
    """(noisy embeds (1, D), level embedding (1, D)) for one image's embeds ``(D,)`` or ``(1, D)``."""

    x = embeds.float().reshape(1, -1).cpu()
    ac = alphas_cumprod()[level]  # square roots in float64, kept as float32 (ComfyUI's buffers)
    keep, add = (torch.tensor(math.sqrt(v), dtype=torch.float32) for v in (ac, 1 - ac))
    noise = torch.randn(x.shape, generator=torch.Generator().manual_seed(int(seed)))
    return keep * x + add * noise, level_embedding(level, x.shape[1])


def unclip_adm(inputs: Sequence[UnclipInput], seed: int, merge_level: float) -> Tensor:
    """ComfyUI's ``unclip_adm``: the (1, 2·D) class-label input of all ``inputs`` (see the module
    docstring); ``seed`` is the sampler's seed (the offset is applied here)."""

    seed = int(seed) - SEED_OFFSET
    outs = []
    for item in inputs:
        for image in item.image_embeds:
            noisy, emb = augment(image, noise_level(item.noise_augmentation), seed)
            outs.append(torch.cat([noisy, emb], dim=1) * float(item.strength))
    if len(outs) == 1:
        return outs[0]
    summed = torch.stack(outs).sum(0)
    width = summed.shape[1] // 2
    noisy, emb = augment(summed[:, :width], noise_level(merge_level), seed)
    return torch.cat([noisy, emb], dim=1)


def unclip_inputs(extras: Mapping[str, Any]) -> tuple[UnclipInput, ...]:
    return tuple(extras.get("unclip_conditioning") or ())


def entry_seed(extras: Mapping[str, Any]) -> int:
    """The sampler's seed the run put under the entry's extras (0 when sampled without one)."""
    seed = extras.get("seed", 0)
    return int(seed) if isinstance(seed, int) else 0
