"""Qwen2.5-VL's vision tower (transformers' ``Qwen2_5_VisionTransformerPretrainedModel``), which
Qwen-Image-Edit's text encoding uses to put input pictures into the prompt: the config from the
tensors, the key table, the build, ComfyUI's image preprocessing and the image tokens' multimodal
rotary positions.

Files: ComfyUI's ``qwen_2.5_vl_7b.safetensors`` / ``qwen_2.5_vl_7b_fp8_scaled.safetensors`` keep the
tower under ``visual.`` with transformers' own names (``visual.patch_embed.proj.weight``,
``visual.blocks.N.attn.qkv``, ``visual.blocks.N.mlp.gate_proj``, ``visual.merger.mlp.0``...), so the
table is the identity below the part's prefix (fp8-scaled weights are multiplied out on load).
The shapes give the width, depth, MLP width, patch sizes, merge size and output width. What they
cannot tell are constants of every released Qwen2.5-VL: 80-wide attention heads (16 for test
models narrower than 80), windows of 112 pixels, and full attention in every eighth block
(7, 15, 23, 31; the last block for models shallower than 8).

Preprocessing follows ComfyUI (``comfy/text_encoders/qwen_vl.py``), not transformers' image
processor: only the batch's first image is read; its sides are rounded to multiples of
patch × merge (28 px) and brought within the pixel bounds of the shipped processor config
(``models/configs/qwen25vl_processor``), resized by bilinear interpolation of the float image
(transformers resizes the 8-bit picture with PIL's bicubic filter: same grid, slightly different
pixels), normalised with the CLIP mean and std and cut into patches of
(temporal 2 × 3 × 14 × 14) values, the one frame repeated for the temporal pair.

Positions (ComfyUI's and transformers' M-RoPE rule): text tokens count up on all three axes; an
image's merged tokens all sit at temporal position ``s`` and at height ``s + row``, width
``s + col`` of their merged grid, where ``s`` is the position the image starts at; the text after
the image resumes at ``s + max(rows, cols)``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from nodes.core.tensors import ModelLoadError, TensorIndex
from nodes.families.components.scaled_fp8 import IdentityKeys

if TYPE_CHECKING:
    import torch

PROCESSOR_DIR = Path(__file__).resolve().parents[3] / "models" / "configs" / "qwen25vl_processor"
VISION_PREFIX = "visual."
HEAD_DIM = 80
TEST_HEAD_DIM = 16
WINDOW_SIZE = 112
FULL_ATTENTION_EVERY = 8


@dataclass(frozen=True)
class ImageEmbeds:
    """One picture as the language model takes it: the merged tokens (N, D) in row-major order of
    the merged grid, and that grid's (rows, cols)."""

    tokens: torch.Tensor
    rows: int
    cols: int


@dataclass(frozen=True)
class VisionInput:
    """One picture as the tower takes it: patches (N, C·T·P·P) and the patch grid (1, H, W)."""

    patches: torch.Tensor
    grid: tuple[int, int, int]


def processor_config() -> dict[str, Any]:
    """The shipped Qwen2.5-VL image processor settings (pixel bounds, patch sizes, mean, std)."""
    return dict(json.loads((PROCESSOR_DIR / "preprocessor_config.json").read_text(encoding="utf-8")))


def full_attention_blocks(depth: int) -> list[int]:
    return [i for i in range(depth) if i % FULL_ATTENTION_EVERY == FULL_ATTENTION_EVERY - 1] or [depth - 1]


@dataclass(frozen=True)
class Qwen25Vision(IdentityKeys):
    """The vision tower kind (see the module docstring)."""

    id: str = "qwen25vl_vision"

    @staticmethod
    def present(index: TensorIndex, prefix: str = VISION_PREFIX) -> bool:
        """Whether ``index`` holds a whole tower under ``prefix`` (its first and last parts)."""
        needed = ("patch_embed.proj.weight", "blocks.0.mlp.gate_proj.weight", "merger.mlp.2.weight")
        return all(index.has(f"{prefix}{k}") for k in needed)

    @classmethod
    def config_from_tensors(cls, index: TensorIndex, prefix: str = VISION_PREFIX) -> dict[str, Any]:
        """``Qwen2_5_VLVisionConfig`` kwargs read from the shapes under ``prefix``."""
        if not cls.present(index, prefix):
            raise ModelLoadError(
                f"{index.path}: no Qwen2.5-VL vision tower ({prefix}patch_embed, {prefix}blocks.N, "
                f"{prefix}merger) in this file"
            )
        hidden, channels, temporal, patch, _ = index.shape(f"{prefix}patch_embed.proj.weight")
        merge = math.isqrt(index.shape(f"{prefix}merger.mlp.0.weight")[1] // hidden)
        head_dim = HEAD_DIM if hidden % HEAD_DIM == 0 else TEST_HEAD_DIM
        depth = index.count(f"{prefix}blocks.")
        return {
            "depth": depth,
            "hidden_size": hidden,
            "hidden_act": "silu",
            "intermediate_size": index.shape(f"{prefix}blocks.0.mlp.gate_proj.weight")[0],
            "num_heads": hidden // head_dim,
            "in_channels": channels,
            "patch_size": patch,
            "temporal_patch_size": temporal,
            "spatial_merge_size": merge,
            "out_hidden_size": index.shape(f"{prefix}merger.mlp.2.weight")[0],
            "window_size": WINDOW_SIZE,
            "fullatt_block_indexes": full_attention_blocks(depth),
        }

    def empty(self, config: Mapping[str, Any]) -> Any:
        from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import (  # lazy: transformers is heavy
            Qwen2_5_VLVisionConfig,
        )
        from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import (  # lazy: transformers is heavy to import
            Qwen2_5_VisionTransformerPretrainedModel,
        )

        return Qwen2_5_VisionTransformerPretrainedModel(Qwen2_5_VLVisionConfig(**config))

    def from_pretrained(self, path: Path, safetensors: bool) -> Any:
        raise ModelLoadError(f"{path}: Loom reads the Qwen2.5-VL vision tower from single files only")


def vision_input(image: torch.Tensor, config: Mapping[str, Any] | None = None) -> VisionInput:
    """ComfyUI's preprocessing of the first image of ``image`` [B, H, W, C] (0..1) into patches."""

    cfg = processor_config() if config is None else config
    patch, temporal, merge = int(cfg["patch_size"]), int(cfg["temporal_patch_size"]), int(cfg["merge_size"])
    height, width = int(image.shape[1]), int(image.shape[2])
    h_bar, w_bar = resized_size(height, width, cfg)
    pixels = image[0, :, :, :3].movedim(-1, 0).float()
    pixels = F.interpolate(pixels[None], size=(h_bar, w_bar), mode="bilinear", align_corners=False)[0]
    mean = torch.tensor(cfg["image_mean"], dtype=pixels.dtype, device=pixels.device).view(3, 1, 1)
    std = torch.tensor(cfg["image_std"], dtype=pixels.dtype, device=pixels.device).view(3, 1, 1)
    pixels = (pixels - mean) / std
    rows, cols = h_bar // patch, w_bar // patch
    frames = pixels[None].expand(temporal, -1, -1, -1)  # one picture, repeated for the temporal patch
    patches = frames.reshape(temporal, 3, rows // merge, merge, patch, cols // merge, merge, patch)
    patches = patches.permute(2, 5, 3, 6, 1, 0, 4, 7).reshape(rows * cols, 3 * temporal * patch * patch)
    return VisionInput(patches.contiguous(), (1, rows, cols))


def resized_size(height: int, width: int, cfg: Mapping[str, Any]) -> tuple[int, int]:
    """The (height, width) the tower sees: multiples of patch × merge within the pixel bounds."""
    factor = int(cfg["patch_size"]) * int(cfg["merge_size"])
    low, high = int(cfg["min_pixels"]), int(cfg["max_pixels"])
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    if h_bar * w_bar > high:
        beta = math.sqrt(height * width / high)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < low:
        beta = math.sqrt(low / (height * width))
        h_bar, w_bar = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def embed_image(tower: Any, image: torch.Tensor) -> ImageEmbeds:
    """``image``'s merged tokens from the vision ``tower`` (on its device, in its precision)."""

    param = next(tower.parameters())
    item = vision_input(image)
    grid = torch.tensor([item.grid], device=param.device)
    with torch.no_grad():
        out = tower(item.patches.to(param.device, param.dtype), grid_thw=grid)
    merge = int(tower.spatial_merge_size)
    return ImageEmbeds(out.pooler_output, item.grid[1] // merge, item.grid[2] // merge)


def splice_positions(pieces: Sequence[int | ImageEmbeds]) -> torch.Tensor:
    """The (3, T) multimodal rotary positions of a sequence of token ids and pictures (see the
    module docstring); T counts every picture's tokens."""

    columns: list[torch.Tensor] = []
    pos = 0
    for piece in pieces:
        if isinstance(piece, ImageEmbeds):
            rows = torch.arange(piece.rows).repeat_interleave(piece.cols)
            cols = torch.arange(piece.cols).repeat(piece.rows)
            columns.append(torch.stack([torch.zeros_like(rows), rows, cols]) + pos)
            pos += max(piece.rows, piece.cols)
        else:
            columns.append(torch.full((3, 1), pos))
            pos += 1
    return torch.cat(columns, dim=1)
