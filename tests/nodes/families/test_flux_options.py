"""ComfyUI's smaller Flux nodes: FluxDisableGuidance (no guidance embedding at all, not guidance
0), T5TokenizerOptions (min_padding / min_length reach the T5 tokens of Flux and Chroma through the
CLIP handle's declared options) and ModelMergeFlux1 (one ratio per BFL block name, q/k/v and MLP
parts following their fused tensor's block)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from nodes.demo.flux import DEMO_CHROMA, DEMO_CLIP_L, DEMO_FLUX_DEV, DEMO_T5XXL, demo_flux_modules, flux_files
from nodes.encode.conditioning import CLIPTextEncode
from nodes.family_nodes.flux_nodes import (
    EmptySD3LatentImage,
    FluxDisableGuidance,
    FluxGuidance,
    ModelMergeFlux1,
)
from nodes.load.checkpoint_loaders import T5TokenizerOptions
from nodes.load.handles import open_diffusion_model, open_text_encoders
from nodes.sample.ksampler import KSampler

torch.set_num_threads(1)


@pytest.fixture
def demo(flux_demo: Path) -> Path:
    return flux_demo


def flux_clip(demo: Path) -> Any:
    return open_text_encoders(
        [demo / "text_encoders" / DEMO_T5XXL, demo / "text_encoders" / DEMO_CLIP_L], "flux"
    )


def sample(ctx: Any, model: Any, cond: Any) -> torch.Tensor:
    latent = EmptySD3LatentImage().run(ctx, width=32, height=32, batch_size=1)[0]
    return KSampler().run(
        ctx,
        model=model,
        seed=1,
        steps=2,
        cfg=1.0,
        sampler_name="euler",
        scheduler="simple",
        positive=cond,
        negative=cond,
        latent_image=latent,
        denoise=1.0,
    )[0]["samples"]


# --- FluxDisableGuidance -------------------------------------------------------------------------


def test_disabled_guidance_drops_the_guidance_embedding(demo: Path, make_ctx: Any) -> None:
    ctx = make_ctx()
    model = open_diffusion_model(demo / "diffusion_models" / DEMO_FLUX_DEV)
    text = CLIPTextEncode().run(ctx, text="a cat", clip=flux_clip(demo))[0]
    disabled = FluxDisableGuidance().run(
        ctx, conditioning=FluxGuidance().run(ctx, conditioning=text, guidance=7.0)[0]
    )[0]
    assert disabled[0].extras["guidance"] is None
    off = sample(ctx, model, disabled)
    zero = sample(ctx, model, FluxGuidance().run(ctx, conditioning=text, guidance=0.0)[0])
    assert (off - zero).abs().max() > 1e-4  # guidance 0 still adds an embedding; disabled adds none
    with ctx.models.use(model) as module:  # the same as a guidance embedder that outputs zeros
        layer = module.time_text_embed.guidance_embedder.linear_2
        saved = layer.weight.clone(), layer.bias.clone()
        with torch.no_grad():
            layer.weight.zero_()
            layer.bias.zero_()
    try:
        silenced = sample(ctx, model, FluxGuidance().run(ctx, conditioning=text, guidance=3.5)[0])
    finally:
        with torch.no_grad():
            layer.weight.copy_(saved[0])
            layer.bias.copy_(saved[1])
    torch.testing.assert_close(off, silenced)


# --- T5TokenizerOptions --------------------------------------------------------------------------


def t5_tokens(ctx: Any, clip: Any, text: str) -> int:
    return int(CLIPTextEncode().run(ctx, text=text, clip=clip)[0][0].embeds.shape[1])


def test_t5_tokenizer_options_set_flux_padding(demo: Path, make_ctx: Any) -> None:
    ctx, clip = make_ctx(), flux_clip(demo)
    assert t5_tokens(ctx, clip, "a red fox") == 256  # Flux's own min_length
    bare = T5TokenizerOptions().run(ctx, clip=clip, min_padding=0, min_length=0)[0]
    assert bare.tokenizer_options_for("t5xxl").min_length == 0
    words = t5_tokens(ctx, bare, "a red fox")  # the prompt's tokens and </s>, no padding
    assert words < 10
    padded = T5TokenizerOptions().run(ctx, clip=clip, min_padding=3, min_length=0)[0]
    assert t5_tokens(ctx, padded, "a red fox") == words + 3
    longer = T5TokenizerOptions().run(ctx, clip=clip, min_padding=2, min_length=300)[0]
    assert t5_tokens(ctx, longer, "a red fox") == 300
    assert clip.tokenizer_options == ()  # the input handle is unchanged
    assert t5_tokens(ctx, clip, "a red fox") == 256


def test_t5_tokenizer_options_reach_chroma(demo: Path, make_ctx: Any) -> None:
    """Chroma's workflows add one pad token (min_padding 1) to its unpadded T5 prompt."""
    ctx = make_ctx()
    clip = open_text_encoders([demo / "text_encoders" / DEMO_T5XXL], "chroma")
    plain = t5_tokens(ctx, clip, "a red fox")
    one_pad = T5TokenizerOptions().run(ctx, clip=clip, min_padding=1, min_length=0)[0]
    assert t5_tokens(ctx, one_pad, "a red fox") == plain + 1
    assert DEMO_CHROMA  # the Chroma demo shares this T5 file


# --- ModelMergeFlux1 -----------------------------------------------------------------------------


def test_model_merge_flux1_schema_is_comfyuis() -> None:
    names = [i.name for i in ModelMergeFlux1.SCHEMA.inputs]
    assert names[:7] == ["model1", "model2", "img_in.", "time_in.", "guidance_in", "vector_in.", "txt_in."]
    assert names[7:26] == [f"double_blocks.{i}." for i in range(19)]
    assert names[26:64] == [f"single_blocks.{i}." for i in range(38)]
    assert names[64:] == ["final_layer."]
    assert all(i.default == 1.0 and i.min == 0.0 and i.max == 1.0 for i in ModelMergeFlux1.SCHEMA.inputs[2:])


def test_model_merge_flux1_takes_each_blocks_ratio(demo: Path, tmp_path: Path, make_ctx: Any) -> None:
    from safetensors.torch import save_file

    other = flux_files(demo_flux_modules(seed=5, guidance=True))[DEMO_FLUX_DEV]
    save_file({k: v.contiguous() for k, v in other.items()}, str(tmp_path / "other.safetensors"))
    ctx = make_ctx()
    m1 = open_diffusion_model(demo / "diffusion_models" / DEMO_FLUX_DEV)
    m2 = open_diffusion_model(tmp_path / "other.safetensors")
    ratios = {i.name: 1.0 for i in ModelMergeFlux1.SCHEMA.inputs[2:]}
    ratios |= {"double_blocks.0.": 0.0, "single_blocks.1.": 0.25, "img_in.": 0.5, "guidance_in": 0.75}
    merged = ModelMergeFlux1().run(ctx, model1=m1, model2=m2, **ratios)[0]
    with ctx.models.use(m1) as a:
        w1 = {k: v.clone() for k, v in a.state_dict().items()}
    with ctx.models.use(m2) as b:
        w2 = {k: v.clone() for k, v in b.state_dict().items()}
    with ctx.models.use(merged) as c:
        w = c.state_dict()
        for key, ratio in (
            ("transformer_blocks.0.attn.to_q.weight", 0.0),  # fused img_attn.qkv of double block 0
            ("transformer_blocks.0.attn.add_v_proj.bias", 0.0),
            ("transformer_blocks.0.ff.net.2.weight", 0.0),
            ("single_transformer_blocks.1.proj_mlp.weight", 0.25),  # part of linear1
            ("single_transformer_blocks.1.attn.to_k.weight", 0.25),
            ("single_transformer_blocks.0.attn.to_k.weight", 1.0),
            ("x_embedder.weight", 0.5),  # img_in.
            ("norm_out.linear.weight", 1.0),
            ("time_text_embed.guidance_embedder.linear_1.weight", 0.75),
        ):  # "guidance_in" (no dot)
            expected = w1[key] * ratio + w2[key] * (1 - ratio)
            assert torch.allclose(w[key], expected, atol=1e-6), key
