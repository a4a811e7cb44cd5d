"""Custom sampling nodes, guiders, sigma nodes, guidance patches and stacked (coalesced) jobs on the
tiny SD1.5 model: each equals the KSampler run it should equal, or changes it as it should."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from nodes.core.cond import CondEntry
from nodes.encode.conditioning import CLIPTextEncode
from nodes.latent.vae import EmptyLatentImage
from nodes.load.handles import open_checkpoint
from nodes.patches import guidance as cp
from nodes.sample import sigma_nodes as sg
from nodes.sample.batched import KSamplerBatched
from nodes.sample.cond_batch import Cond, _area_and_mult
from nodes.sample.custom_sampling import (
    BasicGuider,
    CFGGuider,
    DisableNoise,
    DualCFGGuider,
    PerpNegGuider,
    RandomNoise,
    SamplerCustom,
    SamplerCustomAdvanced,
)
from nodes.sample.ksampler import KSampler
from nodes.sample.model_sampling_nodes import ModelSamplingDiscrete
from nodes.sample.sampler_nodes import KSamplerSelect, SamplerDPMPP_2M_SDE, SamplerEulerAncestral

STEPS = 3


@pytest.fixture(scope="module")
def sd15(tiny_sd15_ckpt: Any) -> Any:
    return open_checkpoint(tiny_sd15_ckpt)


@pytest.fixture()
def env(sd15: Any, make_ctx: Any) -> dict[str, Any]:
    torch.set_num_threads(1)
    ctx = make_ctx()
    enc = CLIPTextEncode()
    return {
        "ctx": ctx,
        "ck": sd15,
        "pos": enc.run(ctx, text="a photo of a cat", clip=sd15.clip)[0],
        "neg": enc.run(ctx, text="blurry", clip=sd15.clip)[0],
        "latent": EmptyLatentImage().run(ctx, width=64, height=64, batch_size=1)[0],
    }


def _ksampler(env: dict[str, Any], model: Any = None, **kw: Any) -> torch.Tensor:
    args: dict[str, Any] = dict(
        seed=5,
        steps=STEPS,
        cfg=6.0,
        sampler_name="euler",
        scheduler="normal",
        positive=env["pos"],
        negative=env["neg"],
        latent_image=env["latent"],
        denoise=1.0,
    )
    args.update(kw)
    return KSampler().run(env["ctx"], model=model or env["ck"].unet, **args)[0]["samples"]


def _advanced(env: dict[str, Any], guider: Any, sampler: str = "euler", seed: int = 5) -> tuple[dict, dict]:
    ctx = env["ctx"]
    sigmas = sg.BasicScheduler().run(ctx, model=env["ck"].unet, scheduler="normal", steps=STEPS, denoise=1.0)[
        0
    ]
    return SamplerCustomAdvanced().run(
        ctx,
        noise=RandomNoise().run(ctx, noise_seed=seed)[0],
        guider=guider,
        sampler=KSamplerSelect().run(ctx, sampler_name=sampler)[0],
        sigmas=sigmas,
        latent_image=env["latent"],
    )


def test_custom_advanced_with_cfg_guider_equals_ksampler(env: dict[str, Any]) -> None:
    ctx, unet = env["ctx"], env["ck"].unet
    guider = CFGGuider().run(ctx, model=unet, positive=env["pos"], negative=env["neg"], cfg=6.0)[0]
    out, denoised = _advanced(env, guider)
    assert torch.equal(out["samples"], _ksampler(env))
    torch.testing.assert_close(denoised["samples"], out["samples"], atol=1e-3, rtol=1e-4)  # last sigma is 0


def test_sampler_custom_without_noise_is_deterministic_and_differs(env: dict[str, Any]) -> None:
    ctx, unet = env["ctx"], env["ck"].unet
    sigmas = sg.KarrasScheduler().run(ctx, steps=STEPS, sigma_max=14.614642, sigma_min=0.0291675, rho=7.0)[0]
    args = dict(
        model=unet,
        noise_seed=1,
        cfg=6.0,
        positive=env["pos"],
        negative=env["neg"],
        sampler=KSamplerSelect().run(ctx, sampler_name="dpmpp_2m")[0],
        sigmas=sigmas,
        latent_image=env["latent"],
    )
    quiet = SamplerCustom().run(ctx, add_noise=False, **args)[0]["samples"]
    noisy = SamplerCustom().run(ctx, add_noise=True, **args)[0]["samples"]
    assert torch.isfinite(quiet).all() and not torch.allclose(quiet, noisy)
    assert DisableNoise().run(ctx)[0].generate(env["latent"]).abs().sum() == 0


def test_basic_and_dual_guiders_reduce_to_cfg(env: dict[str, Any]) -> None:
    ctx, unet = env["ctx"], env["ck"].unet
    basic = _advanced(env, BasicGuider().run(ctx, model=unet, conditioning=env["pos"])[0])[0]
    assert torch.equal(basic["samples"], _ksampler(env, cfg=1.0))
    dual = DualCFGGuider().run(
        ctx,
        model=unet,
        cond1=env["pos"],
        cond2=env["neg"],
        negative=env["pos"],
        cfg_conds=6.0,
        cfg_cond2_negative=1.0,
        style="regular",
    )[0]
    torch.testing.assert_close(_advanced(env, dual)[0]["samples"], _ksampler(env), atol=1e-3, rtol=1e-4)
    perp = PerpNegGuider().run(
        ctx,
        model=unet,
        positive=env["pos"],
        negative=env["neg"],
        empty_conditioning=env["neg"],
        cfg=6.0,
        neg_scale=1.0,
    )[0]
    assert torch.isfinite(_advanced(env, perp)[0]["samples"]).all()


def test_sampler_nodes_with_options(env: dict[str, Any]) -> None:
    ctx, unet = env["ctx"], env["ck"].unet
    guider = CFGGuider().run(ctx, model=unet, positive=env["pos"], negative=env["neg"], cfg=6.0)[0]
    sigmas = sg.BasicScheduler().run(ctx, model=unet, scheduler="karras", steps=STEPS, denoise=1.0)[0]
    outs = []
    for sampler in (
        SamplerEulerAncestral().run(ctx, eta=0.0, s_noise=1.0)[0],
        SamplerEulerAncestral().run(ctx, eta=1.0, s_noise=1.0)[0],
        SamplerDPMPP_2M_SDE().run(ctx, solver_type="heun", eta=1.0, s_noise=1.0, noise_device="cpu")[0],
    ):
        outs.append(
            SamplerCustomAdvanced().run(
                ctx,
                noise=RandomNoise().run(ctx, noise_seed=3)[0],
                guider=guider,
                sampler=sampler,
                sigmas=sigmas,
                latent_image=env["latent"],
            )[0]["samples"]
        )
    assert all(torch.isfinite(o).all() for o in outs)
    assert not torch.allclose(outs[0], outs[1])  # eta 0 is plain euler, eta 1 adds noise


def test_sigma_nodes(env: dict[str, Any]) -> None:
    ctx = env["ctx"]
    s = torch.tensor([10.0, 5.0, 2.0, 1.0, 0.0])
    high, low = sg.SplitSigmas().run(ctx, sigmas=s, step=2)
    assert high.tolist() == [10.0, 5.0, 2.0] and low.tolist() == [2.0, 1.0, 0.0]
    high, low = sg.SplitSigmasDenoise().run(ctx, sigmas=s, denoise=0.5)
    assert high.tolist() == [10.0, 5.0, 2.0] and low.tolist() == [2.0, 1.0, 0.0]  # as ComfyUI: sharing 2.0
    assert sg.FlipSigmas().run(ctx, sigmas=s)[0].tolist() == pytest.approx([0.0001, 1.0, 2.0, 5.0, 10.0])
    assert sg.SetFirstSigma().run(ctx, sigmas=s, sigma=20.0)[0][0] == 20.0 and s[0] == 10.0
    ext = sg.ExtendIntermediateSigmas().run(
        ctx, sigmas=s, steps=2, start_at_sigma=-1.0, end_at_sigma=4.0, spacing="linear"
    )[0]
    assert ext.tolist() == [10.0, 7.5, 5.0, 3.5, 2.0, 1.0, 0.0]
    assert sg.ManualSigmas().run(ctx, sigmas="3, 1.5 0")[0].tolist() == [3.0, 1.5, 0.0]
    ays = sg.AlignYourStepsScheduler().run(ctx, model_type="SD1", steps=10, denoise=1.0)[0]
    assert len(ays) == 11 and ays[-1] == 0 and abs(float(ays[0]) - 14.6146) < 1e-3
    assert (
        sg.BasicScheduler()
        .run(ctx, model=env["ck"].unet, scheduler="karras", steps=4, denoise=0.0)[0]
        .numel()
        == 0
    )


def test_stacked_jobs_equal_single_runs_in_one_call_per_step(env: dict[str, Any]) -> None:
    ctx, unet = env["ctx"], env["ck"].unet
    other = CLIPTextEncode().run(ctx, text="a red ball", clip=env["ck"].clip)[0]
    calls: list[int] = []
    with ctx.models.use(unet) as module:
        hook = module.register_forward_hook(lambda *_: calls.append(1))
    try:
        stacked = KSamplerBatched().run(
            ctx,
            model=[unet],
            seed=[5, 6],
            steps=[STEPS],
            cfg=[6.0],
            sampler_name=["euler"],
            scheduler=["normal"],
            positive=[env["pos"], other],
            negative=[env["neg"]],
            latent_image=[env["latent"]],
            denoise=[1.0],
        )[0]
    finally:
        hook.remove()
    assert len(calls) == STEPS
    torch.testing.assert_close(stacked[0]["samples"], _ksampler(env, seed=5), atol=2e-3, rtol=1e-3)
    torch.testing.assert_close(
        stacked[1]["samples"], _ksampler(env, seed=6, positive=other), atol=2e-3, rtol=1e-3
    )
    for sampler in ("euler_ancestral", "dpmpp_2m_sde"):  # per-step noise drawn per job, as alone
        batch = KSamplerBatched().run(
            ctx,
            model=[unet],
            seed=[5, 6],
            steps=[STEPS],
            cfg=[6.0],
            sampler_name=[sampler],
            scheduler=["karras"],
            positive=[env["pos"]],
            negative=[env["neg"]],
            latent_image=[env["latent"]],
            denoise=[1.0],
        )[0]
        for k, seed in enumerate((5, 6)):
            alone = _ksampler(env, seed=seed, sampler_name=sampler, scheduler="karras")
            torch.testing.assert_close(batch[k]["samples"], alone, atol=2e-3, rtol=1e-3)


def test_guidance_patches_change_guidance(env: dict[str, Any]) -> None:
    ctx, unet = env["ctx"], env["ck"].unet
    plain = _ksampler(env)
    neutral = [
        cp.EpsilonScaling().run(ctx, model=unet, scaling_factor=1.0)[0],
        cp.RescaleCFG().run(ctx, model=unet, multiplier=0.0)[0],
    ]
    for model in neutral:
        torch.testing.assert_close(
            _ksampler(env, model=model),
            plain,
            atol=2e-3,
            rtol=1e-3,
            msg=lambda m, model=model: f"{model.patches[-1].key}: {m}",
        )
    changed = [
        cp.RescaleCFG().run(ctx, model=unet, multiplier=0.7)[0],
        cp.CFGZeroStar().run(ctx, model=unet)[0],
        cp.CFGNorm().run(ctx, model=unet, strength=0.5)[0],
        cp.APG().run(ctx, model=unet, eta=0.0, norm_threshold=5.0, momentum=0.5)[0],
        cp.TCFG().run(ctx, model=unet)[0],
        cp.Mahiro().run(ctx, model=unet)[0],
        cp.FreSca().run(ctx, model=unet, scale_low=1.0, scale_high=1.25, freq_cutoff=2)[0],
        cp.PerpNeg().run(ctx, model=unet, empty_conditioning=_empty_prompt(env), neg_scale=1.0)[0],
        cp.TemporalScoreRescaling().run(ctx, model=unet, tsr_k=0.9, tsr_sigma=1.0)[0],
    ]
    for model in changed:
        out = _ksampler(env, model=model)
        assert torch.isfinite(out).all() and not torch.allclose(out, plain, atol=1e-3), model.patches[-1].key


def test_guidance_patches_reuse_the_loaded_unet(env: dict[str, Any]) -> None:
    """A CFG patch changes no weights: the memory manager keeps using the UNet already loaded
    (the patched handle's weight key is the plain one), while the sampling still differs."""
    ctx, unet = env["ctx"], env["ck"].unet
    plain = _ksampler(env)
    ctx.models.reset_run_stats()
    patched = cp.RescaleCFG().run(
        ctx, model=cp.CFGNorm().run(ctx, model=unet, strength=0.5)[0], multiplier=0.7
    )[0]
    assert patched.key == unet.key and patched != unet
    out = _ksampler(env, model=patched)
    assert [load["kind"] for load in ctx.models.stats()["loads"]] == []  # nothing read again
    assert not torch.allclose(out, plain, atol=1e-3)


def _empty_prompt(env: dict[str, Any]) -> list:
    return CLIPTextEncode().run(env["ctx"], text="", clip=env["ck"].clip)[0]


def test_differential_diffusion_uses_the_soft_mask(env: dict[str, Any]) -> None:
    ctx, unet = env["ctx"], env["ck"].unet
    start = {**env["latent"], "samples": _ksampler(env)}
    soft = {**start, "noise_mask": torch.linspace(0, 1, 64).repeat(1, 64, 1)}
    diff = cp.DifferentialDiffusion().run(ctx, model=unet, strength=1.0)[0]
    a = _ksampler(env, latent_image=soft, seed=9)
    b = _ksampler(env, model=diff, latent_image=soft, seed=9)
    assert torch.isfinite(b).all() and not torch.allclose(a, b)


def test_model_sampling_discrete(env: dict[str, Any]) -> None:
    ctx, unet = env["ctx"], env["ck"].unet
    eps = ModelSamplingDiscrete().run(ctx, model=unet, sampling="eps", zsnr=False)[0]
    assert torch.equal(_ksampler(env, model=eps), _ksampler(env))
    v = ModelSamplingDiscrete().run(ctx, model=unet, sampling="v_prediction", zsnr=True)[0]
    out = _ksampler(env, model=v)
    assert torch.isfinite(out).all() and not torch.allclose(out, _ksampler(env))


def test_area_feathering_follows_comfyui() -> None:
    """An area not touching the border is ramped over min(8, side // 4) cells on its inner edges."""
    cond = Cond(CondEntry(torch.zeros(1, 77, 8)), (8, 12, 4, 0), 0.5, None, None, None)
    item = _area_and_mult(cond, torch.zeros(1, 4, 16, 16), 1.0, 0, slice(0, 1))
    assert item is not None and item.x.shape == (1, 4, 8, 12)
    column = item.mult[0, 0, :, 8]
    assert column.tolist() == pytest.approx([0.25, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.25])
    assert item.mult[0, 0, 4, :].tolist()[-4:] == pytest.approx(
        [0.5, 0.5, 1 / 3, 1 / 6]
    )  # left edge at border


def test_latent_operation_on_the_guidance(env: dict[str, Any]) -> None:
    ctx, unet = env["ctx"], env["ck"].unet
    halve = cp.LatentApplyOperationCFG().run(ctx, model=unet, operation=lambda latent, **_: latent * 0.5)[0]
    identity = cp.LatentApplyOperationCFG().run(ctx, model=unet, operation=lambda latent, **_: latent)[0]
    torch.testing.assert_close(_ksampler(env, model=identity), _ksampler(env), atol=2e-3, rtol=1e-3)
    torch.testing.assert_close(_ksampler(env, model=halve), _ksampler(env, cfg=3.0), atol=2e-3, rtol=1e-3)
