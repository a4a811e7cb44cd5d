"""ComfyUI's UNet patch points on diffusers' ``UNet2DConditionModel``: how the block patches of a
MODEL (``nodes.core.sampling_hooks``: ``transformer_options["patches"]`` and ``["patches_replace"]``) reach
the UNet during one forward call, and nothing stays on the module after it.

Places are named as ComfyUI names them (its ``openaimodel`` UNet): ``("input", id)`` counts
``conv_in`` as 0, then one id per resnet (with its attention) and one per downsampler of each down
block; ``("middle", 0)``; ``("output", id)`` one per resnet (with its attention, and the block's
upsampler after the last one) of each up block. Within a place, the transformer blocks of its
attention are ``block_index`` 0, 1, ...

- Attention points (``attn1_patch``, ``attn1_output_patch``, ``attn2_patch``,
  ``attn2_output_patch``, and replace patches for ``attn1`` / ``attn2`` at a place): a
  :class:`PatchedAttention` diffusers attention processor is set on each attention that has a patch,
  for the call, and the previous processor is set back afterwards.
- ``middle_patch`` (GLIGEN): in each transformer block, ``x = fn(x, extra_options)`` on the
  image tokens after the self-attention's residual, before the cross-attention. For the call, a
  forward pre-hook on the block's ``norm1`` sees the block input ``x`` and a forward hook on its
  ``attn1`` returns ``out + fn(x + out) - (x + out)``, so the block's residual sum is the patched
  tokens (to rounding); both hooks are removed afterwards.
- Block points (``input_block_patch``, ``input_block_patch_after_skip``, ``output_block_patch``):
  the forward runs through ``unet_walk.walk``, which calls the UNet's own sub-modules place by
  place and the patches between them.

The patch functions get ComfyUI's ``extra_options``: the call's ``transformer_options`` (with
``sigmas``, ``cond_or_uncond``, ``original_shape``) plus ``block``, ``block_index``,
``transformer_index``, ``n_heads``, ``dim_head`` and ``attn_precision``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from nodes.core.sampling_hooks import ConditioningError
from nodes.families.components.unet_walk import walk

if TYPE_CHECKING:
    from torch import Tensor

ATTENTION_POINTS = frozenset({"attn1_patch", "attn1_output_patch", "attn2_patch", "attn2_output_patch"})
BLOCK_POINTS = frozenset({"input_block_patch", "input_block_patch_after_skip", "output_block_patch"})
MIDDLE_POINT = "middle_patch"  # in each transformer block, after the self-attention's residual
PATCH_POINTS = (
    ATTENTION_POINTS | BLOCK_POINTS | {MIDDLE_POINT, "attn1", "attn2"}
)  # the last two: replace patches


@dataclass(frozen=True)
class AttentionPlace:
    """One attention of the UNet: which (``attn1`` self / ``attn2`` cross), at which place."""

    attn: Any
    which: str
    block: tuple[str, int]
    block_index: int
    transformer_index: int


def transformer_places(module: Any) -> list[tuple[tuple[str, int], Any]]:
    """Each ``Transformer2DModel`` of the UNet with its ComfyUI place, in forward order."""
    out: list[tuple[tuple[str, int], Any]] = []
    ident = 0
    for block in module.down_blocks:
        attentions = getattr(block, "attentions", None)
        for j in range(len(block.resnets)):
            ident += 1
            if attentions is not None and j < len(attentions):
                out.append((("input", ident), attentions[j]))
        ident += 1 if block.downsamplers else 0
    for attention in getattr(module.mid_block, "attentions", None) or ():
        out.append((("middle", 0), attention))
    ident = -1
    for block in module.up_blocks:
        attentions = getattr(block, "attentions", None)
        for j in range(len(block.resnets)):
            ident += 1
            if attentions is not None and j < len(attentions):
                out.append((("output", ident), attentions[j]))
    return out


def attention_places(module: Any) -> list[AttentionPlace]:
    places = []
    index = 0
    for block, transformer in transformer_places(module):
        for t, tb in enumerate(transformer.transformer_blocks):
            for which in ("attn1", "attn2"):
                attn = getattr(tb, which, None)
                if attn is not None:
                    places.append(AttentionPlace(attn, which, block, t, index))
            index += 1
    return places


def attention(q: Tensor, k: Tensor, v: Tensor, heads: int, scale: float | None = None) -> Tensor:
    """Multi-head attention of projected ``q``, ``k``, ``v`` as ComfyUI's: the keys and values are
    viewed with the queries' batch size (a patch may split the queries into more, smaller rows)."""
    b, _, inner = q.shape
    head = inner // heads
    q, k, v = (t.reshape(b, -1, heads, head).transpose(1, 2) for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, scale=scale)
    return out.transpose(1, 2).reshape(b, -1, heads * head).to(q.dtype)


class PatchedAttention:
    """A diffusers attention processor running ComfyUI's attention patch points around one
    attention (set for one UNet call by :func:`patched_attention`)."""

    def __init__(self, inner: Any, place: AttentionPlace, options: Mapping[str, Any]) -> None:
        self.inner, self.place = inner, place
        patches = options.get("patches", {})
        self.before: list[Callable[..., Any]] = list(patches.get(f"{place.which}_patch", ()))
        self.after: list[Callable[..., Any]] = list(patches.get(f"{place.which}_output_patch", ()))
        self.replace = replacement(options, place)
        self.options = options

    def extra_options(self, attn: Any) -> dict[str, Any]:
        p = self.place
        return {
            **self.options,
            "block": p.block,
            "block_index": p.block_index,
            "transformer_index": p.transformer_index,
            "n_heads": attn.heads,
            "dim_head": attn.inner_dim // attn.heads,
            "attn_precision": None,
        }

    def __call__(
        self,
        attn: Any,
        hidden_states: Tensor,
        encoder_hidden_states: Tensor | None = None,
        attention_mask: Tensor | None = None,
        temb: Tensor | None = None,
        **kwargs: Any,
    ) -> Tensor:
        extra = self.extra_options(attn)
        n, context, value = hidden_states, encoder_hidden_states, None
        if self.before:
            context = n if context is None else context
            value = context
            for fn in self.before:
                n, context, value = fn(n, context, value, extra)
        if self.replace is not None or self.before:
            context = n if context is None else context
            value = context if value is None else value
            q, k, v = attn.to_q(n), attn.to_k(context), attn.to_v(value)
            if self.replace is not None:
                out = self.replace(q, k, v, extra)
            else:
                out = attention(q, k, v, attn.heads, attn.scale)
            out = attn.to_out[1](attn.to_out[0](out))
        else:
            out = self.inner(attn, hidden_states, encoder_hidden_states, attention_mask, temb, **kwargs)
        for fn in self.after:
            out = fn(out, extra)
        return out


def replacement(options: Mapping[str, Any], place: AttentionPlace) -> Callable[..., Any] | None:
    """The replace patch for ``place`` (ComfyUI's lookup: (name, id, index), then (name, id))."""
    table = options.get("patches_replace", {}).get(place.which, {})
    return table.get((*place.block, place.block_index), table.get(place.block))


def _patched(options: Mapping[str, Any], place: AttentionPlace) -> bool:
    patches = options.get("patches", {})
    return (
        bool(patches.get(f"{place.which}_patch"))
        or bool(patches.get(f"{place.which}_output_patch"))
        or replacement(options, place) is not None
    )


@contextmanager
def patched_attention(module: Any, options: Mapping[str, Any]) -> Iterator[None]:
    """Set a :class:`PatchedAttention` on every attention that has a patch; set the previous
    processors back when the call is done (also on error)."""
    saved: list[tuple[Any, Any]] = []
    try:
        for place in attention_places(module):
            if not _patched(options, place):
                continue
            inner = place.attn.processor
            if isinstance(inner, torch.nn.Module):
                raise ConditioningError(
                    f"an attention patch on {place.which} at {place.block} cannot run together with the "
                    "IP-Adapter installed there; remove one of the two patch nodes"
                )
            saved.append((place.attn, inner))
            place.attn.set_processor(PatchedAttention(inner, place, options))
        yield
    finally:
        for attn, inner in reversed(saved):
            attn.set_processor(inner)


def check_points(options: Mapping[str, Any]) -> None:
    known = ATTENTION_POINTS | BLOCK_POINTS | {MIDDLE_POINT}
    unknown = sorted(p for p, fns in options.get("patches", {}).items() if fns and p not in known)
    unknown += sorted(
        f"{w} replace" for w in options.get("patches_replace", {}) if w not in ("attn1", "attn2")
    )
    if unknown:
        raise ConditioningError(
            f"this UNet cannot run the patch points {unknown} (it runs {sorted(known)} and "
            "attn1/attn2 replace patches); remove the patch node from the workflow"
        )


def run_patched(
    module: Any, x_in: Tensor, timestep: Tensor, kwargs: dict[str, Any], options: Mapping[str, Any]
) -> Tensor:
    """One UNet forward with the block patches of ``options`` (ComfyUI's ``transformer_options``)."""
    check_points(options)
    options = {**options, "original_shape": list(x_in.shape), "transformer_index": 0}
    with patched_attention(module, options), middle_patches(module, options):
        if any(options.get("patches", {}).get(p) for p in BLOCK_POINTS):
            return walk(module, x_in, timestep, kwargs, options)
        return module(x_in, timestep, return_dict=False, **kwargs)[0]


@contextmanager
def middle_patches(module: Any, options: Mapping[str, Any]) -> Iterator[None]:
    """Run the ``middle_patch`` functions in every transformer block for the call (see the module
    docstring); nothing is left on the module afterwards (also on error)."""
    fns = list(options.get("patches", {}).get(MIDDLE_POINT, ()))
    handles: list[Any] = []
    try:
        index = 0
        for block, transformer in transformer_places(module) if fns else ():
            for t, tb in enumerate(transformer.transformer_blocks):
                extra = {**options, "block": block, "block_index": t, "transformer_index": index}
                handles += _hook_block(tb, fns, extra)
                index += 1
        yield
    finally:
        for handle in handles:
            handle.remove()


def _hook_block(tb: Any, fns: list[Callable[..., Any]], extra: dict[str, Any]) -> list[Any]:
    seen: list[Tensor] = []

    def before(_norm: Any, args: tuple[Any, ...]) -> None:
        seen[:] = [args[0]]

    def after(_attn: Any, _args: tuple[Any, ...], out: Tensor) -> Tensor:
        x = seen.pop() + out
        patched = x
        for fn in fns:
            patched = fn(patched, extra)
        return out + (patched - x)

    return [tb.norm1.register_forward_pre_hook(before), tb.attn1.register_forward_hook(after)]
