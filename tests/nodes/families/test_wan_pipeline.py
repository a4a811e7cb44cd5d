"""Loom's Wan 2.1 text-to-video against diffusers' ``WanPipeline`` on the same tiny transformer (written in
the original Wan layout, read back by UNETLoader's path), the same prompt embeddings (a context tensor
padded with zeros to 512 tokens, as ComfyUI's umt5 encoder gives it), seed-derived noise and ComfyUI's
discrete flow schedule (shift 8, ``simple``) handed to the pipeline's FlowMatchEulerDiscreteScheduler
(shift 1, so it keeps them); Euler. The latents are 5-D [B, 16, frames, H/8, W/8] from
EmptyHunyuanLatentVideo. WanPipeline's CFG is plain CFG, as ComfyUI's, so real CFG is compared too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from nodes.core.cond import CondEntry
from nodes.diffusion.noise import prepare_noise
from nodes.family_nodes.video_nodes import EmptyHunyuanLatentVideo
from nodes.load.handles import open_diffusion_model
from nodes.sample.ksampler import KSampler

WIDTH, HEIGHT, LENGTH, STEPS, SEED, TEXT = 48, 32, 9, 4, 7, 32


def tiny_wan() -> Any:
    from diffusers import WanTransformer3DModel

    torch.manual_seed(0)
    model = WanTransformer3DModel(
        num_attention_heads=2, attention_head_dim=128, in_channels=16, out_channels=16, text_dim=TEXT,
        freq_dim=256, ffn_dim=256, num_layers=2, cross_attn_norm=True,
    )  # fmt: skip
    with torch.no_grad():  # diffusers zero-initialises nothing here, but make the output move clearly
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    return model.eval()


def context(seed: int, tokens: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    out = torch.zeros(1, 512, TEXT)
    out[:, :tokens] = torch.randn(1, tokens, TEXT, generator=generator)
    return out


@pytest.fixture(scope="module")
def wan_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    from safetensors.torch import save_file

    from nodes.families.components.wan_dit import WanTransformer

    torch.set_num_threads(1)
    model = tiny_wan()
    sd = WanTransformer().to_original(model.state_dict(), model.config)
    path = tmp_path_factory.mktemp("wan") / "wan2.1_t2v_tiny.safetensors"
    save_file({f"model.diffusion_model.{k}": v.contiguous() for k, v in sd.items()}, str(path))
    return path, model


def _pipeline(model: Any, sigmas: torch.Tensor) -> Any:
    from diffusers import FlowMatchEulerDiscreteScheduler, WanPipeline

    scheduler = FlowMatchEulerDiscreteScheduler(shift=1.0, use_dynamic_shifting=False)

    def set_timesteps(num_inference_steps: int, device: Any = None, **_: Any) -> None:
        FlowMatchEulerDiscreteScheduler.set_timesteps(scheduler, sigmas=sigmas[:-1].tolist(), device=device)

    scheduler.set_timesteps = set_timesteps  # type: ignore[method-assign]
    pipe: Any = WanPipeline(
        tokenizer=None, text_encoder=None, vae=None, scheduler=scheduler, transformer=model
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.mark.parametrize("cfg", [1.0, 3.5])
def test_wan_t2v_matches_wan_pipeline(wan_file: Any, make_ctx: Any, cfg: float) -> None:
    from nodes.diffusion.schedulers import ksampler_sigmas

    torch.set_num_threads(1)
    path, module = wan_file
    ctx = make_ctx()
    model = open_diffusion_model(path)
    assert model.family.title == "Wan 2.1"
    latent = EmptyHunyuanLatentVideo().run(ctx, width=WIDTH, height=HEIGHT, length=LENGTH, batch_size=1)[0]
    assert latent["samples"].shape == (1, 16, 3, HEIGHT // 8, WIDTH // 8)
    pos, neg = context(1, 7), context(2, 3)
    out = KSampler().run(
        ctx,
        model=model,
        seed=SEED,
        steps=STEPS,
        cfg=cfg,
        sampler_name="euler",
        scheduler="simple",
        positive=[CondEntry(pos)],
        negative=[CondEntry(neg)],
        latent_image=latent,
        denoise=1.0,
    )[0]
    sigmas = ksampler_sigmas(model.model_sampling, "simple", "euler", STEPS)
    shifted = 8.0 * torch.tensor(0.75) / (1 + 7.0 * torch.tensor(0.75))
    assert (
        sigmas[0] == 1.0 and sigmas[-1] == 0.0 and float(sigmas[1]) == pytest.approx(float(shifted), abs=1e-3)
    )
    noise = prepare_noise(latent["samples"], SEED)
    assert noise.shape == latent["samples"].shape
    ref = _pipeline(module, sigmas)(
        prompt_embeds=pos,
        negative_prompt_embeds=neg,
        height=HEIGHT,
        width=WIDTH,
        num_frames=LENGTH,
        num_inference_steps=STEPS,
        guidance_scale=cfg,
        latents=noise,
        output_type="latent",
    ).frames
    mine = model.latent_format.process_in(out["samples"])
    assert mine.shape == ref.shape == (1, 16, 3, HEIGHT // 8, WIDTH // 8)
    assert (mine - ref).abs().max() < 1e-3
    assert (mine - noise).abs().max() > 0.1  # the model moved the latent


def test_short_context_is_padded_to_512_and_odd_sizes_are_padded(wan_file: Any) -> None:
    """The kind pads a shorter context with zeros to 512 tokens (ComfyUI's encoder length), and an odd
    latent height / width circularly to the patch size, cropping the output back."""
    from nodes.families.components.wan_dit import WanTransformer

    path, module = wan_file
    kind = WanTransformer()
    x = torch.randn(1, 16, 2, 4, 6)
    t = torch.tensor([500.0])
    full = context(3, 5)
    with torch.no_grad():
        short = kind.forward(module, x, t, kind.conditioning([CondEntry(full[:, :5])], 1, (32, 48)))
        padded = kind.forward(module, x, t, kind.conditioning([CondEntry(full)], 1, (32, 48)))
        torch.testing.assert_close(short, padded)
        odd = torch.randn(1, 16, 2, 5, 7)
        out = kind.forward(module, odd, t, kind.conditioning([CondEntry(full)], 1, (40, 56)))
    assert out.shape == odd.shape


def test_image_latents_and_other_text_widths_are_refused_with_a_lesson(wan_file: Any, make_ctx: Any) -> None:
    from nodes.core.sampling_hooks import ConditioningError
    from nodes.families.components.wan_dit import WanTransformer

    path, module = wan_file
    kind = WanTransformer()
    with pytest.raises(ConditioningError, match="EmptyHunyuanLatentVideo"):
        kind.forward(module, torch.randn(1, 16, 4, 4), torch.tensor([1.0]), {"texts": [context(1, 3)[0]]})
    with pytest.raises(ConditioningError, match="umt5-xxl.*type wan"):
        kind.check_conditioning(module, [CondEntry(torch.zeros(1, 512, 64))], "positive")


def test_every_sampler_runs_on_video_latents(wan_file: Any, make_ctx: Any) -> None:
    """5-D latents go through every sampler of KSampler (noise, ancestral and SDE noise, multistep
    history) and through SamplerCustom; each keeps the video shape and gives finite values."""
    from nodes.diffusion.names import SAMPLER_NAMES
    from nodes.sample.custom_sampling import SamplerCustom
    from nodes.sample.sampler_nodes import KSamplerSelect
    from nodes.sample.sigma_nodes import BasicScheduler

    torch.set_num_threads(1)
    path, _ = wan_file
    ctx = make_ctx()
    model = open_diffusion_model(path)
    latent = EmptyHunyuanLatentVideo().run(ctx, width=32, height=16, length=5, batch_size=2)[0]
    pos, neg = [CondEntry(context(1, 4))], [CondEntry(context(2, 2))]
    failed = {}
    for name in SAMPLER_NAMES:
        try:
            out = KSampler().run(
                ctx, model=model, seed=SEED, steps=2, cfg=1.0, sampler_name=name, scheduler="simple",
                positive=pos, negative=neg, latent_image=latent, denoise=1.0,
            )[0]["samples"]  # fmt: skip
            if out.shape != latent["samples"].shape or not bool(torch.isfinite(out).all()):
                failed[name] = f"shape {tuple(out.shape)}, finite {bool(torch.isfinite(out).all())}"
        except Exception as exc:  # noqa: BLE001 - collect every sampler's failure
            failed[name] = f"{type(exc).__name__}: {exc}"
    assert not failed, failed
    sampler = KSamplerSelect().run(ctx, sampler_name="euler_ancestral")[0]
    sigmas = BasicScheduler().run(ctx, model=model, scheduler="simple", steps=2, denoise=1.0)[0]
    out, denoised = SamplerCustom().run(
        ctx, model=model, add_noise=True, noise_seed=SEED, cfg=2.0, positive=pos, negative=neg,
        sampler=sampler, sigmas=sigmas, latent_image=latent,
    )  # fmt: skip
    assert out["samples"].shape == denoised["samples"].shape == latent["samples"].shape
