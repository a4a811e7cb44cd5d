"""What a Wan 2.1 image-to-video transformer (36 input channels, usually with ``img_emb``) reads besides
the latent and the text: the extra input channels and the CLIP vision tokens.

The extra channels (ComfyUI ``comfy/model_base.py``, ``WAN21.concat_cond``), from the conditioning
keys that WanImageToVideo and its siblings set (``nodes/family_nodes/wan_nodes.py``):

- ``concat_latent_image`` (VAE latents [n, 16, t, h, w]) is resized to the sampled latent (bilinear
  after a centre crop), put into the model's space by the latent format (per 16-channel group),
  repeated or picked to the rows' batch, and cut to 16 channels;
- ``concat_mask`` (else the sampler's ``denoise_mask``, the latent's noise mask, first reshaped to the
  latent as ComfyUI's ``reshape_mask`` does: a mask of fewer than 5 axes has its batch taken as
  frames, then trilinear to (frames, h, w); 1 where the model generates) is averaged over its
  channels unless it has 4, inverted (1 on the given frames), resized, padded with zeros to
  the latent's frames and repeated to 4 channels;
- no mask: 4 zero channels; no image at all: all 20 channels zero (the image unprocessed);
- the 4 mask channels go first, or at ``concat_mask_index`` inside the image channels.

diffusers' ``WanImageToVideoPipeline`` builds the same condition (its mask is already 1 on the given
frames, the first frame's mask repeated 4 times along the channel axis; the encoded frames
normalised by the VAE's mean and std), so the two agree when given the same frames.

The image tokens (``clip_fea`` = ``clip_vision_output.penultimate_hidden_states``): the transformer's
``img_emb`` projects them, they go before the text, and every block's cross-attention adds an
attention of the text queries over the image keys/values (``k_img``/``v_img``). diffusers takes the
image length as "everything before the last 512 tokens"; ComfyUI takes the CLIP tokens' count, and
without CLIP vision tokens the image keys/values are read from the whole text. Loom follows ComfyUI:
:class:`ImageCrossAttention` is installed on every block's cross-attention for the call, with the
image length of the call's rows.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from nodes.core.sampling_hooks import ConditioningError
from nodes.families.components.unet_inputs import center_resize, resize_to_batch

if TYPE_CHECKING:
    from torch import Tensor

    from nodes.families.latent_format import LatentFormat

MASK_CHANNELS = 4


@dataclass(frozen=True)
class ConcatInput:
    """One entry's extra-channel inputs (raw, as the conditioning holds them) for ``rows`` rows."""

    image: Tensor | None
    mask: Tensor | None
    index: int
    rows: int
    noise_mask: bool = False  # ``mask`` is the sampler's denoise mask (reshaped first)


def concat_input(extras: Mapping[str, Any], rows: int) -> ConcatInput:
    """The conditioning keys of one entry (see the module docstring)."""
    mask, noise = extras.get("concat_mask"), False
    if mask is None:
        mask, noise = extras.get("denoise_mask"), extras.get("denoise_mask") is not None
    index = int(extras.get("concat_mask_index", 0) or 0)
    return ConcatInput(extras.get("concat_latent_image"), mask, index, rows, noise)


def _noise_mask(mask: Tensor, latent: tuple[int, int, int]) -> Tensor:
    """ComfyUI's ``reshape_mask`` of a denoise mask to a video latent of (frames, h, w) cells."""
    mask = mask.float()
    if mask.ndim < 5:
        mask = mask.reshape(1, 1, -1, *mask.shape[-2:])
    return F.interpolate(mask, size=latent, mode="trilinear")


def _frames_resize(t: Tensor, size: tuple[int, int]) -> Tensor:
    """ComfyUI's ``common_upscale(..., "bilinear", "center")`` on a video [B, C, T, h, w] (frame by frame)."""
    if tuple(t.shape[-2:]) == size:
        return t
    b, c, frames = t.shape[:3]
    flat = t.movedim(2, 1).reshape(b * frames, c, *t.shape[-2:])
    return center_resize(flat, size).reshape(b, frames, c, *size).movedim(1, 2)


def _video_mask(mask: Tensor) -> Tensor:
    """A mask as [B, C, T, h, w]: image masks [B, h, w] / [h, w] get one channel and one frame."""
    mask = mask.float()
    if mask.ndim == 5:
        return mask
    if mask.ndim == 4:  # [B, C, h, w]
        return mask.unsqueeze(2)
    return mask.reshape(-1, 1, 1, *mask.shape[-2:])


def build_concat(
    inp: ConcatInput, extra: int, latent: tuple[int, int, int], latent_format: LatentFormat
) -> Tensor:
    """The ``extra`` input channels for ``inp.rows`` rows of a latent of (frames, h, w) cells."""
    frames, h, w = latent
    if inp.image is None:
        return torch.zeros(inp.rows, extra, frames, h, w)
    image = inp.image.float()
    if image.ndim != 5:
        raise ConditioningError(
            f"concat_latent_image has shape {tuple(image.shape)}; a Wan image-to-video model needs the start "
            "frames as a video latent [batch, 16, frames, height, width] (WanImageToVideo encodes them)"
        )
    image = _frames_resize(image, (h, w))
    size = latent_format.channels
    image = torch.cat(
        [latent_format.process_in(image[:, i : i + size]) for i in range(0, image.shape[1], size)], 1
    )
    image = resize_to_batch(image, inp.rows)[:, : extra - MASK_CHANNELS]
    if image.shape[2] != frames:
        raise ConditioningError(
            f"concat_latent_image has {image.shape[2]} latent frames but the sampled latent has {frames}; "
            "give WanImageToVideo the same length as the latent (use its LATENT output)"
        )
    if inp.mask is None:
        mask = torch.zeros(inp.rows, MASK_CHANNELS, frames, h, w)
    else:
        mask = _noise_mask(inp.mask, latent) if inp.noise_mask else _video_mask(inp.mask)
        if mask.shape[1] != MASK_CHANNELS:
            mask = mask.mean(dim=1, keepdim=True)
        mask = _frames_resize(1.0 - mask, (h, w))
        if mask.shape[2] < frames:
            mask = F.pad(mask, (0, 0, 0, 0, 0, frames - mask.shape[2]))
        mask = mask[:, :, :frames]
        if mask.shape[1] == 1:
            mask = mask.repeat(1, MASK_CHANNELS, 1, 1, 1)
        mask = resize_to_batch(mask, inp.rows)
    if inp.index:
        return torch.cat([image[:, : inp.index], mask, image[:, inp.index :]], dim=1)
    return torch.cat([mask, image], dim=1)


def image_tokens(extras: Mapping[str, Any], rows: int) -> list[Tensor | None]:
    """One entry's CLIP vision tokens (penultimate hidden states, (N, D)) per row, or None per row."""
    output = extras.get("clip_vision_output")
    if output is None:
        return [None] * rows
    states = output.penultimate_hidden_states
    states = states.unsqueeze(0) if states.ndim == 2 else states
    picked = states.repeat(-(-rows // states.shape[0]), 1, 1)[:rows]  # ComfyUI's repeat_to_batch_size
    return list(picked)


@dataclass(frozen=True)
class ImageCrossAttention:
    """A diffusers attention processor for a Wan I2V cross-attention (``add_k_proj``): the first
    ``image_len`` context tokens are the image's (None: the image keys/values read the whole context,
    as ComfyUI's ``WanI2VCrossAttention`` with no CLIP tokens), the rest the text's."""

    image_len: int | None

    def __call__(
        self,
        attn: Any,
        hidden_states: Tensor,
        encoder_hidden_states: Tensor | None = None,
        attention_mask: Tensor | None = None,
        rotary_emb: Any = None,
    ) -> Tensor:
        context = hidden_states if encoder_hidden_states is None else encoder_hidden_states
        n = self.image_len
        image, text = (context, context) if n is None else (context[:, :n], context[:, n:])
        query = attn.norm_q(attn.to_q(hidden_states)).unflatten(2, (attn.heads, -1))
        out = _attend(query, attn.norm_k(attn.to_k(text)), attn.to_v(text), attn.heads)
        out = out + _attend(
            query, attn.norm_added_k(attn.add_k_proj(image)), attn.add_v_proj(image), attn.heads
        )
        return attn.to_out[1](attn.to_out[0](out.type_as(hidden_states)))


def _attend(query: Tensor, key: Tensor, value: Tensor, heads: int) -> Tensor:
    """Plain attention of ``query`` (B, L, H, D) over key/value (B, S, H·D) -> (B, L, H·D)."""
    k = key.unflatten(2, (heads, -1)).transpose(1, 2)
    v = value.unflatten(2, (heads, -1)).transpose(1, 2)
    out = F.scaled_dot_product_attention(query.transpose(1, 2), k, v)
    return out.transpose(1, 2).flatten(2, 3)


def has_image_attention(module: Any) -> bool:
    """Whether ``module``'s blocks have the I2V image keys/values."""
    return bool(module.blocks) and getattr(module.blocks[0].attn2, "add_k_proj", None) is not None


@contextmanager
def image_attention(module: Any, image_len: int | None) -> Iterator[None]:
    """While the context runs, every block's cross-attention is an :class:`ImageCrossAttention` for
    ``image_len`` image tokens (no change for transformers without image keys/values)."""
    if not has_image_attention(module):
        yield
        return
    attns = [block.attn2 for block in module.blocks]
    before = [a.processor for a in attns]
    try:
        for a in attns:
            a.processor = ImageCrossAttention(image_len)
        yield
    finally:
        for a, processor in zip(attns, before, strict=True):
            a.processor = processor
