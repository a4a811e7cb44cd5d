"""The blocks of diffusers' DiT transformers as block-level step caches see them
(:class:`nodes.core.sampling_hooks.BlockStack`) and the lists skip-layer guidance may skip
(:class:`nodes.core.sampling_hooks.BlockList`); each family's denoiser kind declares its own from these.

Dual-stream blocks (Flux and Flux.2 double blocks, Chroma's double blocks, SD3's joint blocks,
Qwen-Image's blocks) take ``hidden_states`` (image) and ``encoder_hidden_states`` (text) and
return ``(encoder_hidden_states, hidden_states)`` (SD3's last block returns ``None`` for the text).
Chroma's and Flux.2's single blocks take one sequence, text tokens then image tokens, and return it.
Z-Image's main layers take and return one padded sequence of image and caption tokens per item,
passed first and positionally: the cache treats the whole sequence as the stream.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import torch

from nodes.core.sampling_hooks import BlockIO, BlockList, BlockStack, SkipListName

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
    return torch.cat([out[:, : out.shape[1] - image.shape[1]], image], dim=1)


JOINED = BlockIO(  # one sequence [text, image] in and out
    image_in=lambda args, kwargs: _arg(args, kwargs, "hidden_states", 0),
    image_out=lambda out, tokens: out[:, out.shape[1] - tokens :],
    with_image=_joined_with_image,
    passthrough=lambda args, kwargs: _arg(args, kwargs, "hidden_states", 0),
)


UNIFIED = BlockIO(  # one sequence in (first positional argument) and out, all of it the stream
    image_in=lambda args, kwargs: _arg(args, kwargs, "x", 0),
    image_out=lambda out, tokens: out,
    with_image=lambda out, image: image,
    passthrough=lambda args, kwargs: _arg(args, kwargs, "x", 0),
)


def dual_stream_stack(blocks: Any) -> BlockStack:
    """Dual-stream blocks only (SD3, Qwen-Image)."""
    return BlockStack(tuple((b, PAIR) for b in blocks))


def unified_stack(blocks: Any) -> BlockStack:
    """Blocks over one unified sequence (Z-Image's main layers)."""
    return BlockStack(tuple((b, UNIFIED) for b in blocks))


def flux_block_stack(module: Any, joined_single: bool) -> BlockStack:
    """The double blocks then the single blocks of a Flux (``joined_single`` False), Chroma or
    Flux.2 (``joined_single`` True) transformer."""
    single = JOINED if joined_single else PAIR
    return BlockStack(
        tuple((b, PAIR) for b in module.transformer_blocks)
        + tuple((b, single) for b in module.single_transformer_blocks)
    )


DUAL_STREAM_SKIP: Mapping[SkipListName, BlockList] = MappingProxyType(
    {"double": BlockList("transformer_blocks", PAIR)}
)
"""SD3's joint blocks and Qwen-Image's blocks are the ``double_block`` list of ComfyUI's models;
they have no single-stream list, so ``single_layers`` skips nothing there (as in ComfyUI)."""


def flux_skip_lists(joined_single: bool) -> Mapping[SkipListName, BlockList]:
    """Flux's, Chroma's and Flux.2's lists: the double blocks (``double_block``) and the single
    blocks (``single_block``), which take one joined sequence in Chroma and Flux.2."""
    return MappingProxyType(
        {
            "double": BlockList("transformer_blocks", PAIR),
            "single": BlockList("single_transformer_blocks", JOINED if joined_single else PAIR),
        }
    )
