"""unCLIP: the noise augmentation of CLIP vision image embeds (ComfyUI's schedule and formula,
checked against diffusers' own squaredcos_cap_v2 schedule and timestep embedding), an SD2.1 unCLIP
checkpoint read with its image tower, the class labels its UNet gets (several unCLIP conditionings
summed, zeros for a prompt without), SDXL "revision" (the pooled input replaced), and the errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from nodes.core.cond import CondEntry
from nodes.core.tensors import ModelLoadError
from nodes.demo.models import DEMO_CHECKPOINT, demo_modules
from nodes.demo.unclip import DEMO_UNCLIP
from nodes.encode.clip_vision import CLIPVisionEncode, ClipVisionOutput
from nodes.encode.conditioning import CLIPTextEncode
from nodes.encode.unclip import open_unclip_checkpoint, unCLIPConditioning
from nodes.families.catalog import SD2Unclip
from nodes.families.components import unclip_adm as unclip
from nodes.families.components.unclip_adm import UnclipInput
from nodes.load.handles import open_checkpoint
from nodes.sample.ksampler import KSampler, SamplingError
from tests.conftest import linked_copy
from tests.nodes.conftest import TinyModel, write_single_file


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory, unclip_demo_source: Path) -> Path:
    torch.set_num_threads(1)
    folder = linked_copy(
        unclip_demo_source, tmp_path_factory.mktemp("unclip_models")
    )  # make_unclip_demo_models' files
    write_single_file(TinyModel("sd15", demo_modules()), folder / "checkpoints" / DEMO_CHECKPOINT)
    return folder


@pytest.fixture(scope="module")
def handles(demo_dir: Path) -> tuple[Any, ...]:
    return open_unclip_checkpoint(demo_dir / "checkpoints" / DEMO_UNCLIP)


@pytest.fixture()
def ctx(make_ctx: Any) -> Any:
    torch.set_num_threads(1)
    return make_ctx()


def _embeds(n: int = 1, width: int = 32, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, width, generator=torch.Generator().manual_seed(seed))


# --- the augmentation ---------------------------------------------------------------------------
def test_the_schedule_is_squaredcos_cap_v2_as_diffusers_builds_it() -> None:
    from diffusers.schedulers.scheduling_ddpm import betas_for_alpha_bar

    betas = betas_for_alpha_bar(1000, alpha_transform_type="cosine").double()
    expected = torch.cumprod(1 - betas, 0)
    assert torch.allclose(torch.tensor(unclip.alphas_cumprod(), dtype=torch.float64), expected, atol=1e-6)


def test_the_level_embedding_is_the_cos_first_timestep_embedding() -> None:
    from diffusers.models.embeddings import get_timestep_embedding

    expected = get_timestep_embedding(torch.tensor([250.0]), 32, flip_sin_to_cos=True, downscale_freq_shift=0)
    assert torch.allclose(unclip.level_embedding(250, 32), expected, atol=1e-6)


def test_one_image_is_noised_at_round_999_times_the_augmentation_with_seed_minus_10() -> None:
    x = _embeds()
    adm = unclip.unclip_adm([UnclipInput(x, 2.0, 0.3)], seed=42, merge_level=0.05)
    level = round(999 * 0.3)
    ac = torch.tensor(unclip.alphas_cumprod(), dtype=torch.float64)[level]
    keep, add = ac.sqrt().float(), (1 - ac).sqrt().float()  # ComfyUI's float32 buffers of float64 roots
    noise = torch.randn(1, 32, generator=torch.Generator().manual_seed(32))
    expected = torch.cat([keep * x + add * noise, unclip.level_embedding(level, 32)], 1) * 2.0
    assert adm.shape == (1, 64)
    assert torch.equal(adm, expected)


def test_the_augmentation_equals_diffusers_stable_unclip_noising() -> None:
    """diffusers' StableUnCLIPImg2ImgPipeline noises image embeds the same way (normaliser at mean 0,
    std 1, as ComfyUI runs it), given the same noise."""
    from types import SimpleNamespace

    from diffusers import DDPMScheduler, StableUnCLIPImg2ImgPipeline
    from diffusers.pipelines.stable_diffusion.stable_unclip_image_normalizer import (
        StableUnCLIPImageNormalizer,
    )

    x = _embeds()
    pipe = SimpleNamespace(
        image_normalizer=StableUnCLIPImageNormalizer(embedding_dim=32),
        image_noising_scheduler=DDPMScheduler(num_train_timesteps=1000, beta_schedule="squaredcos_cap_v2"),
    )
    noise = torch.randn(1, 32, generator=torch.Generator().manual_seed(100 - unclip.SEED_OFFSET))
    for augmentation in (0.0, 0.25, 0.9):
        level = round(999 * augmentation)
        theirs = StableUnCLIPImg2ImgPipeline.noise_image_embeddings(pipe, x, level, noise=noise)  # type: ignore[arg-type]
        ours = unclip.unclip_adm([UnclipInput(x, 1.0, augmentation)], seed=100, merge_level=0.05)
        assert torch.allclose(ours, theirs.detach(), atol=1e-5), augmentation


def test_no_augmentation_keeps_the_embeds_almost_exactly() -> None:
    x = _embeds()
    adm = unclip.unclip_adm([UnclipInput(x, 1.0, 0.0)], seed=0, merge_level=0.05)
    assert torch.allclose(adm[:, :32], x, atol=0.02)  # level 0: sqrt(1 - beta_0) ~ 0.99998
    assert torch.equal(adm[:, 32:], unclip.level_embedding(0, 32))


def test_several_images_are_summed_then_noised_again_at_the_merge_level() -> None:
    a, b = _embeds(seed=1), _embeds(2, seed=2)
    items = [UnclipInput(a, 1.0, 0.1), UnclipInput(b, 0.5, 0.2)]
    adm = unclip.unclip_adm(items, seed=7, merge_level=0.05)
    singles = [
        unclip.unclip_adm([UnclipInput(x[None], s, n)], 7, 0.0)
        for x, s, n in ((a[0], 1.0, 0.1), (b[0], 0.5, 0.2), (b[1], 0.5, 0.2))
    ]
    summed = torch.stack(singles).sum(0)[:, :32]
    noisy, emb = unclip.augment(summed, round(999 * 0.05), 7 - unclip.SEED_OFFSET)
    assert torch.allclose(adm, torch.cat([noisy, emb], 1), atol=1e-6)


# --- nodes ----------------------------------------------------------------------------------------
def test_unclip_conditioning_appends_and_strength_zero_is_no_change(ctx: Any) -> None:
    base = [CondEntry(torch.zeros(1, 77, 32))]
    out = ClipVisionOutput(_embeds(), torch.zeros(1, 2, 32), torch.zeros(1, 2, 32))
    assert (
        unCLIPConditioning().run(
            ctx, conditioning=base, clip_vision_output=out, strength=0.0, noise_augmentation=0.0
        )[0]
        is base
    )
    (once,) = unCLIPConditioning().run(
        ctx, conditioning=base, clip_vision_output=out, strength=1.0, noise_augmentation=0.1
    )
    (twice,) = unCLIPConditioning().run(
        ctx, conditioning=once, clip_vision_output=out, strength=0.5, noise_augmentation=0.2
    )
    assert [i.strength for i in twice[0].extras["unclip_conditioning"]] == [1.0, 0.5]
    assert "unclip_conditioning" not in base[0].extras


def test_the_unclip_checkpoint_gives_model_clip_vae_and_its_image_tower(
    ctx: Any, handles: tuple[Any, ...]
) -> None:
    unet, clip, vae, vision = handles
    assert isinstance(unet.family, SD2Unclip)
    assert vision.prefix == "embedder.model.visual." and vision.embed_dim == 32
    with ctx.models.use(unet) as module:
        assert module.config.class_embed_type == "projection"
        assert module.config.projection_class_embeddings_input_dim == 64
    image = torch.rand(1, 64, 64, 3, generator=torch.Generator().manual_seed(0))
    (out,) = CLIPVisionEncode().run(ctx, clip_vision=vision, image=image, crop="center")
    assert out.image_embeds.shape == (1, 32)


def test_the_unet_gets_the_augmented_embeds_as_class_labels_and_zeros_without(
    handles: tuple[Any, ...],
) -> None:
    unet = handles[0]
    x = _embeds()
    with_image = CondEntry(
        torch.zeros(1, 77, 32), extras={"unclip_conditioning": (UnclipInput(x, 1.0, 0.2),), "seed": 11}
    )
    plain = CondEntry(torch.zeros(1, 77, 32))
    kwargs = unet.denoiser.conditioning([plain, with_image], 2, (64, 64))
    expected = unclip.unclip_adm([UnclipInput(x, 1.0, 0.2)], 11, 0.05)
    assert kwargs["class_labels"].shape == (4, 64)
    assert torch.equal(kwargs["class_labels"][:2], torch.zeros(2, 64))
    assert torch.equal(kwargs["class_labels"][2:], expected.expand(2, -1))


def test_sampling_an_unclip_model_follows_the_image(ctx: Any, handles: tuple[Any, ...]) -> None:
    unet, clip, _vae, vision = handles
    pos = CLIPTextEncode().run(ctx, text="a cat", clip=clip)[0]
    neg = CLIPTextEncode().run(ctx, text="", clip=clip)[0]
    latent = {"samples": torch.zeros(1, 4, 8, 8)}
    outs = []
    for seed in (0, 1):
        image = torch.rand(1, 64, 64, 3, generator=torch.Generator().manual_seed(seed))
        (vis,) = CLIPVisionEncode().run(ctx, clip_vision=vision, image=image, crop="center")
        (cond,) = unCLIPConditioning().run(
            ctx, conditioning=pos, clip_vision_output=vis, strength=1.0, noise_augmentation=0.0
        )
        outs.append(
            KSampler().run(
                ctx,
                model=unet,
                seed=3,
                steps=2,
                cfg=4.0,
                sampler_name="euler",
                scheduler="normal",
                positive=cond,
                negative=neg,
                latent_image=latent,
                denoise=1.0,
            )[0]["samples"]
        )
    assert torch.isfinite(outs[0]).all()
    assert (outs[0] - outs[1]).abs().max() > 1e-3  # another image, another result


def test_a_model_without_image_inputs_refuses_unclip_conditioning(ctx: Any, demo_dir: Path) -> None:
    ck = open_checkpoint(demo_dir / "checkpoints" / DEMO_CHECKPOINT)
    pos = CLIPTextEncode().run(ctx, text="a cat", clip=ck.clip)[0]
    out = ClipVisionOutput(_embeds(), torch.zeros(1, 2, 32), torch.zeros(1, 2, 32))
    (cond,) = unCLIPConditioning().run(
        ctx, conditioning=pos, clip_vision_output=out, strength=1.0, noise_augmentation=0.0
    )
    with pytest.raises(SamplingError, match="unCLIPCheckpointLoader"):
        KSampler().run(
            ctx,
            model=ck.unet,
            seed=0,
            steps=1,
            cfg=1.0,
            sampler_name="euler",
            scheduler="normal",
            positive=cond,
            negative=pos,
            latent_image={"samples": torch.zeros(1, 4, 8, 8)},
            denoise=1.0,
        )


def test_embeds_of_another_width_are_refused(ctx: Any, handles: tuple[Any, ...]) -> None:
    unet, clip = handles[0], handles[1]
    pos = CLIPTextEncode().run(ctx, text="a cat", clip=clip)[0]
    out = ClipVisionOutput(_embeds(width=16), torch.zeros(1, 2, 16), torch.zeros(1, 2, 16))
    (cond,) = unCLIPConditioning().run(
        ctx, conditioning=pos, clip_vision_output=out, strength=1.0, noise_augmentation=0.0
    )
    with pytest.raises(SamplingError, match="16 wide but this model takes 32"):
        KSampler().run(
            ctx,
            model=unet,
            seed=0,
            steps=1,
            cfg=1.0,
            sampler_name="euler",
            scheduler="normal",
            positive=cond,
            negative=pos,
            latent_image={"samples": torch.zeros(1, 4, 8, 8)},
            denoise=1.0,
        )


def test_the_unclip_loader_refuses_a_checkpoint_without_an_image_tower(demo_dir: Path) -> None:
    with pytest.raises(ModelLoadError, match="not an unCLIP checkpoint"):
        open_unclip_checkpoint(demo_dir / "checkpoints" / DEMO_CHECKPOINT)


# --- SDXL revision --------------------------------------------------------------------------------
def test_sdxl_takes_the_noisy_image_embeds_as_its_pooled_input(tiny_sdxl_ckpt: Path) -> None:
    unet = open_checkpoint(tiny_sdxl_ckpt).unet
    x = _embeds()
    text_pooled = torch.ones(1, 32)
    revision = CondEntry(
        torch.zeros(1, 77, 64),
        text_pooled,
        extras={"unclip_conditioning": (UnclipInput(x, 1.0, 0.1),), "seed": 5},
    )
    plain = CondEntry(torch.zeros(1, 77, 64), text_pooled)
    kwargs = unet.denoiser.conditioning([plain, revision], 1, (64, 64))
    pooled = kwargs["added_cond_kwargs"]["text_embeds"]
    assert torch.equal(pooled[0], text_pooled[0])
    assert torch.equal(pooled[1:], unclip.unclip_adm([UnclipInput(x, 1.0, 0.1)], 5, 0.0)[:, :32])


def test_stacked_jobs_each_augment_with_their_own_seed(ctx: Any, handles: tuple[Any, ...]) -> None:
    from nodes.sample.guiders import GuidedRun, Guider

    unet = handles[0]
    entry = CondEntry(
        torch.zeros(1, 77, 32), extras={"unclip_conditioning": (UnclipInput(_embeds(), 1.0, 0.5),)}
    )
    guider = Guider(unet, (("positive", (entry,)), ("negative", (entry,))), cfg=2.0)
    with ctx.models.use(unet) as module:
        run = GuidedRun([guider, guider], module, 1, (8, 8), model_inputs={"seeds": (11, 12)})
    seen = [job.branches["positive"][0].entry.extras["seed"] for job in run.jobs]
    assert seen == [11, 12]
    labels = [
        unet.denoiser.conditioning([job.branches["positive"][0].entry], 1, (64, 64))["class_labels"]
        for job in run.jobs
    ]
    assert not torch.equal(labels[0], labels[1])


def test_an_sdxl_revision_workflow_samples_with_the_image(ctx: Any, tiny_sdxl_ckpt: Path) -> None:
    from nodes.demo.vision import tiny_clip_vision

    ck = open_checkpoint(tiny_sdxl_ckpt)
    pos = CLIPTextEncode().run(ctx, text="a cat", clip=ck.clip)[0]
    vision = tiny_clip_vision(3, projection=32)
    image = torch.rand(1, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = vision(pixel_values=image, output_hidden_states=True)
    vis = ClipVisionOutput(out.image_embeds, out.last_hidden_state, out.hidden_states[-2])
    (revision,) = unCLIPConditioning().run(
        ctx, conditioning=pos, clip_vision_output=vis, strength=1.0, noise_augmentation=0.0
    )
    latent = {"samples": torch.zeros(1, 4, 8, 8)}
    results = [
        KSampler().run(
            ctx,
            model=ck.unet,
            seed=4,
            steps=2,
            cfg=3.0,
            sampler_name="euler",
            scheduler="normal",
            positive=cond,
            negative=pos,
            latent_image=latent,
            denoise=1.0,
        )[0]["samples"]
        for cond in (pos, revision)
    ]
    assert torch.isfinite(results[1]).all()
    assert (results[0] - results[1]).abs().max() > 1e-4  # the image replaced the pooled text
