"""ComfyUI's SD3 nodes on the tiny demo models: CLIPTextEncodeSD3's empty_padding and per-encoder
prompts (ComfyUI's token rules), ModelSamplingSD3, the skip-layer guidance nodes (their formulas,
and that they change the image only while active), the SD3 block-wise merges, and SD3 LoRAs in the
kohya, ComfyUI and diffusers/PEFT layouts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from nodes.core.sampling_hooks import BlockSkip
from nodes.demo.sd3 import (
    DEMO_SD3_CLIP_G,
    DEMO_SD3_CLIP_L,
    DEMO_SD3_MMDIT,
    DEMO_SD3_T5XXL,
    demo_sd3_modules,
    demo_sd3_transformer,
    sd3_files,
)
from nodes.encode.conditioning import CLIPTextEncode
from nodes.families.components.sd3_dit import SD3Transformer
from nodes.family_nodes.flux_nodes import EmptySD3LatentImage
from nodes.family_nodes.sd3_nodes import (
    CLIPTextEncodeSD3,
    ModelMergeSD3_2B,
    ModelMergeSD35_Large,
    ModelSamplingSD3,
    SkipLayerGuidanceDiT,
    SkipLayerGuidanceDiTSimple,
    SkipLayerGuidanceSD3,
    slg_hooks,
    slg_simple_hooks,
)
from nodes.load.handles import open_diffusion_model, open_text_encoders
from nodes.sample.ksampler import KSampler

torch.set_num_threads(1)
OTHER = "other_mmdit.safetensors"


@pytest.fixture(scope="module")
def sd3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from safetensors.torch import save_file

    root = tmp_path_factory.mktemp("sd3_nodes")
    files = sd3_files(demo_sd3_modules())
    other = demo_sd3_transformer(seed=5)
    files[OTHER] = SD3Transformer().to_original(other.state_dict(), other.config)
    for name, tensors in files.items():
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(root / name))
    return root


def _clip(root: Path) -> Any:
    return open_text_encoders([root / DEMO_SD3_CLIP_L, root / DEMO_SD3_CLIP_G, root / DEMO_SD3_T5XXL], "sd3")


def _encode_sd3(ctx: Any, clip: Any, l: str, g: str, t5: str, padding: str) -> Any:  # noqa: E741
    return CLIPTextEncodeSD3().run(ctx, clip=clip, clip_l=l, clip_g=g, t5xxl=t5, empty_padding=padding)[0][0]


def test_clip_text_encode_sd3_with_one_text_equals_clip_text_encode(sd3_dir: Path, make_ctx: Any) -> None:
    ctx, clip = make_ctx(), _clip(sd3_dir)
    plain = CLIPTextEncode().run(ctx, text="a cat", clip=clip)[0][0]
    for padding in ("none", "empty_prompt"):
        entry = _encode_sd3(ctx, clip, "a cat", "a cat", "a cat", padding)
        assert torch.equal(entry.embeds, plain.embeds) and torch.equal(entry.pooled, plain.pooled)
    empty = _encode_sd3(ctx, clip, "", "", "", "empty_prompt")
    assert torch.equal(empty.embeds, CLIPTextEncode().run(ctx, text="", clip=clip)[0][0].embeds)


def test_empty_padding_none_leaves_empty_prompts_out(sd3_dir: Path, make_ctx: Any) -> None:
    """All empty: no CLIP tokens, pooled zeros, T5 only its end token (ComfyUI encodes an empty
    token list as the end token alone)."""
    ctx, clip = make_ctx(), _clip(sd3_dir)
    entry = _encode_sd3(ctx, clip, "", "", "", "none")
    assert entry.embeds.shape == (1, 1, 64)
    assert entry.pooled.shape == (1, 64) and entry.pooled.abs().max() == 0
    t5_only = _encode_sd3(ctx, clip, "", "", "a cat", "none")
    both = _encode_sd3(ctx, clip, "a cat", "a cat", "a cat", "none")
    assert torch.equal(t5_only.embeds, both.embeds[:, 77:])  # the CLIP tokens left out


def test_an_empty_clip_prompt_becomes_the_empty_prompt_and_chunks_are_matched(
    sd3_dir: Path, make_ctx: Any
) -> None:
    ctx, clip = make_ctx(), _clip(sd3_dir)
    empty_l = _encode_sd3(ctx, clip, "", "a cat", "a cat", "none")
    plain_empty = CLIPTextEncode().run(ctx, text="", clip=clip)[0][0]
    plain_cat = CLIPTextEncode().run(ctx, text="a cat", clip=clip)[0][0]
    assert torch.equal(empty_l.embeds[:, :77, :32], plain_empty.embeds[:, :77, :32])  # CLIP-L: ""
    assert torch.equal(empty_l.embeds[:, :77, 32:], plain_cat.embeds[:, :77, 32:])  # CLIP-G: the text
    long_g = _encode_sd3(ctx, clip, "a cat", "word " * 100, "a cat", "none")  # 2 CLIP-G chunks
    assert long_g.embeds.shape == (1, 2 * 77 + 77, 64)
    assert torch.equal(
        long_g.embeds[:, 77:154, :32], plain_empty.embeds[:, :77, :32]
    )  # CLIP-L padded with ""


def test_model_sampling_sd3_sets_the_shift(sd3_dir: Path, make_ctx: Any) -> None:
    from nodes.diffusion.model_sampling import flow

    model = open_diffusion_model(sd3_dir / DEMO_SD3_MMDIT)
    shifted = ModelSamplingSD3().run(make_ctx(), model=model, shift=6.0)[0]
    t = torch.tensor([500.0])
    assert shifted.model_sampling.sigma(t).item() == pytest.approx(flow(shift=6.0).sigma(t).item())
    assert shifted.model_sampling.sigma(t).item() > model.model_sampling.sigma(t).item()
    assert shifted.key == model.key  # the weights are the same


class FakeRun:
    """Records the calls a skip-layer hook makes (what GuidedRun.calc_batch would compute)."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[str | None], BlockSkip | None]] = []

    def calc_batch(
        self,
        names: list[str | None],
        x: torch.Tensor,
        sigma: torch.Tensor,
        *,
        block_skip: BlockSkip | None = None,
    ) -> list[torch.Tensor]:
        self.calls.append((list(names), block_skip))
        return [torch.full_like(x, 10.0 if block_skip else 1.0) * (i + 1) for i in range(len(names))]


def test_skip_layer_guidance_formula_and_range() -> None:
    skip = BlockSkip((7, 8))
    (post,) = slg_hooks(skip, scale=3.0, sigma_start=0.9, sigma_end=0.2, rescaling_scale=0.0).post_cfg
    x, run = torch.zeros(1, 2, 2, 2), FakeRun()
    args = {
        "denoised": torch.full_like(x, 5.0),
        "cond_denoised": torch.full_like(x, 2.0),
        "input": x,
        "model": run,
        "branches": ("positive", "negative"),
    }
    out = post(args | {"sigma": torch.tensor([0.5])})
    assert run.calls == [(["positive"], skip)]
    assert torch.allclose(out, torch.full_like(x, 5.0 + (2.0 - 10.0) * 3.0))
    assert torch.equal(post(args | {"sigma": torch.tensor([0.95])}), args["denoised"])  # outside the range
    (rescaled,) = slg_hooks(skip, 3.0, 0.9, 0.2, rescaling_scale=0.5).post_cfg
    cond = torch.randn_like(x)
    result = rescaled(args | {"sigma": torch.tensor([0.5]), "cond_denoised": cond})
    guided = args["denoised"] + (cond - 10.0) * 3.0
    factor = 0.5 * cond.std() / guided.std() + 0.5
    assert torch.allclose(result, guided * factor)


def test_skip_layer_guidance_simple_skips_only_in_the_negative() -> None:
    skip = BlockSkip((), (3,))
    calc = slg_simple_hooks(skip, sigma_start=1.0, sigma_end=0.0).calc_cond_batch
    assert calc is not None
    run, x = FakeRun(), torch.zeros(1, 1, 1, 1)
    cond, uncond = calc(
        {"model": run, "conds": ["positive", "negative"], "input": x, "sigma": torch.tensor([0.5])}
    )
    assert run.calls == [(["positive", None], None), ([None, "negative"], skip)]
    assert cond.item() == 1.0 and uncond.item() == 20.0
    run.calls.clear()
    calc(
        {"model": run, "conds": ["positive", None], "input": x, "sigma": torch.tensor([0.5])}
    )  # cfg 1: no negative
    assert run.calls == [(["positive", None], None)]


def _sample(ctx: Any, model: Any, clip: Any, cfg: float = 3.0) -> torch.Tensor:
    pos = CLIPTextEncode().run(ctx, text="a cat", clip=clip)[0]
    neg = CLIPTextEncode().run(ctx, text="", clip=clip)[0]
    latent = EmptySD3LatentImage().run(ctx, width=64, height=64, batch_size=1)[0]
    return KSampler().run(
        ctx,
        model=model,
        seed=1,
        steps=3,
        cfg=cfg,
        sampler_name="euler",
        scheduler="normal",
        positive=pos,
        negative=neg,
        latent_image=latent,
        denoise=1.0,
    )[0]["samples"]


def test_skip_layer_guidance_nodes_change_sampling_only_when_active(sd3_dir: Path, make_ctx: Any) -> None:
    ctx, clip = make_ctx(), _clip(sd3_dir)
    model = open_diffusion_model(sd3_dir / DEMO_SD3_MMDIT)
    base = _sample(ctx, model, clip)
    assert (
        SkipLayerGuidanceSD3().run(
            ctx, model=model, layers="", scale=3.0, start_percent=0.0, end_percent=1.0
        )[0]
        is model
    )  # no layers: the model unchanged
    off = SkipLayerGuidanceSD3().run(
        ctx, model=model, layers="1", scale=0.0, start_percent=0.0, end_percent=1.0
    )[0]
    assert torch.equal(_sample(ctx, off, clip), base)
    on = SkipLayerGuidanceSD3().run(
        ctx, model=model, layers="1", scale=3.0, start_percent=0.0, end_percent=1.0
    )[0]
    dit = SkipLayerGuidanceDiT().run(
        ctx,
        model=model,
        double_layers="1",
        single_layers="",
        scale=3.0,
        start_percent=0.0,
        end_percent=1.0,
        rescaling_scale=0.0,
    )[0]
    guided = _sample(ctx, on, clip)
    assert (guided - base).abs().max() > 1e-3
    assert torch.equal(
        _sample(ctx, dit, clip), guided
    )  # SkipLayerGuidanceSD3 is the DiT node on joint blocks
    simple = SkipLayerGuidanceDiTSimple().run(
        ctx, model=model, double_layers="0, 2", single_layers="", start_percent=0.0, end_percent=1.0
    )[0]
    assert (_sample(ctx, simple, clip) - base).abs().max() > 1e-3


def test_model_merge_sd3_2b_takes_ratios_per_joint_block(sd3_dir: Path, make_ctx: Any) -> None:
    schema = ModelMergeSD3_2B.SCHEMA
    assert [i.name for i in schema.inputs][:8] == [
        "model1",
        "model2",
        "pos_embed.",
        "x_embedder.",
        "context_embedder.",
        "y_embedder.",
        "t_embedder.",
        "joint_blocks.0.",
    ]
    assert len(schema.inputs) == 2 + 5 + 24 + 1 and schema.inputs[-1].name == "final_layer."
    assert [i.name for i in ModelMergeSD35_Large.SCHEMA.inputs][-2:] == ["joint_blocks.37.", "final_layer."]
    m1, m2 = open_diffusion_model(sd3_dir / DEMO_SD3_MMDIT), open_diffusion_model(sd3_dir / OTHER)
    ratios = {i.name: 1.0 for i in schema.inputs[2:]} | {"joint_blocks.1.": 0.0, "context_embedder.": 0.25}
    merged = ModelMergeSD3_2B().run(make_ctx(), model1=m1, model2=m2, **ratios)[0].load().state_dict()
    a, b = m1.load().state_dict(), m2.load().state_dict()
    for key in ("transformer_blocks.1.attn.to_q.weight", "transformer_blocks.1.ff.net.2.bias"):
        assert torch.equal(merged[key], b[key])
    assert torch.equal(
        merged["transformer_blocks.0.attn.to_q.weight"], a["transformer_blocks.0.attn.to_q.weight"]
    )
    torch.testing.assert_close(
        merged["context_embedder.weight"],
        a["context_embedder.weight"] * 0.25 + b["context_embedder.weight"] * 0.75,
    )


RANK, ALPHA, STRENGTH = 2, 1.0, 0.7
FUSED = (
    "joint_blocks.0.x_block.attn.qkv",
    "joint_blocks.0.x_block.attn2.qkv",
    "joint_blocks.2.context_block.adaLN_modulation.1",
    "final_layer.adaLN_modulation.1",
    "context_embedder",
)


@pytest.mark.parametrize("layout", ["kohya", "comfyui", "peft"])
def test_sd3_lora_equals_editing_the_file(layout: str, sd3_dir: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    from nodes.core.weights import fingerprint
    from nodes.load.lora import LoraPatch

    original = load_file(str(sd3_dir / DEMO_SD3_MMDIT))
    torch.manual_seed(3)
    tensors, edited = {}, dict(original)
    for name in FUSED:
        rows, cols = original[f"{name}.weight"].shape
        down, up = torch.randn(RANK, cols), torch.randn(rows, RANK)
        edited[f"{name}.weight"] = original[f"{name}.weight"] + STRENGTH * (ALPHA / RANK) * (up @ down)
        head = {"kohya": "lora_unet_" + name.replace(".", "_"), "comfyui": f"diffusion_model.{name}"}.get(
            layout
        )
        if head is None:
            continue
        a, b = ("lora_down", "lora_up") if layout == "kohya" else ("lora_A", "lora_B")
        tensors |= {
            f"{head}.{a}.weight": down,
            f"{head}.{b}.weight": up,
            f"{head}.alpha": torch.tensor(ALPHA),
        }
    handle = open_diffusion_model(sd3_dir / DEMO_SD3_MMDIT)
    config = handle.parts[0].config
    if layout == "peft":  # diffusers names: the split pieces of the same change
        tensors, edited = {}, dict(original)
        base = handle.load().state_dict()["transformer_blocks.1.attn.add_k_proj.weight"]
        down, up = torch.randn(RANK, base.shape[1]), torch.randn(base.shape[0], RANK)
        tensors = {
            "transformer.transformer_blocks.1.attn.add_k_proj.lora_A.weight": down,
            "transformer.transformer_blocks.1.attn.add_k_proj.lora_B.weight": up,
        }
        expected = handle.load().state_dict()
        expected["transformer_blocks.1.attn.add_k_proj.weight"] = base + STRENGTH * (up @ down)
    else:
        expected = SD3Transformer().to_diffusers(edited, config)
    save_file(tensors, str(tmp_path / "lora.safetensors"))
    patch = LoraPatch(
        tmp_path / "lora.safetensors", fingerprint(tmp_path / "lora.safetensors"), STRENGTH, "unet"
    )
    patched = handle.with_patch(patch).load().state_dict()
    assert patched.keys() == expected.keys()
    for key, value in expected.items():
        torch.testing.assert_close(patched[key], value, atol=1e-5, rtol=1e-5, msg=key)


def test_clip_text_encode_sd3_refuses_another_familys_clip(sd3_dir: Path, make_ctx: Any) -> None:
    from nodes.family_nodes.sd3_nodes import SD3EncodeError

    flux_clip = open_text_encoders([sd3_dir / DEMO_SD3_CLIP_L, sd3_dir / DEMO_SD3_T5XXL], "flux")
    with pytest.raises(SD3EncodeError, match="TripleCLIPLoader"):
        _encode_sd3(make_ctx(), flux_clip, "a", "a", "a", "none")


def test_kohya_text_encoder_lora_reaches_clip_l_and_clip_g(sd3_dir: Path, tmp_path: Path) -> None:
    """kohya's lora_te1_ (CLIP-L) and lora_te2_ (CLIP-G) layers land on SD3's first two encoders."""
    from safetensors.torch import save_file

    from nodes.core.weights import fingerprint
    from nodes.load.lora import LoraPatch

    clip = _clip(sd3_dir)
    torch.manual_seed(4)
    g_down, g_up, l_down, l_up = (
        torch.randn(2, 32),
        torch.randn(32, 2),
        torch.randn(2, 32),
        torch.randn(64, 2),
    )
    save_file(
        {
            "lora_te2_text_model_encoder_layers_0_self_attn_q_proj.lora_down.weight": g_down,
            "lora_te2_text_model_encoder_layers_0_self_attn_q_proj.lora_up.weight": g_up,
            "lora_te1_text_model_encoder_layers_1_mlp_fc1.lora_down.weight": l_down,
            "lora_te1_text_model_encoder_layers_1_mlp_fc1.lora_up.weight": l_up,
        },
        str(tmp_path / "te.safetensors"),
    )
    patch = LoraPatch(tmp_path / "te.safetensors", fingerprint(tmp_path / "te.safetensors"), 1.0, "clip")
    base, patched = clip.load(), clip.with_patch(patch).load()
    g_key, l_key = "text_model.encoder.layers.0.self_attn.q_proj.weight", "encoder.layers.1.mlp.fc1.weight"
    torch.testing.assert_close(
        patched["clip_g"].state_dict()[g_key], base["clip_g"].state_dict()[g_key] + g_up @ g_down
    )
    torch.testing.assert_close(
        patched["clip_l"].state_dict()[l_key], base["clip_l"].state_dict()[l_key] + l_up @ l_down
    )
