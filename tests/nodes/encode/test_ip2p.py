"""InstructPix2Pix: an 8-channel UNet is recognised from its first convolution; the source image's
VAE latent (unscaled) is appended to the UNet input at every step of both CFG branches; the
node's LATENT is zeros of the image's latent size; other models refuse the conditioning."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from nodes.demo.unclip import DEMO_IP2P
from nodes.encode.conditioning import CLIPTextEncode
from nodes.encode.ip2p import InstructPixToPixConditioning
from nodes.families.components.unet_inputs import concat_kind, resize_to_batch
from nodes.latent.vae import encode
from nodes.load.handles import open_checkpoint
from nodes.sample.ksampler import KSampler, SamplingError
from tests.conftest import linked_copy


@pytest.fixture(scope="module")
def ip2p(tmp_path_factory: pytest.TempPathFactory, unclip_demo_source: Path) -> Any:
    torch.set_num_threads(1)
    folder = linked_copy(
        unclip_demo_source, tmp_path_factory.mktemp("ip2p_models")
    )  # make_unclip_demo_models' files
    return open_checkpoint(folder / "checkpoints" / DEMO_IP2P)


@pytest.fixture()
def ctx(make_ctx: Any) -> Any:
    torch.set_num_threads(1)
    return make_ctx()


def _image(h: int = 64, w: int = 64) -> torch.Tensor:
    return torch.rand(1, h, w, 3, generator=torch.Generator().manual_seed(0))


def _sample(ctx: Any, model: Any, pos: list, neg: list, latent: dict) -> torch.Tensor:
    return KSampler().run(
        ctx,
        model=model,
        seed=1,
        steps=1,
        cfg=3.0,
        sampler_name="euler",
        scheduler="normal",
        positive=pos,
        negative=neg,
        latent_image=latent,
        denoise=1.0,
    )[0]["samples"]


def test_the_variant_is_read_from_the_input_width() -> None:
    assert concat_kind(4, 4) == "none" and concat_kind(8, 4) == "ip2p" and concat_kind(9, 4) == "inpaint"


def test_the_node_encodes_the_centre_crop_and_returns_an_empty_latent(ctx: Any, ip2p: Any) -> None:
    pos = CLIPTextEncode().run(ctx, text="make it snow", clip=ip2p.clip)[0]
    image = _image(69, 70)  # cropped to 64 x 64 from (2, 3)
    p, n, latent = InstructPixToPixConditioning().run(
        ctx, positive=pos, negative=pos, vae=ip2p.vae, pixels=image
    )
    with ctx.models.use(ip2p.vae) as vae:
        expected = encode(vae, image[:, 2:66, 3:67])
    assert torch.allclose(p[0].extras["concat_latent_image"], expected, atol=1e-6)
    assert p[0].extras["concat_latent_image"] is n[0].extras["concat_latent_image"]
    assert torch.equal(latent["samples"], torch.zeros(1, 4, 8, 8))


def test_the_unet_gets_the_raw_image_latent_appended(ctx: Any, ip2p: Any) -> None:
    pos = CLIPTextEncode().run(ctx, text="make it snow", clip=ip2p.clip)[0]
    neg = CLIPTextEncode().run(ctx, text="", clip=ip2p.clip)[0]
    p, n, latent = InstructPixToPixConditioning().run(
        ctx, positive=pos, negative=neg, vae=ip2p.vae, pixels=_image()
    )
    seen: list[torch.Tensor] = []
    with ctx.models.use(ip2p.unet) as module:
        assert module.config.in_channels == 8
        hook = module.conv_in.register_forward_pre_hook(
            lambda _m, args: seen.append(args[0].detach().clone())
        )
        try:
            out = _sample(ctx, ip2p.unet, p, n, latent)
        finally:
            hook.remove()
    concat = p[0].extras["concat_latent_image"]
    assert seen and all(x.shape[1] == 8 for x in seen)
    for x in seen:  # both branches, every call: channels 4..8 are the VAE latent as encoded
        assert torch.allclose(x[:, 4:], concat.expand(x.shape[0], -1, -1, -1), atol=1e-5)
    assert torch.isfinite(out).all()


def test_without_an_image_the_extra_channels_are_zeros(ctx: Any, ip2p: Any) -> None:
    pos = CLIPTextEncode().run(ctx, text="a cat", clip=ip2p.clip)[0]
    seen: list[torch.Tensor] = []
    with ctx.models.use(ip2p.unet) as module:
        hook = module.conv_in.register_forward_pre_hook(
            lambda _m, args: seen.append(args[0].detach().clone())
        )
        try:
            _sample(ctx, ip2p.unet, pos, pos, {"samples": torch.zeros(1, 4, 8, 8)})
        finally:
            hook.remove()
    assert seen and all(torch.equal(x[:, 4:], torch.zeros_like(x[:, 4:])) for x in seen)


def test_the_image_is_spread_over_the_batch_as_comfyui_does() -> None:
    rows = torch.arange(3.0).reshape(3, 1)
    assert resize_to_batch(rows, 5).flatten().tolist() == [0, 0, 1, 2, 2]
    assert resize_to_batch(rows, 2).flatten().tolist() == [0, 2]


def test_a_model_that_is_not_instructpix2pix_refuses_the_conditioning(
    ctx: Any, ip2p: Any, tiny_sd15_ckpt: Path
) -> None:
    ck = open_checkpoint(tiny_sd15_ckpt)
    pos = CLIPTextEncode().run(ctx, text="a cat", clip=ck.clip)[0]
    p, n, latent = InstructPixToPixConditioning().run(
        ctx, positive=pos, negative=pos, vae=ck.vae, pixels=_image()
    )
    with pytest.raises(SamplingError, match="InstructPix2Pix"):
        _sample(ctx, ck.unet, p, n, latent)
