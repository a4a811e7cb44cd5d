"""Loom's Qwen-Image txt2img against diffusers' QwenImagePipeline on the same tiny components (the demo
files), seed-derived noise and sigmas: ComfyUI's discrete flow schedule (ModelSamplingAuraFlow 3.1,
``simple``) handed to the pipeline's FlowMatchEulerDiscreteScheduler (shift 1, no dynamic shifting,
so it keeps them). At cfg 1 the pipeline runs no CFG and must equal Loom; with a negative prompt
diffusers also rescales to the conditional norm, which ComfyUI does not, so Loom's real CFG is
compared with plain CFG over two separate calls of diffusers' transformer per step (which also shows
that Loom's batching of different-length prompts, padded and masked, changes nothing). The text
encoding equals transformers' Qwen2Model's last hidden state on ComfyUI's template minus the 34
template-head tokens; ComfyUI's rotary positions are checked where diffusers' differ (odd grids)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from nodes.demo.qwen_image import DEMO_QWEN25, DEMO_QWEN_IMAGE, DEMO_QWEN_VAE
from nodes.diffusion.noise import prepare_noise
from nodes.encode.conditioning import CLIPTextEncode
from nodes.families.components.flux_dit import pack, unpack
from nodes.families.components.qwen_text import load_qwen_tokenizer
from nodes.family_nodes.flux_nodes import EmptySD3LatentImage
from nodes.family_nodes.zimage_nodes import ModelSamplingAuraFlow
from nodes.load.handles import open_diffusion_model, open_text_encoders, open_vae
from nodes.sample.ksampler import KSampler

PROMPT, NEGATIVE, SIZE, STEPS, SEED, SHIFT = "a photo of a cat", "blurry", 64, 4, 42, 3.1


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    from nodes.demo.qwen_image import demo_qwen_image_modules, write_qwen_image_files

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("qwen_image")
    modules = demo_qwen_image_modules()
    write_qwen_image_files(root, modules)
    return root, modules


def _loom(root: Path, ctx: Any, cfg: float) -> tuple[Any, Any, Any, Any]:
    model = open_diffusion_model(root / "diffusion_models" / DEMO_QWEN_IMAGE)
    model = ModelSamplingAuraFlow().run(ctx, model=model, shift=SHIFT)[0]
    clip = open_text_encoders([root / "text_encoders" / DEMO_QWEN25], "qwen_image")
    pos = CLIPTextEncode().run(ctx, text=PROMPT, clip=clip)[0]
    neg = CLIPTextEncode().run(ctx, text=NEGATIVE, clip=clip)[0]
    latent = EmptySD3LatentImage().run(ctx, width=SIZE, height=SIZE, batch_size=1)[0]
    out = KSampler().run(
        ctx,
        model=model,
        seed=SEED,
        steps=STEPS,
        cfg=cfg,
        sampler_name="euler",
        scheduler="simple",
        positive=pos,
        negative=neg,
        latent_image=latent,
        denoise=1.0,
    )[0]
    return model, (pos, neg), latent, out


def test_qwen_image_txt2img_matches_qwenimage_pipeline(qwen_dir: Any, make_ctx: Any) -> None:
    from diffusers import FlowMatchEulerDiscreteScheduler, QwenImagePipeline

    from nodes.diffusion.schedulers import ksampler_sigmas
    from nodes.latent.vae import VAEDecode

    torch.set_num_threads(1)
    root, modules = qwen_dir
    ctx = make_ctx()
    model, (pos, _), latent, out = _loom(root, ctx, 1.0)
    sigmas = ksampler_sigmas(model.model_sampling, "simple", "euler", STEPS)
    assert sigmas[0] == 1.0 and sigmas[-1] == 0.0

    pipe: Any = QwenImagePipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(shift=1.0, use_dynamic_shifting=False),
        vae=modules["vae"],
        text_encoder=None,
        tokenizer=load_qwen_tokenizer(),
        transformer=modules["unet"],
    )
    pipe.set_progress_bar_config(disable=True)
    noise = prepare_noise(latent["samples"], SEED)
    embeds = pos[0].embeds
    kwargs = dict(
        prompt_embeds=embeds,
        prompt_embeds_mask=torch.ones(embeds.shape[:2], dtype=torch.long),
        height=SIZE,
        width=SIZE,
        num_inference_steps=STEPS,
        sigmas=sigmas[:-1].tolist(),
        true_cfg_scale=1.0,
        latents=pack(noise)[0],
    )
    ref = pipe(**kwargs, output_type="latent").images
    mine = pack(model.latent_format.process_in(out["samples"]))[0]
    assert (mine - ref).abs().max() < 1e-4
    assert (mine - pack(noise)[0]).abs().max() > 0.1  # the model moved the latent

    image = VAEDecode().run(ctx, samples=out, vae=open_vae(root / "vae" / DEMO_QWEN_VAE))[0]
    ref_image = pipe(**kwargs, output_type="pt").images
    assert image.shape == (1, SIZE, SIZE, 3)
    assert (image - ref_image.permute(0, 2, 3, 1)).abs().max() < 1e-4


def test_real_cfg_is_plain_cfg_of_separate_calls(qwen_dir: Any, make_ctx: Any) -> None:
    from nodes.diffusion.schedulers import ksampler_sigmas

    torch.set_num_threads(1)
    root, modules = qwen_dir
    model, (pos, neg), latent, out = _loom(root, make_ctx(), 2.5)
    assert pos[0].embeds.shape[1] != neg[0].embeds.shape[1]  # the batch is padded and masked
    sigmas = ksampler_sigmas(model.model_sampling, "simple", "euler", STEPS)
    transformer = modules["unet"]
    x = pack(prepare_noise(latent["samples"], SEED))[0]
    shapes = [[(1, SIZE // 16, SIZE // 16)]]
    with torch.no_grad():
        for sigma, following in zip(sigmas[:-1], sigmas[1:], strict=True):
            t = sigma.reshape(1)
            cond, uncond = (
                transformer(
                    hidden_states=x,
                    encoder_hidden_states=e[0].embeds,
                    timestep=t,
                    img_shapes=shapes,
                    return_dict=False,
                )[0]
                for e in (pos, neg)
            )
            x = x + (following - sigma) * (uncond + 2.5 * (cond - uncond))
    mine = pack(model.latent_format.process_in(out["samples"]))[0]
    assert (mine - x).abs().max() < 1e-4


def test_default_sampling_is_discrete_flow_shift_1_15(qwen_dir: Any) -> None:
    from nodes.diffusion.schedulers import ksampler_sigmas

    root, _ = qwen_dir
    model = open_diffusion_model(root / "diffusion_models" / DEMO_QWEN_IMAGE)
    t = torch.tensor([1.0, 0.75, 0.5, 0.25])
    expected = torch.cat([1.15 * t / (1 + 0.15 * t), torch.zeros(1)])
    torch.testing.assert_close(ksampler_sigmas(model.model_sampling, "simple", "euler", 4), expected)
    assert float(model.model_sampling.timestep(torch.tensor(0.25))) == pytest.approx(0.25)  # timestep = sigma


def test_text_encoding_matches_qwen2_on_comfyui_template(qwen_dir: Any, make_ctx: Any) -> None:
    from nodes.families.components.qwen25_text import TEMPLATE

    root, modules = qwen_dir
    clip = open_text_encoders([root / "text_encoders" / DEMO_QWEN25], "qwen_image")
    (entry,) = CLIPTextEncode().run(make_ctx(), text=PROMPT, clip=clip)[0]
    ids = load_qwen_tokenizer()(TEMPLATE.format(PROMPT), return_tensors="pt")
    with torch.no_grad():
        ref = modules["qwen25_7b"](**ids).last_hidden_state
    assert ref.shape[1] == 34 + 5 + 5  # head, "a photo of a cat", <|im_end|>\n<|im_start|>assistant\n
    assert entry.embeds.shape == (1, 10, 32) and entry.pooled is None
    torch.testing.assert_close(entry.embeds, ref[:, 34:], atol=1e-5, rtol=1e-5)


def test_vae_round_trip_and_latent_statistics(qwen_dir: Any, make_ctx: Any) -> None:
    """VAEEncode/VAEDecode go through the 3-D VAE as one frame; the latent space is ComfyUI's Wan21."""
    from nodes.families.latent_format import WAN21_LATENT
    from nodes.latent.vae import VAEDecode, VAEDecodeTiled, VAEEncode

    root, modules = qwen_dir
    ctx = make_ctx()
    vae = open_vae(root / "vae" / DEMO_QWEN_VAE)
    assert vae.family.title == "Qwen-Image"
    image = torch.rand(1, 32, 48, 3)
    latent = VAEEncode().run(ctx, pixels=image, vae=vae)[0]
    assert latent["samples"].shape == (1, 16, 4, 6)
    with torch.no_grad():
        ref = modules["vae"].encode(image.permute(0, 3, 1, 2)[:, :, None] * 2 - 1).latent_dist.mode()[:, :, 0]
    torch.testing.assert_close(latent["samples"], ref, atol=1e-5, rtol=1e-5)
    decoded = VAEDecode().run(ctx, samples=latent, vae=vae)[0]
    assert decoded.shape == (1, 32, 48, 3)
    tiled = VAEDecodeTiled().run(ctx, samples=latent, vae=vae, tile_size=64, overlap=0)[
        0
    ]  # one tile: the same
    torch.testing.assert_close(tiled, decoded)
    raw = torch.randn(1, 16, 2, 2)
    mean, std = (
        torch.tensor(WAN21_LATENT.mean).view(1, 16, 1, 1),
        torch.tensor(WAN21_LATENT.std).view(1, 16, 1, 1),
    )
    torch.testing.assert_close(WAN21_LATENT.process_in(raw), (raw - mean) / std)
    torch.testing.assert_close(WAN21_LATENT.process_out(WAN21_LATENT.process_in(raw)), raw)


def test_rotary_positions_follow_comfyui_on_odd_grids() -> None:
    """ComfyUI centres an h-patch axis on h//2 (rows −h//2 … h − 1 − h//2) and starts the text at
    max(h//2, w//2); diffusers agrees on even grids and is one row off on odd ones (1328 px)."""
    from diffusers.models.transformers.transformer_qwenimage import QwenEmbedRope

    from nodes.families.components.qwen_image_dit import rope_module, segment_positions

    rows = segment_positions((0, 5, 4, 0, 0)).reshape(5, 4, 3)
    assert rows[:, 0, 1].tolist() == [-2, -1, 0, 1, 2] and rows[0, :, 2].tolist() == [-2, -1, 0, 1]
    mine, theirs = rope_module()([4, 14, 14]), QwenEmbedRope(10000, [4, 14, 14], scale_rope=True)
    for h, w, same in ((4, 6, True), (5, 4, False)):
        (img, txt), (img_ref, txt_ref) = (
            mine([(1, h, w)], max_txt_seq_len=3),
            theirs([(1, h, w)], max_txt_seq_len=3),
        )
        torch.testing.assert_close(txt, txt_ref)
        assert torch.allclose(img, img_ref, atol=1e-6) == same
    unpacked = unpack(pack(torch.arange(64.0).reshape(1, 4, 4, 4))[0], 4, 4)
    assert unpacked.reshape(-1).tolist() == list(range(64))
