"""The blocks of diffusers' Flux and Chroma transformers as block-level step caches see them
(:class:`nodes.hooks.BlockStack`).

Flux's double and single blocks (and Chroma's double blocks) take ``hidden_states`` (image) and
``encoder_hidden_states`` (text) and return ``(encoder_hidden_states, hidden_states)``. Chroma's
single blocks take one sequence, text tokens then image tokens, and return it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from nodes.hooks import BlockIO, BlockStack

if TYPE_CHECKING:
    from torch import Tensor


def _arg(args: tuple[Any, ...], kwargs: Mapping[str, Any], name: str, position: int) -> Any:
    return kwargs[name] if name in kwargs else args[position]


def _pair_passthrough(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[Tensor, Tensor]:
    return _arg(args, kwargs, "encoder_hidden_states", 1), _arg(args, kwargs, "hidden_states", 0)


PAIR = BlockIO(  # (image, text) in, (text, image) out
    image_in=lambda args, kwargs: _arg(args, kwargs, "hidden_states", 0),
    image_out=lambda out, tokens: out[1],
    with_image=lambda out, image: (out[0], image),
    passthrough=_pair_passthrough,
)


def _joined_with_image(out: Tensor, image: Tensor) -> Tensor:
    import torch

    return torch.cat([out[:, : out.shape[1] - image.shape[1]], image], dim=1)


JOINED = BlockIO(  # one sequence [text, image] in and out
    image_in=lambda args, kwargs: _arg(args, kwargs, "hidden_states", 0),
    image_out=lambda out, tokens: out[:, out.shape[1] - tokens:],
    with_image=_joined_with_image,
    passthrough=lambda args, kwargs: _arg(args, kwargs, "hidden_states", 0),
)


def flux_block_stack(module: Any, joined_single: bool) -> BlockStack:
    """The double blocks then the single blocks of a Flux (``joined_single`` False) or Chroma
    transformer."""
    single = JOINED if joined_single else PAIR
    return BlockStack(tuple((b, PAIR) for b in module.transformer_blocks)
                      + tuple((b, single) for b in module.single_transformer_blocks))
