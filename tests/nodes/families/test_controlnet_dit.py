"""ControlNets for the DiT families: Loom's txt2img with a tiny random SD3 ControlNet (diffusers
layout, VAE-encoded hint) equals diffusers' StableDiffusion3ControlNetPipeline, and with a tiny
Flux union ControlNet (InstantX / Shakker-Labs layout) and an XLabs-layout one (pixel hint) equals
FluxControlNetPipeline, on the same tiny components, noise and sigmas (as the plain family parity
tests), with strength and a start percent where the two schedules agree (diffusers switches a
ControlNet per step index, ComfyUI per sigma: start percents that fall between steps agree).

The shared setup (tiny files, Loom's run, diffusers' pipelines, the sharp VAE posterior):
``tests/nodes/dit_control_fixtures.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from nodes.control.apply_variants import ControlNetApplySD3
from nodes.control.controlnet import ControlNetApplyAdvanced, open_controlnet
from nodes.control.controlnet_union import SetUnionControlNetType
from nodes.core.sampling_hooks import ConditioningError
from nodes.core.tensors import ModelLoadError
from nodes.demo.control import demo_flux_controlnet, demo_sd3_controlnet, xlabs_file
from nodes.encode.conditioning import CLIPTextEncode
from nodes.families.components.dit_control import FLUX_INSTANTX, FLUX_XLABS, SD3
from nodes.load.handles import open_vae
from nodes.sample.ksampler import KSampler
from tests.nodes.dit_control_fixtures import (
    SIZE,
    apply_control,
    flux_pipeline_latent,
    flux_run,
    save,
    sd3_pipeline,
    sd3_pipeline_latent,
    sd3_run,
    write_flux,
    write_sd3_with_controlnet,
)
from tests.nodes.dit_control_fixtures import control_image as _image


# --- SD3 ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sd3(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return write_sd3_with_controlnet(tmp_path_factory.mktemp("sd3cn"), demo_sd3_controlnet(), "cn_sd3")


def _sd3_run(ctx: Any, sd3: dict[str, Any], apply: Any, latent_batch: int = 1) -> tuple[Any, Any, Any]:
    return sd3_run(ctx, sd3["root"], apply, latent_batch)


def _sd3_apply(
    ctx: Any, sd3: dict[str, Any], image: torch.Tensor, strength: float, start: float = 0.0
) -> Any:
    from nodes.demo.sd3 import DEMO_SD3_VAE

    net, vae = open_controlnet(sd3["cn"]), open_vae(sd3["root"] / DEMO_SD3_VAE)
    return apply_control(ctx, ControlNetApplySD3, net, vae, image, strength, start)


def test_sd3_controlnet_file_is_read_as_diffusers_sd3_controlnet(sd3: dict[str, Any]) -> None:
    handle = open_controlnet(sd3["cn"])
    assert handle.layout == SD3 and handle.family == "sd3" and handle.fits("sd3") and not handle.fits("flux")
    built = handle.build().state_dict()
    assert all(torch.equal(v, built[k]) for k, v in sd3["net"].state_dict().items())


@pytest.mark.parametrize(("strength", "start"), [(0.8, 0.0), (1.3, 0.4)])
def test_sd3_txt2img_matches_stable_diffusion_3_controlnet_pipeline(
    sd3: dict[str, Any], make_ctx: Any, strength: float, start: float
) -> None:
    ctx, image = make_ctx(), _image()
    mine, pos, neg = _sd3_run(ctx, sd3, _sd3_apply(ctx, sd3, image, strength, start))
    plain, _, _ = _sd3_run(ctx, sd3, None)
    pipe = sd3_pipeline(sd3["modules"], sd3["net"])
    ref = sd3_pipeline_latent(pipe, pos, neg, strength, start, control_image=image.movedim(-1, 1) * 2 - 1)
    assert (mine - ref).abs().max() < 1e-4
    assert (mine - plain).abs().max() > 1e-3  # the ControlNet changed the result


# --- Flux -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def flux(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("fluxcn")
    modules = write_flux(root)
    union, xlabs = demo_flux_controlnet(), demo_flux_controlnet(13, xlabs=True)
    return {
        "root": root,
        "modules": modules,
        "union": union,
        "xlabs": xlabs,
        "union_file": save(root / "cn" / "flux_union.safetensors", union.state_dict()),
        "xlabs_file": save(root / "cn" / "flux_xlabs.safetensors", xlabs_file(xlabs)),
    }


def run_flux_control(ctx: Any, flux: dict[str, Any], apply: Any, latent_batch: int = 1) -> tuple[Any, Any]:
    return flux_run(ctx, flux["root"], apply, latent_batch)


def apply_flux_control(
    ctx: Any,
    flux: dict[str, Any],
    which: str,
    image: torch.Tensor,
    strength: float,
    start: float = 0.0,
    union_type: str = "auto",
) -> Any:
    from nodes.demo.flux import DEMO_FLUX_VAE

    net = SetUnionControlNetType().run(ctx, control_net=open_controlnet(flux[which]), type=union_type)[0]
    vae = open_vae(flux["root"] / DEMO_FLUX_VAE)
    return apply_control(ctx, ControlNetApplyAdvanced, net, vae, image, strength, start)


def flux_controlnet_pipeline_latent(
    flux: dict[str, Any],
    cond: Any,
    net: Any,
    image: torch.Tensor,
    strength: float,
    start: float = 0.0,
    mode: int | None = None,
) -> torch.Tensor:
    return flux_pipeline_latent(
        flux["modules"],
        cond,
        net,
        control_image=image.movedim(-1, 1) * 2 - 1,
        control_mode=mode,
        controlnet_conditioning_scale=strength,
        control_guidance_start=start,
        control_guidance_end=1.0,
    )


def test_flux_controlnet_layouts_are_read(flux: dict[str, Any]) -> None:
    union, xlabs = open_controlnet(flux["union_file"]), open_controlnet(flux["xlabs_file"])
    assert (union.layout, union.union_types, union.latent_format is not None) == (FLUX_INSTANTX, 10, True)
    assert (xlabs.layout, xlabs.union_types, xlabs.latent_format) == (FLUX_XLABS, None, None)
    for handle, net in ((union, flux["union"]), (xlabs, flux["xlabs"])):
        built = handle.build().state_dict()
        assert set(built) == set(net.state_dict())
        assert all(torch.equal(v, built[k]) for k, v in net.state_dict().items())


@pytest.mark.parametrize(("strength", "start"), [(0.7, 0.0), (1.2, 0.3)])
def test_flux_union_txt2img_matches_flux_controlnet_pipeline(
    flux: dict[str, Any], make_ctx: Any, strength: float, start: float
) -> None:
    ctx, image = make_ctx(), _image()
    canny = "canny/lineart/anime_lineart/mlsd"  # ComfyUI's index 3 for every union ControlNet
    mine, cond = run_flux_control(
        ctx, flux, apply_flux_control(ctx, flux, "union_file", image, strength, start, canny)
    )
    plain, _ = run_flux_control(ctx, flux, None)
    ref = flux_controlnet_pipeline_latent(flux, cond, flux["union"], image, strength, start, mode=3)
    assert (mine - ref).abs().max() < 1e-4
    assert (mine - plain).abs().max() > 1e-3


def test_flux_xlabs_txt2img_matches_flux_controlnet_pipeline(flux: dict[str, Any], make_ctx: Any) -> None:
    ctx, image = make_ctx(), _image()
    mine, cond = run_flux_control(ctx, flux, apply_flux_control(ctx, flux, "xlabs_file", image, 0.9))
    ref = flux_controlnet_pipeline_latent(flux, cond, flux["xlabs"], image, 0.9)
    assert (mine - ref).abs().max() < 1e-4
    assert (mine - run_flux_control(ctx, flux, None)[0]).abs().max() > 1e-3


def test_union_auto_runs_without_a_mode_token(flux: dict[str, Any]) -> None:
    """ComfyUI's "auto" adds no mode token: the union ControlNet's outputs equal those of the same
    weights without the mode embedder (diffusers' forward); a set type equals diffusers' union forward."""
    from diffusers import FluxControlNetModel

    from nodes.families.components.dit_control import flux_forward

    union = flux["union"]
    plain = FluxControlNetModel.from_config({**union.config, "num_mode": None}).eval()
    plain.load_state_dict({k: v for k, v in union.state_dict().items() if "mode_embedder" not in k})
    g = torch.Generator().manual_seed(3)
    tokens, cond = torch.randn(1, 16, 64, generator=g), torch.randn(1, 16, 64, generator=g)
    text, pooled = torch.randn(1, 5, 32, generator=g), torch.randn(1, 32, generator=g)
    img_ids = torch.stack(
        torch.meshgrid(torch.zeros(1), torch.arange(4.0), torch.arange(4.0), indexing="ij"), -1
    )
    args = {
        "hidden_states": tokens,
        "controlnet_cond": cond,
        "timestep": torch.tensor([0.6]),
        "encoder_hidden_states": text,
        "pooled_projections": pooled,
        "txt_ids": torch.zeros(5, 3),
        "img_ids": img_ids.reshape(-1, 3),
        "guidance": torch.tensor([4.0]),
        "return_dict": False,
    }
    with torch.no_grad():
        for types, ref_net, mode in (((), plain, None), ((2,), union, torch.tensor([[2]]))):
            blocks, singles = flux_forward(
                union,
                tokens,
                cond,
                args["timestep"],
                text,
                pooled,
                args["txt_ids"],
                args["img_ids"],
                args["guidance"],
                types,
            )
            ref_blocks, ref_singles = ref_net(**args, controlnet_mode=mode)
            for mine, ref in zip([*blocks, *singles], [*ref_blocks, *ref_singles], strict=True):
                assert (mine - ref).abs().max() < 1e-5


def test_stacked_dit_controlnets_and_strength_zero(flux: dict[str, Any], make_ctx: Any) -> None:
    ctx, image = make_ctx(), _image()
    plain, _ = run_flux_control(ctx, flux, None)
    off, _ = run_flux_control(ctx, flux, apply_flux_control(ctx, flux, "union_file", image, 0.0))
    assert torch.equal(off, plain)
    one = apply_flux_control(ctx, flux, "union_file", image, 0.7)
    two = apply_flux_control(ctx, flux, "xlabs_file", _image(seed=6), 0.5)
    stacked, _ = run_flux_control(ctx, flux, lambda p, n: two(*one(p, n)))
    single, _ = run_flux_control(ctx, flux, one)
    assert (stacked - single).abs().max() > 1e-4


# --- bad input ------------------------------------------------------------------------------------
def test_flux_controlnet_with_an_sd3_model_names_both_families(
    flux: dict[str, Any], sd3: dict[str, Any], make_ctx: Any
) -> None:
    from nodes.demo.sd3 import DEMO_SD3_VAE

    ctx = make_ctx()
    net, vae = open_controlnet(flux["union_file"]), open_vae(sd3["root"] / DEMO_SD3_VAE)
    apply = apply_control(ctx, ControlNetApplyAdvanced, net, vae, _image(), 1.0)
    with pytest.raises(ConditioningError, match=r"is for flux but the model is sd3"):
        _sd3_run(ctx, sd3, apply)


def test_flux_controlnet_with_an_sd15_model_names_both_families(
    flux: dict[str, Any], make_ctx: Any, tiny_sd15_ckpt: Path
) -> None:
    from nodes.latent.vae import EmptyLatentImage

    ctx = make_ctx()
    model, clip, vae = open_checkpoint_parts(tiny_sd15_ckpt)
    cond = CLIPTextEncode().run(ctx, text="a cat", clip=clip)[0]
    pos, neg = apply_control(
        ctx, ControlNetApplyAdvanced, open_controlnet(flux["xlabs_file"]), vae, _image(), 1.0
    )(cond, cond)
    latent = EmptyLatentImage().run(ctx, width=SIZE, height=SIZE, batch_size=1)[0]
    with pytest.raises(ConditioningError, match=r"is for flux but the model is sd15"):
        KSampler().run(
            ctx,
            model=model,
            seed=1,
            steps=1,
            cfg=1.0,
            sampler_name="euler",
            scheduler="normal",
            positive=pos,
            negative=neg,
            latent_image=latent,
            denoise=1.0,
        )


def open_checkpoint_parts(path: Path) -> tuple[Any, Any, Any]:
    from nodes.load.handles import open_checkpoint

    ckpt = open_checkpoint(path)
    return ckpt.unet, ckpt.clip, ckpt.vae


def test_latent_space_controlnet_without_a_vae_is_refused(flux: dict[str, Any], make_ctx: Any) -> None:
    ctx = make_ctx()
    with pytest.raises(ValueError, match="VAE-encoded control images.*vae input"):
        ControlNetApplyAdvanced().run(
            ctx,
            positive=[],
            negative=[],
            control_net=open_controlnet(flux["union_file"]),
            image=_image(),
            strength=1.0,
            start_percent=0.0,
            end_percent=1.0,
        )


def test_control_image_batch_is_cut_to_the_latent_batch_as_comfyui(
    flux: dict[str, Any], make_ctx: Any
) -> None:
    """ComfyUI's broadcast_image_to: a 2-image control batch on a 1-image latent uses its first image."""
    ctx, first = make_ctx(), _image()
    both = torch.cat([first, _image(seed=9)])
    one, _ = run_flux_control(ctx, flux, apply_flux_control(ctx, flux, "union_file", first, 1.0))
    two, _ = run_flux_control(ctx, flux, apply_flux_control(ctx, flux, "union_file", both, 1.0))
    assert (one - two).abs().max() < 1e-5


def test_unrunnable_dit_controlnet_layouts_are_refused_by_name(tmp_path: Path) -> None:
    cases = {
        "sd35_square_embedder.safetensors": (
            {
                "controlnet_blocks.0.weight": torch.zeros(4, 4),
                "pos_embed_input.proj.weight": torch.zeros(4, 16, 2, 2),
                "transformer_blocks.0.adaLN_modulation.1.bias": torch.zeros(4),
                "time_text_embed.text_embedder.linear_1.weight": torch.zeros(4, 4),
            },
            "SD3.5 ControlNet with a square",
        ),
        "odd_hint.safetensors": (
            {
                "controlnet_blocks.0.weight": torch.zeros(4, 4),
                "controlnet_x_embedder.weight": torch.zeros(4, 80),
            },
            "takes 20-channel control hints; Loom runs DiT ControlNets taking 16 .* or 17",
        ),
    }
    for name, (tensors, words) in cases.items():
        with pytest.raises(ModelLoadError, match=words):
            open_controlnet(save(tmp_path / name, tensors))


def test_a_latent_hint_of_another_size_than_the_call_is_refused(sd3: dict[str, Any]) -> None:
    """Area-limited conditioning calls the model on part of the latent; the VAE-encoded hint was
    made for the whole latent, so the ControlNet refuses with a message instead of a shape error."""
    handle = open_controlnet(sd3["cn"])
    x, hint = torch.zeros(1, 16, 4, 4), torch.zeros(1, 16, 8, 8)
    extra = {
        "main_blocks": (3, 0),
        "encoder_hidden_states": torch.zeros(1, 4, 64),
        "pooled_projections": torch.zeros(1, 64),
    }
    with pytest.raises(ConditioningError, match="area-limited conditioning"):
        handle.residuals(handle.build(), x, torch.tensor([500.0]), hint, 1, 1.0, extra)


def test_reference_latents_get_no_control_residual(flux: dict[str, Any], make_ctx: Any) -> None:
    """With Kontext-style reference latents the image stream is longer than the ControlNet's output:
    only the sampled latent's tokens get the residuals (ComfyUI adds to the first tokens)."""
    from dataclasses import replace

    ctx = make_ctx()
    ref = torch.randn(1, 16, SIZE // 8, SIZE // 8, generator=torch.Generator().manual_seed(4))

    def with_ref(pos: Any, neg: Any) -> tuple[Any, Any]:
        return tuple(
            [replace(e, extras={**e.extras, "reference_latents": [ref]}) for e in c] for c in (pos, neg)
        )

    control = apply_flux_control(ctx, flux, "union_file", _image(), 1.0)
    referenced, _ = run_flux_control(ctx, flux, with_ref)
    both, _ = run_flux_control(ctx, flux, lambda p, n: control(*with_ref(p, n)))
    assert torch.isfinite(both).all() and (both - referenced).abs().max() > 1e-4


def test_a_vae_of_another_latent_width_is_refused(
    flux: dict[str, Any], make_ctx: Any, tiny_sd15_ckpt: Path
) -> None:
    ctx = make_ctx()
    _, _, sd15_vae = open_checkpoint_parts(tiny_sd15_ckpt)
    apply = apply_control(
        ctx, ControlNetApplyAdvanced, open_controlnet(flux["union_file"]), sd15_vae, _image(), 1.0
    )
    with pytest.raises(ConditioningError, match=r"takes 16-channel latents .* makes 4-channel ones"):
        run_flux_control(ctx, flux, apply)


def test_block_outputs_are_spread_over_the_model_blocks_as_comfyui() -> None:
    from nodes.families.components.dit_control import sd3_spread, stretch

    outs = [torch.full((1,), float(i + 1)) for i in range(3)]
    # SD3: depth // k blocks per output, the last one block fewer; leftovers get zeros
    assert [float(t) for t in sd3_spread(outs, 6)] == [1, 1, 2, 2, 3, 0]
    assert [float(t) for t in sd3_spread(outs, 8)] == [1, 1, 2, 2, 3, 0, 0, 0]
    # Flux InstantX: block i gets output i // ceil(depth / k); XLabs cycles
    assert [float(t) for t in stretch(outs, 19) or []] == [1] * 7 + [2] * 7 + [3] * 5
    assert [float(t) for t in stretch(outs, 5, cycle=True) or []] == [1, 2, 3, 1, 2]
    assert stretch([], 38) is None
