"""9-channel inpainting UNets: read from their tensors, sampled with InpaintModelConditioning and
VAEEncodeForInpaint; the extra channels (mask, masked image) come from the UNet denoiser's
conditioning, and a 4-channel UNet ignores them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from nodes.core.sampling_hooks import ConditioningError
from nodes.encode.conditioning import CLIPTextEncode
from nodes.encode.conditioning_edit import InpaintModelConditioning
from nodes.families.catalog import SD15
from nodes.families.components.unet import BLANK_INPAINT_LATENT
from nodes.latent.vae import VAEEncode, VAEEncodeForInpaint, encode
from nodes.load.handles import open_checkpoint
from nodes.sample.ksampler import KSampler
from tests.nodes.conftest import TinyModel, _unet, tiny_clip, tiny_vae, write_single_file

SIZE = 64


@pytest.fixture(scope="module")
def inpaint_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(1)
    mods = {"unet": _unet(attention_head_dim=8, in_channels=9), "clip_l": tiny_clip(), "vae": tiny_vae()}
    return write_single_file(
        TinyModel("sd15", mods), tmp_path_factory.mktemp("inpaint") / "tiny_inpaint.safetensors"
    )


@pytest.fixture(scope="module")
def ck(inpaint_ckpt: Path) -> Any:
    return open_checkpoint(inpaint_ckpt)


@pytest.fixture()
def ctx(make_ctx: Any) -> Any:
    torch.set_num_threads(1)
    return make_ctx()


def _image() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.rand(1, SIZE, SIZE, 3, generator=g)


def _mask() -> torch.Tensor:
    m = torch.zeros(1, SIZE, SIZE)
    m[:, 16:48, 16:48] = 1.0
    return m


def _sample(ctx: Any, model: Any, pos: list, neg: list, latent: dict, steps: int = 2) -> torch.Tensor:
    return KSampler().run(
        ctx,
        model=model,
        seed=5,
        steps=steps,
        cfg=3.0,
        sampler_name="euler",
        scheduler="normal",
        positive=pos,
        negative=neg,
        latent_image=latent,
        denoise=1.0,
    )[0]["samples"]


def _prompts(ctx: Any, clip: Any) -> tuple[list, list]:
    return (
        CLIPTextEncode().run(ctx, text="a cat", clip=clip)[0],
        CLIPTextEncode().run(ctx, text="", clip=clip)[0],
    )


def test_a_nine_channel_unet_is_read_from_its_tensors(ctx: Any, ck: Any) -> None:
    assert ck.unet.family.name == "sd15"
    with ctx.models.use(ck.unet) as module:
        assert module.config.in_channels == 9 and module.config.out_channels == 4


def test_inpaint_model_conditioning_gives_the_masked_image_and_mask(ctx: Any, ck: Any) -> None:
    pos, neg = _prompts(ctx, ck.clip)
    p, n, latent = InpaintModelConditioning().run(
        ctx, positive=pos, negative=neg, vae=ck.vae, pixels=_image(), mask=_mask(), noise_mask=True
    )
    masked = _image().clone()
    masked[:, 16:48, 16:48, :] = 0.5
    with ctx.models.use(ck.vae) as vae:
        assert torch.allclose(p[0].extras["concat_latent_image"], encode(vae, masked), atol=1e-5)
        assert torch.allclose(latent["samples"], encode(vae, _image()), atol=1e-5)
    assert torch.equal(p[0].extras["concat_mask"], n[0].extras["concat_mask"])
    assert latent["noise_mask"].shape == (1, 1, SIZE, SIZE)
    _, _, no_mask = InpaintModelConditioning().run(
        ctx, positive=pos, negative=neg, vae=ck.vae, pixels=_image(), mask=_mask(), noise_mask=False
    )
    assert "noise_mask" not in no_mask


def test_the_denoiser_builds_mask_then_masked_image_in_model_space() -> None:
    den = SD15.denoiser
    raw = torch.randn(1, 4, 8, 8)
    mask = torch.zeros(1, 1, SIZE, SIZE)
    mask[..., :, 32:] = 1.0
    c = den.inpaint_concat({"concat_latent_image": raw, "concat_mask": mask}, 2, (8, 8))
    assert c.shape == (2, 5, 8, 8)
    assert torch.equal(c[:, 0, :, :4], torch.zeros(2, 8, 4)) and torch.equal(
        c[:, 0, :, 4:], torch.ones(2, 8, 4)
    )
    assert torch.allclose(c[:, 1:], SD15.latent_format.process_in(raw).expand(2, -1, -1, -1))
    sampled = den.inpaint_concat({"latent_image": raw, "denoise_mask": mask}, 1, (8, 8))
    assert torch.equal(sampled[:, 1:], raw)  # the sampler's latent is already in model space
    blank = den.inpaint_concat({"latent_image": raw, "denoise_mask": None}, 1, (8, 8))
    assert torch.equal(blank[:, 0], torch.ones(1, 8, 8))
    assert blank[0, 1:, 0, 0].tolist() == pytest.approx(list(BLANK_INPAINT_LATENT))
    with pytest.raises(ConditioningError, match="batch of 2"):
        den.inpaint_concat({"concat_latent_image": raw.repeat(2, 1, 1, 1), "concat_mask": mask}, 3, (8, 8))


def test_sampling_with_inpaint_model_conditioning_uses_the_image(ctx: Any, ck: Any) -> None:
    pos, neg = _prompts(ctx, ck.clip)
    p, n, latent = InpaintModelConditioning().run(
        ctx, positive=pos, negative=neg, vae=ck.vae, pixels=_image(), mask=_mask(), noise_mask=False
    )
    out = _sample(ctx, ck.unet, p, n, latent)
    assert out.shape == (1, 4, 8, 8) and torch.isfinite(out).all()
    other = torch.flip(_image(), dims=[1])
    p2, n2, _ = InpaintModelConditioning().run(
        ctx, positive=pos, negative=neg, vae=ck.vae, pixels=other, mask=_mask(), noise_mask=False
    )
    assert not torch.allclose(_sample(ctx, ck.unet, p2, n2, latent), out)  # the concat image reaches the UNet
    assert not torch.allclose(_sample(ctx, ck.unet, pos, neg, latent), out)  # without it: a blank image


def test_noise_mask_keeps_the_unmasked_latent(ctx: Any, ck: Any) -> None:
    pos, neg = _prompts(ctx, ck.clip)
    p, n, latent = InpaintModelConditioning().run(
        ctx, positive=pos, negative=neg, vae=ck.vae, pixels=_image(), mask=_mask(), noise_mask=True
    )
    out = _sample(ctx, ck.unet, p, n, latent)
    assert torch.allclose(out[..., :1, :], latent["samples"][..., :1, :], atol=1e-4)
    assert not torch.allclose(out[..., 3:5, 3:5], latent["samples"][..., 3:5, 3:5], atol=1e-3)


def test_vae_encode_for_inpaint_feeds_the_latent_and_noise_mask(ctx: Any, ck: Any) -> None:
    pos, neg = _prompts(ctx, ck.clip)
    latent = VAEEncodeForInpaint().run(ctx, pixels=_image(), vae=ck.vae, mask=_mask(), grow_mask_by=0)[0]
    out = _sample(ctx, ck.unet, pos, neg, latent)
    assert torch.isfinite(out).all()
    full = VAEEncode().run(ctx, pixels=_image(), vae=ck.vae)[0]
    # no noise mask: ComfyUI's blank image and full mask instead of the latent
    assert not torch.allclose(_sample(ctx, ck.unet, pos, neg, {"samples": latent["samples"]}), out)
    assert torch.isfinite(_sample(ctx, ck.unet, pos, neg, full)).all()


def test_a_four_channel_unet_ignores_the_inpainting_inputs(ctx: Any, tiny_sd15_ckpt: Path) -> None:
    sd = open_checkpoint(tiny_sd15_ckpt)
    pos, neg = _prompts(ctx, sd.clip)
    p, n, latent = InpaintModelConditioning().run(
        ctx, positive=pos, negative=neg, vae=sd.vae, pixels=_image(), mask=_mask(), noise_mask=True
    )
    assert torch.equal(_sample(ctx, sd.unet, p, n, latent), _sample(ctx, sd.unet, pos, neg, latent))


def test_a_nine_channel_pooled_unet_samples_with_inpaint_conditioning(ctx: Any, tmp_path: Path) -> None:
    from tests.nodes.conftest import build_tiny

    tiny = build_tiny("sdxl", seed=2)
    cfg = dict(tiny.modules["unet"].config)
    cfg["in_channels"] = 9
    torch.manual_seed(2)
    tiny.modules["unet"] = type(tiny.modules["unet"]).from_config(cfg).eval()
    ck = open_checkpoint(write_single_file(tiny, tmp_path / "xl_inpaint.safetensors"))
    with ctx.models.use(ck.unet) as module:
        assert module.config.in_channels == 9 and module.config.addition_embed_type == "text_time"
    pos, neg = _prompts(ctx, ck.clip)
    p, n, latent = InpaintModelConditioning().run(
        ctx, positive=pos, negative=neg, vae=ck.vae, pixels=_image(), mask=_mask(), noise_mask=False
    )
    out = _sample(ctx, ck.unet, p, n, latent)
    assert torch.isfinite(out).all()
    assert not torch.allclose(_sample(ctx, ck.unet, pos, neg, latent), out)


def test_odd_sized_pixels_are_centre_cropped_with_their_mask(ctx: Any, ck: Any) -> None:
    pos, neg = _prompts(ctx, ck.clip)
    pixels = torch.rand(1, SIZE + 3, SIZE + 6, 3, generator=torch.Generator().manual_seed(4))
    mask = torch.zeros(1, SIZE + 3, SIZE + 6)
    mask[:, 1:33, 3:35] = 1.0  # the top-left quarter of the cropped image
    p, _, latent = InpaintModelConditioning().run(
        ctx, positive=pos, negative=neg, vae=ck.vae, pixels=pixels, mask=mask, noise_mask=True
    )
    assert latent["samples"].shape == (1, 4, 8, 8)
    m = p[0].extras["concat_mask"]
    assert (
        m.shape == (1, 1, SIZE, SIZE)
        and float(m[0, 0, :32, :32].min()) == 1.0
        and float(m[0, 0, 32:].max()) == 0.0
    )


def test_an_area_conditioning_on_an_inpainting_model_is_refused_with_a_reason(ctx: Any, ck: Any) -> None:
    from nodes.encode.conditioning import ConditioningSetArea

    pos, neg = _prompts(ctx, ck.clip)
    p, n, latent = InpaintModelConditioning().run(
        ctx, positive=pos, negative=neg, vae=ck.vae, pixels=_image(), mask=_mask(), noise_mask=False
    )
    (area,) = ConditioningSetArea().run(ctx, conditioning=p, width=32, height=32, x=0, y=0, strength=1.0)
    with pytest.raises(ConditioningError, match="area"):
        _sample(ctx, ck.unet, p + area, n, latent)
