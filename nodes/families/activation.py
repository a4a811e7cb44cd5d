"""Activation memory of one sampling run: the estimate block streaming leaves room for.

The memory manager keeps the device memory a run's activations need free of weights (see
``engine/memory/streaming.py``); the denoiser kinds turn a run (``engine.memory.device_budget.RunShape``: latent
shape, batched conditioning branches, text tokens) into bytes with the two estimates here, from
their own width, heads and token count. In the spirit of ComfyUI's ``memory_required`` (a model's
latent area times a per-model factor), but the factor is derived, not measured:

- a **transformer** runs its blocks one after another, so the peak is the widest moment of one
  block: ``rows × tokens × width × live`` elements, where ``live`` counts the per-token tensors
  alive at once in units of the width (residual stream, its normalised copy, the fused
  projections, the MLP's hidden states, the concatenated output); each kind states its count;
- a **UNet** keeps the outputs of its down path for the up path (the skip connections), and its
  peak is the widest level: the full-resolution level with a transformer (GEGLU feed-forward) or
  a resnet whose input is a skip concatenated with the level below.

Attention adds no score matrix: every attention call goes through SDPA's memory-efficient kernels
(or is split into query pieces, ``engine/interruptible_models.py``), which is ComfyUI's estimate for
xformers / flash attention too. The sampler's own float32 tensors of the latent's size (noise,
``x``, denoised, each branch's prediction) are counted on top.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

LATENT_COPIES = 8  # float32 latent-sized tensors the sampler and CFG hold during a step
UNET_ATTENTION_LIVE = 14  # x, its norm, GEGLU's 8c projection, its 4c gated half (per token, × c)
UNET_RESNET_LIVE = 7  # the concatenated input (~3c), its norm, the convolution's output


def latent_bytes(run: Any) -> int:
    """The sampler's float32 tensors of the batched latent's size."""
    return LATENT_COPIES * run.batch * math.prod(int(n) for n in run.latent[1:]) * 4


def image_tokens(run: Any, patch: int) -> int:
    """Tokens of one row: the latent's height and width in ``patch`` × ``patch`` patches (frames as
    they are), padded up like the patchify is."""
    *frames, height, width = (int(n) for n in run.latent[2:])
    return math.prod(frames) * math.ceil(height / patch) * math.ceil(width / patch)


def transformer_bytes(
    run: Any, *, width: int, patch: int, live: float, element: int, joint: bool = True
) -> int:
    """A transformer's peak for ``run``: ``run.batch`` rows of the image tokens (plus the text
    tokens when attention is joint) × ``width`` × ``live`` elements of ``element`` bytes, and the
    sampler's latents."""
    tokens = image_tokens(run, patch) + (run.text_tokens if joint else 0)
    return math.ceil(run.batch * tokens * width * live * element) + latent_bytes(run)


def unet_bytes(
    run: Any, *, channels: Sequence[int], attention: Sequence[bool], layers: int, element: int
) -> int:
    """A UNet's peak for ``run``: the widest level (``channels[i]`` channels over the latent's cells
    divided by 4 per level; a level with attention is wider) plus every skip connection the down
    path keeps (``layers`` + 1 outputs per level), ``run.batch`` rows of ``element`` bytes, and the
    sampler's latents."""
    peak = skips = 0.0
    for level, (width, attends) in enumerate(zip(channels, attention, strict=True)):
        cells = run.cells / 4**level
        skips += (layers + 1) * cells * width
        peak = max(peak, cells * width * (UNET_ATTENTION_LIVE if attends else UNET_RESNET_LIVE))
    return math.ceil(run.batch * (peak + skips) * element) + latent_bytes(run)


def heads_width(config: Any) -> int:
    """A diffusers transformer's width: heads × head size."""
    return int(config.num_attention_heads) * int(config.attention_head_dim)
