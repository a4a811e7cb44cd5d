"""Flux Kontext reference images: extra image tokens after the sampled latent's, with their own
position ids (the behaviour of ComfyUI's ``comfy/ldm/flux/model.py`` ``Flux._forward`` and
``process_img``, read for facts and written anew).

A reference latent (the VAE-encoded image, already through the latent format's ``process_in``) is
packed into 2×2 patches like the sampled latent; its ids are ``(index, row + row_offset, col +
col_offset)`` in patch units. Where the references go is ComfyUI's ``reference_latents_method``
(FluxKontextMultiReferenceLatentMethod), offsets counted in latent pixels and rounded to patches
as ``(offset + 1) // 2``:

- ``offset`` (Flux.1's default): index 1 for every reference; each one is placed next to those
  before it, below them when it is wider than tall relative to the space used so far
  (``h + ref_h <= w + ref_w``), to the right otherwise; the space used grows to cover it.
- ``index``: no spatial offset, the index counts up from 1 (one "frame" per reference).
- ``uxo`` (ComfyUI's "uxo/uno"): index 0, each reference diagonally past the sampled image and the
  references before it (row offset = image height + heights so far, likewise columns).

The transformer sees ``[image tokens, reference tokens...]``; only the first (image) tokens of
its output are the prediction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from nodes.families.components.latent_patches import pack, pad_to_even

if TYPE_CHECKING:
    from torch import Tensor

METHODS = ("offset", "index", "uxo")
DEFAULT_METHOD = "offset"


@dataclass(frozen=True)
class Placement:
    """Where one reference goes: the id's first axis and its offsets in latent pixels."""

    index: int
    h_offset: int
    w_offset: int


def placements(shapes: Sequence[tuple[int, int]], method: str, h_len: int, w_len: int) -> list[Placement]:
    """The placement of references of latent sizes ``shapes`` (h, w) next to a sampled latent of
    ``h_len`` × ``w_len`` patches (see the module docstring)."""
    out: list[Placement] = []
    h = w = index = 0
    for rh, rw in shapes:
        if method == "index":
            index += 1
            out.append(Placement(index, 0, 0))
        elif method == "uxo":
            out.append(Placement(0, h_len * 2 + h, w_len * 2 + w))
            h, w = h + rh, w + rw
        else:  # "offset" and anything ComfyUI does not name
            h_off, w_off = (0, w) if rh + h > rw + w else (h, 0)
            out.append(Placement(1, h_off, w_off))
            h, w = max(h, rh + h_off), max(w, rw + w_off)
    return out


def patch_ids(h_len: int, w_len: int, place: Placement) -> Tensor:
    """Position ids (h_len·w_len, 3) of a ``h_len`` × ``w_len``-patch latent placed at ``place``."""

    ids = torch.zeros(h_len, w_len, 3)
    ids[..., 0] = place.index
    ids[..., 1] = torch.arange(h_len, dtype=torch.float32)[:, None] + (place.h_offset + 1) // 2
    ids[..., 2] = torch.arange(w_len, dtype=torch.float32)[None, :] + (place.w_offset + 1) // 2
    return ids.reshape(-1, 3)


def reference_tokens(refs: Sequence[Tensor], method: str, h_len: int, w_len: int) -> tuple[Tensor, Tensor]:
    """The packed tokens (B, N, 4C) and ids (N, 3) of all references, in order."""

    tokens, ids = [], []
    shapes = [(int(r.shape[-2]), int(r.shape[-1])) for r in refs]
    for ref, place in zip(refs, placements(shapes, method, h_len, w_len), strict=True):
        padded = pad_to_even(ref)
        t, _ = pack(padded)
        tokens.append(t)
        ids.append(patch_ids(padded.shape[-2] // 2, padded.shape[-1] // 2, place))
    return torch.cat(tokens, dim=1), torch.cat(ids)
