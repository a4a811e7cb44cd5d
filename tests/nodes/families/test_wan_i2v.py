"""Loom's Wan 2.1 image-to-video against diffusers' ``WanImageToVideoPipeline`` on the same tiny
components: an I2V transformer (36 input channels, an image embedder, image keys/values; written in the
original Wan layout and read back by UNETLoader's path), the tiny Wan VAE, the same CLIP vision tokens
(Loom: ``clip_vision_output.penultimate_hidden_states``; diffusers: ``encode_image``'s output), the
same start image (Loom: the VAE's raw latents of [image, grey frames] as ``concat_latent_image`` and
WanImageToVideo's 1-channel ``concat_mask``; diffusers: its own encoding and 4-channel mask), the text
contexts padded to 512, seed-derived noise and ComfyUI's flow schedule (shift 8, ``simple``); Euler."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from nodes.core.cond import CondEntry
from nodes.diffusion.noise import prepare_noise
from nodes.encode.clip_vision import ClipVisionOutput
from nodes.family_nodes.video_nodes import EmptyHunyuanLatentVideo
from nodes.load.handles import open_diffusion_model
from nodes.sample.ksampler import KSampler

WIDTH, HEIGHT, LENGTH, STEPS, SEED, TEXT, CLIP = 48, 32, 9, 4, 7, 32, 32


def context(seed: int, tokens: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    out = torch.zeros(1, 512, TEXT)
    out[:, :tokens] = torch.randn(1, tokens, TEXT, generator=generator)
    return out


@pytest.fixture(scope="module")
def i2v(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any, Any]:
    from safetensors.torch import save_file

    from nodes.demo.wan import demo_wan_i2v_transformer, demo_wan_vae
    from nodes.families.components.wan_dit import WanTransformer

    torch.set_num_threads(1)
    model = demo_wan_i2v_transformer(0, text_width=TEXT, image_width=CLIP)
    sd = WanTransformer().to_original(model.state_dict(), model.config)
    path = tmp_path_factory.mktemp("wan_i2v") / "wan2.1_i2v_480p_tiny.safetensors"
    save_file({f"model.diffusion_model.{k}": v.contiguous() for k, v in sd.items()}, str(path))
    return path, model, demo_wan_vae(0)


def start_image() -> Image.Image:
    rng = np.random.default_rng(3)
    return Image.fromarray(rng.integers(0, 256, (HEIGHT, WIDTH, 3), dtype=np.uint8))


def raw_start_latent(vae: Any, image: Image.Image) -> torch.Tensor:
    """The VAE's latents (its distribution's mode) of the start image followed by grey frames."""
    pixels = torch.from_numpy(np.array(image)).float().div(255.0).movedim(-1, 0)[None, :, None] * 2 - 1
    video = torch.cat([pixels, torch.zeros(1, 3, LENGTH - 1, HEIGHT, WIDTH)], dim=2)
    with torch.no_grad():
        return vae.encode(video).latent_dist.mode()


def _pipeline(model: Any, vae: Any, sigmas: torch.Tensor, embeds: torch.Tensor) -> Any:
    from diffusers import FlowMatchEulerDiscreteScheduler, WanImageToVideoPipeline

    scheduler = FlowMatchEulerDiscreteScheduler(shift=1.0, use_dynamic_shifting=False)

    def set_timesteps(num_inference_steps: int, device: Any = None, **_: Any) -> None:
        FlowMatchEulerDiscreteScheduler.set_timesteps(scheduler, sigmas=sigmas[:-1].tolist(), device=device)

    scheduler.set_timesteps = set_timesteps  # type: ignore[method-assign]
    pipe: Any = WanImageToVideoPipeline(
        tokenizer=None, text_encoder=None, vae=vae, scheduler=scheduler, transformer=model
    )
    pipe.encode_image = lambda image, device: (
        embeds
    )  # the CLIP vision tokens, as Loom's conditioning has them
    pipe.set_progress_bar_config(disable=True)
    return pipe


def i2v_entries(latent: torch.Tensor, tokens: torch.Tensor) -> tuple[CondEntry, CondEntry]:
    """Positive and negative entries with WanImageToVideo's keys (start image on latent frame 0)."""
    t = latent.shape[2]
    mask = torch.ones(1, 1, t, latent.shape[-2], latent.shape[-1])
    mask[:, :, :1] = 0.0
    vision = ClipVisionOutput(torch.zeros(1, CLIP), tokens, tokens)
    extras = {"concat_latent_image": latent, "concat_mask": mask, "clip_vision_output": vision}
    return CondEntry(context(1, 7), extras=dict(extras)), CondEntry(context(2, 3), extras=dict(extras))


@pytest.mark.parametrize("cfg", [1.0, 3.5])
def test_wan_i2v_matches_wan_image_to_video_pipeline(i2v: Any, make_ctx: Any, cfg: float) -> None:
    from nodes.diffusion.schedulers import ksampler_sigmas

    torch.set_num_threads(1)
    path, module, vae = i2v
    ctx = make_ctx()
    model = open_diffusion_model(path)
    assert model.family.title == "Wan 2.1"
    latent = EmptyHunyuanLatentVideo().run(ctx, width=WIDTH, height=HEIGHT, length=LENGTH, batch_size=1)[0]
    image = start_image()
    tokens = torch.randn(1, 50, CLIP, generator=torch.Generator().manual_seed(5))
    pos, neg = i2v_entries(raw_start_latent(vae, image), tokens)
    out = KSampler().run(
        ctx, model=model, seed=SEED, steps=STEPS, cfg=cfg, sampler_name="euler", scheduler="simple",
        positive=[pos], negative=[neg], latent_image=latent, denoise=1.0,
    )[0]  # fmt: skip
    sigmas = ksampler_sigmas(model.model_sampling, "simple", "euler", STEPS)
    noise = prepare_noise(latent["samples"], SEED)
    ref = _pipeline(module, vae, sigmas, tokens)(
        image=image, prompt_embeds=pos.embeds, negative_prompt_embeds=neg.embeds, height=HEIGHT,
        width=WIDTH, num_frames=LENGTH, num_inference_steps=STEPS, guidance_scale=cfg, latents=noise,
        output_type="latent",
    ).frames  # fmt: skip
    mine = model.latent_format.process_in(out["samples"])
    assert mine.shape == ref.shape == (1, 16, 3, HEIGHT // 8, WIDTH // 8)
    assert (mine - ref).abs().max() < 1e-3
    assert (mine - noise).abs().max() > 0.1  # the model moved the latent


def test_the_condition_follows_comfyui(i2v: Any) -> None:
    """The extra channels: inverted mask repeated to 4 channels first, then the normalised start
    latent; no image at all: 20 zero channels; an image without a mask: a zero mask; a 4-channel mask
    is taken as it is (inverted)."""
    from nodes.families.components.wan_i2v import ConcatInput, build_concat
    from nodes.families.latent_format import WAN21_VIDEO_LATENT as FMT

    latent = torch.randn(1, 16, 3, 4, 6)
    mask = torch.ones(1, 1, 3, 4, 6)
    mask[:, :, 0] = 0
    out = build_concat(ConcatInput(latent, mask, 0, 2), 20, (3, 4, 6), FMT)
    assert out.shape == (2, 20, 3, 4, 6)
    assert bool((out[:, :4, 0] == 1).all()) and bool((out[:, :4, 1:] == 0).all())
    torch.testing.assert_close(out[:, 4:], FMT.process_in(latent).expand(2, -1, -1, -1, -1))
    assert bool((build_concat(ConcatInput(None, mask, 0, 1), 20, (3, 4, 6), FMT) == 0).all())
    no_mask = build_concat(ConcatInput(latent, None, 0, 1), 20, (3, 4, 6), FMT)
    assert bool((no_mask[:, :4] == 0).all())
    four = torch.rand(1, 4, 3, 4, 6)
    torch.testing.assert_close(
        build_concat(ConcatInput(latent, four, 0, 1), 20, (3, 4, 6), FMT)[:, :4], 1 - four
    )


def test_rows_without_clip_vision_read_image_keys_from_the_text(i2v: Any) -> None:
    """ComfyUI's WanI2VCrossAttention with no CLIP tokens takes the image keys/values from the whole
    context; rows with and without CLIP tokens in one batch each get their own call."""
    from nodes.families.components.wan_dit import WanTransformer

    _, module, _ = i2v
    kind = WanTransformer()
    x = torch.randn(1, 16, 2, 4, 6)
    t = torch.tensor([500.0])
    tokens = torch.randn(1, 50, CLIP)
    latent = torch.randn(1, 16, 2, 4, 6)
    with_clip, _ = i2v_entries(latent, tokens)
    bare = CondEntry(
        with_clip.embeds, extras={k: v for k, v in with_clip.extras.items() if k != "clip_vision_output"}
    )
    with torch.no_grad():
        both = kind.forward(module, torch.cat([x, x]), t, kind.conditioning([with_clip, bare], 1, (32, 48)))
        alone = kind.forward(module, x, t, kind.conditioning([bare], 1, (32, 48)))
        clip = kind.forward(module, x, t, kind.conditioning([with_clip], 1, (32, 48)))
    torch.testing.assert_close(both[1:], alone)
    torch.testing.assert_close(both[:1], clip)
    assert (clip - alone).abs().max() > 1e-3
    assert bool(torch.isfinite(alone).all())


def test_other_clip_vision_widths_are_refused_with_a_lesson(i2v: Any) -> None:
    from nodes.core.sampling_hooks import ConditioningError
    from nodes.families.components.wan_dit import WanTransformer

    _, module, _ = i2v
    pos, _ = i2v_entries(torch.randn(1, 16, 3, 4, 6), torch.randn(1, 50, 64))
    with pytest.raises(ConditioningError, match="64-wide CLIP vision tokens.*clip_vision_h"):
        WanTransformer().check_conditioning(module, [pos], "positive")


def test_a_noise_mask_stands_in_for_the_concat_mask_as_comfyui_reshapes_it() -> None:
    """Without ``concat_mask`` the sampler's denoise mask is used: an image mask [1, H, W] (pixels) is
    stretched over the latent's frames and size (ComfyUI's ``reshape_mask``), then inverted."""
    from nodes.families.components.wan_i2v import build_concat, concat_input
    from nodes.families.latent_format import WAN21_VIDEO_LATENT as FMT

    noise_mask = torch.zeros(1, 32, 48)
    noise_mask[:, :, 24:] = 1.0  # repaint the right half
    extras = {"concat_latent_image": torch.randn(1, 16, 3, 4, 6), "denoise_mask": noise_mask}
    out = build_concat(concat_input(extras, 1), 20, (3, 4, 6), FMT)
    assert bool((out[:, :4, :, :, :3] == 1).all()) and bool((out[:, :4, :, :, 3:] == 0).all())
    given = {**extras, "concat_mask": torch.ones(1, 1, 3, 4, 6)}
    assert bool((build_concat(concat_input(given, 1), 20, (3, 4, 6), FMT)[:, :4] == 0).all())
