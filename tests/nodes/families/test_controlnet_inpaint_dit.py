"""Inpainting ControlNets for the DiT families (AliMama's ``FLUX.1-dev-Controlnet-Inpainting-Beta``
layout and ``SD3-Controlnet-Inpainting``), applied with ``ControlNetInpaintingAliMamaApply`` as
ComfyUI runs them: the mask is inverted (1 keeps), the part to repaint is blacked out of the image
(the inverted mask resized bilinear, rounded, multiplied in), the image is VAE-encoded into the
ControlNet's latent space and the inverted mask, resized nearest-exact to the latent, is appended as
a 17th channel. Loom's txt2img with tiny random ones equals diffusers' pipelines on the same tiny
components, noise and sigmas (setup: ``tests/nodes/dit_control_fixtures.py``):

- SD3: ``StableDiffusion3ControlNetInpaintingPipeline``. It brings the masked-image latent into model
  space with the VAE's shift, where ComfyUI uses the shift-free latent format of every SD3
  ControlNet; the reference pipeline's VAE has its shift set to 0, so both follow ComfyUI.
- Flux: diffusers has no pipeline for AliMama's Flux ControlNet (AliMama ship their own, built on
  ``FluxControlNetPipeline``): the reference is ``FluxControlNetPipeline`` given the masked image,
  with the packed inverted mask appended to its encoded control image (AliMama's pipeline's
  preparation) by a forward hook on the ControlNet.

Both pipelines resize the mask to the latent with plain ``nearest`` (ComfyUI: ``nearest-exact``)
and black out pixels where the mask is above 0.5 (ComfyUI: where the bilinear-resized inverted mask
rounds to 0); the masks of the parity tests are binary and constant over 8×8 blocks, where all of
these agree. Polarity (1 = repaint on the node's input, 1 = keep in the hint) and the concat order
(image latent, then mask) are the same on both sides.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch

from nodes.control.apply_variants import ControlNetInpaintingAliMamaApply, masked_hint
from nodes.control.controlnet import ControlNetApplyAdvanced, mask_channel, open_controlnet
from nodes.core.cond import CondEntry
from nodes.core.sampling_hooks import ConditioningError
from nodes.demo.control import (
    DEMO_FLUX_INPAINT,
    DEMO_SD3_INPAINT,
    demo_flux_controlnet,
    demo_flux_inpaint_controlnet,
    demo_sd3_controlnet,
    make_dit_control_demos,
)
from nodes.families.components.dit_control import FLUX_INSTANTX, SD3, DiTControlNetHandle
from nodes.load.handles import open_vae
from tests.nodes.dit_control_fixtures import (
    SIZE,
    apply_control,
    control_image,
    flux_pipeline_latent,
    flux_run,
    save,
    sd3_pipeline,
    sd3_pipeline_latent,
    sd3_run,
    write_flux,
    write_sd3_with_controlnet,
)


def _mask(batch: int = 1) -> torch.Tensor:
    """A binary MASK (B, H, W), 1 where to repaint, constant over 8×8 blocks (see the module docstring)."""
    blocks = torch.zeros(batch, SIZE // 8, SIZE // 8)
    blocks[:, 2:6, 1:5] = 1.0
    blocks[:, 6:, 5:] = 1.0
    return blocks.repeat_interleave(8, dim=1).repeat_interleave(8, dim=2)


@pytest.fixture(scope="module")
def flux(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("fluxinpaintcn")
    modules = write_flux(root)
    net = demo_flux_inpaint_controlnet()
    return {
        "root": root,
        "modules": modules,
        "net": net,
        "cn": save(root / "cn" / "flux_inpainting_beta.safetensors", net.state_dict()),
        "plain": save(root / "cn" / "flux_union.safetensors", demo_flux_controlnet().state_dict()),
    }


@pytest.fixture(scope="module")
def sd3(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    net = demo_sd3_controlnet(15, inpaint=True)
    return write_sd3_with_controlnet(tmp_path_factory.mktemp("sd3inpaintcn"), net, "cn_inpaint")


def _alimama(
    ctx: Any, net: Any, vae: Any, image: torch.Tensor, mask: Any, strength: float, start: float = 0.0
) -> Any:
    return apply_control(ctx, ControlNetInpaintingAliMamaApply, net, vae, image, strength, start, mask=mask)


def _plain(ctx: Any, net: Any, vae: Any, image: torch.Tensor, strength: float) -> Any:
    return apply_control(ctx, ControlNetApplyAdvanced, net, vae, image, strength)


def _flux_vae(flux: dict[str, Any]) -> Any:
    from nodes.demo.flux import DEMO_FLUX_VAE

    return open_vae(flux["root"] / DEMO_FLUX_VAE)


def _sd3_vae(sd3: dict[str, Any]) -> Any:
    from nodes.demo.sd3 import DEMO_SD3_VAE

    return open_vae(sd3["root"] / DEMO_SD3_VAE)


def _pipeline_pixels(image: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The pipelines' masked control image: -1..1, -1 (black) where the mask is above 0.5."""
    pixels = image.movedim(-1, 1) * 2 - 1
    return torch.where(mask.unsqueeze(1) > 0.5, torch.full_like(pixels, -1.0), pixels)


# --- the files ------------------------------------------------------------------------------------
def test_inpainting_controlnets_are_read_with_the_mask_channel(
    flux: dict[str, Any], sd3: dict[str, Any]
) -> None:
    for key, data, layout, family in ((FLUX_INSTANTX, flux, FLUX_INSTANTX, "flux"), (SD3, sd3, SD3, "sd3")):
        handle = open_controlnet(data["cn"])
        assert isinstance(handle, DiTControlNetHandle), key
        assert (handle.layout, handle.family, handle.concat_mask) == (layout, family, True)
        built = handle.build().state_dict()
        assert built.keys() == data["net"].state_dict().keys()
        assert all(torch.equal(v, built[k]) for k, v in data["net"].state_dict().items())
    assert open_controlnet(flux["cn"]).build().controlnet_x_embedder.in_features == 68
    plain = open_controlnet(flux["plain"])
    assert isinstance(plain, DiTControlNetHandle) and not plain.concat_mask


# --- parity ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(("strength", "start"), [(0.8, 0.0), (1.2, 0.3)])
def test_flux_inpainting_controlnet_matches_alimamas_flux_pipeline(
    flux: dict[str, Any], make_ctx: Any, strength: float, start: float
) -> None:
    ctx, image, mask = make_ctx(), control_image(), _mask()
    net, vae = open_controlnet(flux["cn"]), _flux_vae(flux)
    mine, cond = flux_run(ctx, flux["root"], _alimama(ctx, net, vae, image, mask, strength, start))
    plain, _ = flux_run(ctx, flux["root"], None)

    reference = copy.deepcopy(flux["net"])
    keep = 1 - torch.nn.functional.interpolate(mask.unsqueeze(1), size=(SIZE // 8, SIZE // 8))
    packed_keep = keep.reshape(1, 1, SIZE // 16, 2, SIZE // 16, 2).permute(0, 2, 4, 1, 3, 5).reshape(1, -1, 4)

    def with_mask(_module: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        cond_tokens = kwargs["controlnet_cond"]
        return args, {**kwargs, "controlnet_cond": torch.cat([cond_tokens, packed_keep.to(cond_tokens)], -1)}

    reference.register_forward_pre_hook(with_mask, with_kwargs=True)
    ref = flux_pipeline_latent(
        flux["modules"],
        cond,
        reference,
        control_image=_pipeline_pixels(image, mask),
        controlnet_conditioning_scale=strength,
        control_guidance_start=start,
        control_guidance_end=1.0,
    )
    assert (mine - ref).abs().max() < 1e-4
    assert (mine - plain).abs().max() > 1e-3  # the ControlNet changed the result


@pytest.mark.parametrize(("strength", "start"), [(0.9, 0.0), (1.3, 0.4)])
def test_sd3_inpainting_controlnet_matches_sd3_controlnet_inpainting_pipeline(
    sd3: dict[str, Any], make_ctx: Any, strength: float, start: float
) -> None:
    from diffusers import StableDiffusion3ControlNetInpaintingPipeline

    ctx, image, mask = make_ctx(), control_image(), _mask()
    net, vae = open_controlnet(sd3["cn"]), _sd3_vae(sd3)
    mine, pos, neg = sd3_run(ctx, sd3["root"], _alimama(ctx, net, vae, image, mask, strength, start))
    plain, _, _ = sd3_run(ctx, sd3["root"], None)

    shift_free = copy.deepcopy(sd3["modules"]["vae"])
    shift_free.register_to_config(shift_factor=0.0)  # ComfyUI's latent format for SD3 ControlNets
    pipe = sd3_pipeline(
        {**sd3["modules"], "vae": shift_free}, sd3["net"], StableDiffusion3ControlNetInpaintingPipeline
    )
    ref = sd3_pipeline_latent(
        pipe,
        pos,
        neg,
        strength,
        start,
        control_image=image.movedim(-1, 1) * 2 - 1,
        control_mask=mask.unsqueeze(1),
    )
    assert (mine - ref).abs().max() < 1e-4
    assert (mine - plain).abs().max() > 1e-3


def test_plain_apply_gives_an_inpainting_controlnet_a_mask_of_ones(
    flux: dict[str, Any], make_ctx: Any
) -> None:
    """ComfyUI: an inpainting ControlNet under ControlNetApplyAdvanced gets the image as it is and a
    mask of ones (keep everything), which is what the AliMama node makes of an all-zero MASK."""
    ctx, image = make_ctx(), control_image()
    net, vae = open_controlnet(flux["cn"]), _flux_vae(flux)
    plain, _ = flux_run(ctx, flux["root"], _plain(ctx, net, vae, image, 1.0))
    nothing, _ = flux_run(ctx, flux["root"], _alimama(ctx, net, vae, image, torch.zeros(1, SIZE, SIZE), 1.0))
    masked, _ = flux_run(ctx, flux["root"], _alimama(ctx, net, vae, image, _mask(), 1.0))
    assert (plain - nothing).abs().max() < 1e-5
    assert (plain - masked).abs().max() > 1e-3


# --- ComfyUI's preparation ------------------------------------------------------------------------
def test_the_mask_blacks_out_the_image_and_is_handed_on_inverted() -> None:
    image = torch.full((1, 4, 4, 3), 0.5)
    mask = torch.zeros(4, 4)
    mask[:2, :2] = 1.0
    hint, keep = masked_hint(image, mask)
    assert keep.shape == (1, 1, 4, 4) and torch.equal(keep[0, 0], 1 - mask)
    assert torch.equal(hint[0, :2, :2], torch.zeros(2, 2, 3)) and torch.equal(
        hint[0, 2:, 2:], image[0, 2:, 2:]
    )
    # a mask of another size: resized bilinear (centre crop) to the image and rounded
    small = torch.tensor([[1.0, 0.0]])  # 1×2: the left half repaints
    hint, keep = masked_hint(torch.ones(1, 2, 4, 3), small)
    assert torch.equal(hint[0, :, :2], torch.zeros(2, 2, 3)) and torch.equal(
        hint[0, :, 2:], torch.ones(2, 2, 3)
    )
    assert keep.shape == (1, 1, 1, 2)  # handed on at its own size


def test_the_mask_channel_is_resized_nearest_exact_and_batched_to_the_latent() -> None:
    latent = torch.zeros(3, 16, 2, 4)
    keep = torch.arange(8.0).reshape(1, 1, 2, 4).repeat_interleave(2, 2).repeat_interleave(2, 3)  # 4×8
    channel = mask_channel(keep, latent)
    assert channel.shape == (3, 1, 2, 4)
    assert torch.equal(channel[2, 0], torch.arange(8.0).reshape(2, 4))
    assert torch.equal(mask_channel(None, latent), torch.ones(3, 1, 2, 4))
    two = torch.stack([torch.zeros(1, 2, 4), torch.ones(1, 2, 4)])
    assert [float(c.mean()) for c in mask_channel(two, latent)] == [0.0, 1.0, 0.0]  # cycled as ComfyUI


def test_alimama_apply_with_an_image_controlnet_is_the_plain_apply(
    flux: dict[str, Any], make_ctx: Any
) -> None:
    ctx, image = make_ctx(), control_image()
    net, vae = open_controlnet(flux["plain"]), _flux_vae(flux)
    (entry,) = _alimama(ctx, net, vae, image, _mask(), 1.0)([_cond()], [_cond()])[0]
    control = entry.extras["control"]
    assert control.image is image and control.mask is None


def _cond() -> CondEntry:
    return CondEntry(torch.zeros(1, 4, 8))


# --- bad input ------------------------------------------------------------------------------------
def test_a_missing_or_mismatched_mask_is_refused_clearly(flux: dict[str, Any], make_ctx: Any) -> None:
    ctx = make_ctx()
    net, vae = open_controlnet(flux["cn"]), _flux_vae(flux)
    with pytest.raises(ValueError, match="needs a MASK .* found nothing"):
        _alimama(ctx, net, vae, control_image(), None, 1.0)([_cond()], [_cond()])
    with pytest.raises(ValueError, match="got 2 images but 3 masks"):
        _alimama(ctx, net, vae, control_image(2), _mask(3), 1.0)([_cond()], [_cond()])
    (entry,) = _alimama(ctx, net, vae, control_image(2), _mask(1), 1.0)([_cond()], [_cond()])[0]
    assert entry.extras["control"].image.shape[0] == 2  # one mask for all images


def test_an_inpainting_controlnet_without_a_vae_is_refused(flux: dict[str, Any], make_ctx: Any) -> None:
    ctx = make_ctx()
    with pytest.raises(ValueError, match="VAE-encoded control images.*vae input"):
        _alimama(ctx, open_controlnet(flux["cn"]), None, control_image(), _mask(), 1.0)([_cond()], [_cond()])


def test_an_inpainting_controlnet_of_another_family_names_both(
    flux: dict[str, Any], sd3: dict[str, Any], make_ctx: Any
) -> None:
    ctx = make_ctx()
    flux_net, sd3_vae = open_controlnet(flux["cn"]), _sd3_vae(sd3)
    with pytest.raises(ConditioningError, match=r"is for flux but the model is sd3"):
        sd3_run(ctx, sd3["root"], _alimama(ctx, flux_net, sd3_vae, control_image(), _mask(), 1.0))
    sd3_net, flux_vae = open_controlnet(sd3["cn"]), _flux_vae(flux)
    with pytest.raises(ConditioningError, match=r"is for sd3 but the model is flux"):
        flux_run(ctx, flux["root"], _alimama(ctx, sd3_net, flux_vae, control_image(), _mask(), 1.0))


# --- demo files -----------------------------------------------------------------------------------
def test_demo_writer_writes_the_inpainting_controlnets_in_alimamas_layouts(tmp_path: Path) -> None:
    from safetensors import safe_open

    written = make_dit_control_demos(tmp_path, save)
    folder = tmp_path / "controlnet"
    flux_file, sd3_file = (
        folder / DEMO_FLUX_INPAINT,
        folder / DEMO_SD3_INPAINT / "diffusion_pytorch_model.safetensors",
    )
    assert {flux_file, sd3_file} <= set(written)
    assert (sd3_file.parent / "config.json").is_file()
    with safe_open(str(flux_file), "pt") as f:
        assert f.get_slice("controlnet_x_embedder.weight").get_shape()[1] == 68
        assert "controlnet_mode_embedder.weight" not in f.keys()
    with safe_open(str(sd3_file), "pt") as f:
        assert f.get_slice("pos_embed_input.proj.weight").get_shape()[1] == 17
    for path, layout in ((flux_file, FLUX_INSTANTX), (sd3_file, SD3)):
        handle = open_controlnet(path)
        assert isinstance(handle, DiTControlNetHandle) and handle.layout == layout and handle.concat_mask
        handle.build()
