"""Tiny, seeded SD1.x and SDXL components for the generation tests (real classes, tiny configs).

Built directly with diffusers/transformers, so the generation stations can be checked against
diffusers' own pipelines on the very same modules. The 4-block VAE makes latents 1/8 of the image
like the real one (see ../shared/ENVIRONMENT.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from diffusers import AutoencoderKL, UNet2DConditionModel
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection, CLIPTokenizer

TOKENIZER_DIR = Path(__file__).resolve().parents[2] / "models" / "configs" / "clip_tokenizer"

SD15_SCHEDULER = {
    "num_train_timesteps": 1000,
    "beta_start": 0.00085,
    "beta_end": 0.012,
    "beta_schedule": "scaled_linear",
    "prediction_type": "epsilon",
    "steps_offset": 1,
    "clip_sample": False,
    "set_alpha_to_one": False,
}


@dataclass
class TinyComponents:
    unet: UNet2DConditionModel
    vae: AutoencoderKL
    tokenizers: list[Any]
    text_encoders: list[Any]
    scheduler_config: dict[str, Any]


def tokenizer(pad_token: str | None = None) -> Any:
    if pad_token is None:
        return CLIPTokenizer.from_pretrained(str(TOKENIZER_DIR))
    return CLIPTokenizer.from_pretrained(str(TOKENIZER_DIR), pad_token=pad_token)


def _text_config(hidden: int = 32) -> CLIPTextConfig:
    return CLIPTextConfig(
        bos_token_id=49406,
        eos_token_id=49407,
        pad_token_id=49407,
        hidden_size=hidden,
        intermediate_size=37,
        layer_norm_eps=1e-5,
        num_attention_heads=4,
        num_hidden_layers=3,
        vocab_size=49408,
        max_position_embeddings=77,
        hidden_act="gelu",
        projection_dim=32,
    )


def tiny_vae(scaling_factor: float = 0.18215) -> AutoencoderKL:
    torch.manual_seed(2)
    return AutoencoderKL(
        block_out_channels=(32, 64, 64, 64),
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        latent_channels=4,
        layers_per_block=1,
        norm_num_groups=32,
        sample_size=64,
        scaling_factor=scaling_factor,
    ).eval()


def tiny_sd15(prediction_type: str = "epsilon") -> TinyComponents:
    torch.manual_seed(0)
    unet = UNet2DConditionModel(
        block_out_channels=(32, 64),
        layers_per_block=1,
        sample_size=8,
        in_channels=4,
        out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=32,
        attention_head_dim=8,
        norm_num_groups=32,
    ).eval()
    torch.manual_seed(1)
    text_encoder = CLIPTextModel(_text_config()).eval()
    return TinyComponents(
        unet=unet,
        vae=tiny_vae(),
        tokenizers=[tokenizer()],
        text_encoders=[text_encoder],
        scheduler_config={**SD15_SCHEDULER, "prediction_type": prediction_type},
    )


def tiny_sdxl() -> TinyComponents:
    torch.manual_seed(0)
    unet = UNet2DConditionModel(
        block_out_channels=(32, 64),
        layers_per_block=1,
        sample_size=8,
        in_channels=4,
        out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        attention_head_dim=(2, 4),
        use_linear_projection=True,
        addition_embed_type="text_time",
        addition_time_embed_dim=8,
        transformer_layers_per_block=(1, 2),
        projection_class_embeddings_input_dim=80,  # 6 * 8 time ids + 32 pooled
        cross_attention_dim=64,
        norm_num_groups=1,
    ).eval()
    torch.manual_seed(1)
    te1 = CLIPTextModel(_text_config()).eval()
    torch.manual_seed(3)
    te2 = CLIPTextModelWithProjection(_text_config()).eval()
    return TinyComponents(
        unet=unet,
        vae=tiny_vae(0.13025),
        tokenizers=[tokenizer(), tokenizer(pad_token="!")],
        text_encoders=[te1, te2],
        scheduler_config=dict(SD15_SCHEDULER),
    )


def gradient_image(size: int = 64, batch: int = 1) -> torch.Tensor:
    """A smooth test picture [B, H, W, 3] in 0..1."""
    ys = torch.linspace(0, 1, size).view(size, 1).expand(size, size)
    xs = torch.linspace(0, 1, size).view(1, size).expand(size, size)
    img = torch.stack([xs, ys, (xs + ys) / 2], dim=-1)
    return img.unsqueeze(0).repeat(batch, 1, 1, 1)
