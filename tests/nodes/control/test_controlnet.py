"""ControlNet (SD1.x core): the residuals of one UNet call equal diffusers' ControlNetModel fed to the
UNet as StableDiffusionControlNetPipeline does; strength 0 or an empty step range changes nothing;
stacked ControlNets add; a ControlNet of another family and control image batches; the old apply
node's control reaches the negative as in ComfyUI."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from nodes.control.controlnet import (
    BoundControl,
    Control,
    ControlNetApply,
    ControlNetApplyAdvanced,
    ControlNetLoader,
    fit_hint,
    open_controlnet,
)
from nodes.core.cond import CondEntry
from nodes.core.sampling_hooks import ConditioningError
from nodes.demo.models import demo_controlnet
from nodes.encode.conditioning import CLIPTextEncode
from nodes.families.components.unet import UNetDenoiser
from nodes.latent.vae import EmptyLatentImage
from nodes.load.handles import open_checkpoint
from nodes.sample.ksampler import KSampler

SIZE = 64


@pytest.fixture(scope="module")
def nets(tiny_models: dict, models_dir: Path) -> dict[str, Any]:
    folder = models_dir / "controlnet"
    folder.mkdir(exist_ok=True)
    out = {}
    for name, family, seed in (("cn_a", "sd15", 1), ("cn_b", "sd15", 2), ("cn_xl", "sdxl", 3)):
        cn = demo_controlnet(tiny_models[family].modules["unet"], seed)
        save_file(
            {k: v.contiguous() for k, v in cn.state_dict().items()}, str(folder / f"{name}.safetensors")
        )
        out[name] = cn
    out["cn_xl"].save_pretrained(
        folder / "cn_xl_folder"
    )  # a diffusers folder: config.json beside the weights
    return out


def _image(batch: int = 1, seed: int = 5) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(batch, SIZE, SIZE, 3, generator=g)


def _entry(embeds: torch.Tensor, control: Control | None, modules: dict[str, Any]) -> CondEntry:
    extras: dict[str, Any] = {
        "control_modules": modules,
        "percent_to_sigma": lambda p: 1e9 if p <= 0 else 0.0,
    }
    if control is not None:
        extras["control"] = control
    return CondEntry(embeds=embeds, extras=extras)


def test_config_from_file_builds_the_same_controlnet(nets: dict, models_dir: Path) -> None:
    handle = open_controlnet(models_dir / "controlnet" / "cn_a.safetensors")
    assert handle.kind == "controlnet" and handle.family == "sd15"
    built = handle.load()
    for (k, a), (k2, b) in zip(built.state_dict().items(), nets["cn_a"].state_dict().items(), strict=True):
        assert k == k2 and torch.equal(a, b)


def test_one_call_matches_diffusers_controlnet_pipeline_feeding(
    tiny_models: dict, nets: dict, models_dir: Path
) -> None:
    unet = tiny_models["sd15"].modules["unet"]
    handle = open_controlnet(models_dir / "controlnet" / "cn_a.safetensors")
    modules = {handle.key: handle.load()}
    image, batch = _image(), 2
    control = Control(handle, image, 0.7)
    g = torch.Generator().manual_seed(0)
    embeds = torch.randn(1, 77, 32, generator=g)
    x, t = torch.randn(batch, 4, SIZE // 8, SIZE // 8, generator=g), torch.tensor([500.0, 500.0])
    den = UNetDenoiser()
    kwargs = den.conditioning([_entry(embeds, control, modules)], batch, (SIZE, SIZE))
    kwargs["control"] = kwargs["control"].at(None)
    with torch.no_grad():
        ours = den.forward(unet, x, t, kwargs)
        hidden = embeds.expand(batch, -1, -1)
        hint = image.movedim(-1, 1).expand(batch, -1, -1, -1)
        down, mid = nets["cn_a"](
            x,
            t,
            encoder_hidden_states=hidden,
            controlnet_cond=hint,
            conditioning_scale=0.7,
            return_dict=False,
        )
        ref = unet(
            x,
            t,
            encoder_hidden_states=hidden,
            down_block_additional_residuals=down,
            mid_block_additional_residual=mid,
        ).sample
        plain = unet(x, t, encoder_hidden_states=hidden).sample
    assert (ours - ref).abs().max() < 1e-4
    assert (ours - plain).abs().max() > 1e-3  # the control does change the prediction


def test_stacked_controlnets_add_their_residuals(tiny_models: dict, nets: dict, models_dir: Path) -> None:
    unet = tiny_models["sd15"].modules["unet"]
    ha = open_controlnet(models_dir / "controlnet" / "cn_a.safetensors")
    hb = open_controlnet(models_dir / "controlnet" / "cn_b.safetensors")
    modules = {ha.key: ha.load(), hb.key: hb.load()}
    ia, ib = _image(seed=5), _image(seed=6)
    stacked = Control(hb, ib, 0.5, previous=Control(ha, ia, 1.0))
    g = torch.Generator().manual_seed(1)
    embeds = torch.randn(1, 77, 32, generator=g)
    x, t = torch.randn(1, 4, SIZE // 8, SIZE // 8, generator=g), torch.tensor([300.0])
    den = UNetDenoiser()
    kwargs = den.conditioning([_entry(embeds, stacked, modules)], 1, (SIZE, SIZE))
    kwargs["control"] = kwargs["control"].at(None)
    with torch.no_grad():
        ours = den.forward(unet, x, t, kwargs)
        da, ma = nets["cn_a"](
            x, t, encoder_hidden_states=embeds, controlnet_cond=ia.movedim(-1, 1), return_dict=False
        )
        db, mb = nets["cn_b"](
            x,
            t,
            encoder_hidden_states=embeds,
            controlnet_cond=ib.movedim(-1, 1),
            conditioning_scale=0.5,
            return_dict=False,
        )
        ref = unet(
            x,
            t,
            encoder_hidden_states=embeds,
            down_block_additional_residuals=[a + b for a, b in zip(da, db, strict=True)],
            mid_block_additional_residual=ma + mb,
        ).sample
    assert (ours - ref).abs().max() < 1e-4


def test_sigma_range_selects_the_active_controls(models_dir: Path, nets: dict) -> None:
    handle = open_controlnet(models_dir / "controlnet" / "cn_a.safetensors")
    late = Control(handle, _image(), 1.0, start_percent=0.5, end_percent=1.0)
    bound = BoundControl(((late,),), {handle.key: nets["cn_a"]}, lambda p: 10.0 * (1 - p), 1)
    x, kwargs = torch.zeros(1, 4, 8, 8), {"encoder_hidden_states": torch.zeros(1, 77, 32)}
    with torch.no_grad():
        assert bound.at(torch.tensor([8.0])).residuals(x, torch.tensor([900.0]), kwargs).unet_kwargs() == {}
        active = bound.at(torch.tensor([4.0])).residuals(x, torch.tensor([400.0]), kwargs)
    assert active.down is not None and active.mid is not None


# --- through the nodes ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def run_env(models_dir: Path, nets: dict, tmp_path_factory: pytest.TempPathFactory) -> Any:
    from engine.context import Folders, NodeContext
    from engine.folders import ModelFolders
    from engine.memory.manager import ModelManager

    work = tmp_path_factory.mktemp("cn_work")
    manager = ModelManager(ram_budget_bytes=2**30, prefetch=False)
    ctx = NodeContext(
        "1",
        "test",
        Folders(work / "in", work / "out", work / "tmp", model_files=ModelFolders(models_dir)),
        models=manager,
    )
    yield ctx
    manager.close()


def _generate(ctx: Any, ckpt: Path, apply: Any = None, batch: int = 1) -> torch.Tensor:
    ck = open_checkpoint(ckpt)
    enc = CLIPTextEncode()
    pos, neg = enc.run(ctx, text="a cat", clip=ck.clip)[0], enc.run(ctx, text="blurry", clip=ck.clip)[0]
    if apply is not None:
        pos, neg = apply(pos, neg)
    latent = EmptyLatentImage().run(ctx, width=SIZE, height=SIZE, batch_size=batch)[0]
    out = KSampler().run(
        ctx,
        model=ck.unet,
        seed=3,
        steps=3,
        cfg=5.0,
        sampler_name="euler",
        scheduler="normal",
        denoise=1.0,
        positive=pos,
        negative=neg,
        latent_image=latent,
    )[0]
    return out["samples"]


def _advanced(
    ctx: Any, name: str, image: torch.Tensor, strength: float, start: float = 0.0, end: float = 1.0
) -> Any:
    cn = ControlNetLoader().run(ctx, control_net_name=name)[0]

    def apply(pos: Any, neg: Any) -> Any:
        return ControlNetApplyAdvanced().run(
            ctx,
            positive=pos,
            negative=neg,
            control_net=cn,
            image=image,
            strength=strength,
            start_percent=start,
            end_percent=end,
        )

    return apply


def test_strength_zero_and_an_empty_range_equal_no_controlnet(run_env: Any, tiny_sd15_ckpt: Path) -> None:
    plain = _generate(run_env, tiny_sd15_ckpt)
    zero = _generate(run_env, tiny_sd15_ckpt, _advanced(run_env, "cn_a.safetensors", _image(), 0.0))
    never = _generate(
        run_env, tiny_sd15_ckpt, _advanced(run_env, "cn_a.safetensors", _image(), 1.0, 1.0, 1.0)
    )
    full = _generate(run_env, tiny_sd15_ckpt, _advanced(run_env, "cn_a.safetensors", _image(), 1.0))
    assert torch.equal(zero, plain) and torch.equal(never, plain)
    assert (full - plain).abs().max() > 1e-3


def test_apply_makes_new_entries_on_both_branches(run_env: Any, tiny_sd15_ckpt: Path) -> None:
    ck = open_checkpoint(tiny_sd15_ckpt)
    pos = CLIPTextEncode().run(run_env, text="a cat", clip=ck.clip)[0]
    before = dict(pos[0].extras)
    new_pos, new_neg = _advanced(run_env, "cn_a.safetensors", _image(), 0.8)(pos, pos)
    assert pos[0].extras == before and "control" not in pos[0].extras
    assert (
        new_pos[0].extras["control"] is new_neg[0].extras["control"]
    )  # shared: both branches batch together
    stacked = ControlNetApply().run(
        run_env,
        conditioning=new_pos,
        control_net=new_pos[0].extras["control"].handle,
        image=_image(),
        strength=0.5,
    )[0]
    assert stacked[0].extras["control"].previous is new_pos[0].extras["control"]


def test_controlnet_of_another_family_is_refused_naming_both(run_env: Any, tiny_sdxl_ckpt: Path) -> None:
    with pytest.raises(ConditioningError, match=r"cn_a\.safetensors.*sd15.*sdxl"):
        _generate(run_env, tiny_sdxl_ckpt, _advanced(run_env, "cn_a.safetensors", _image(), 1.0))


def test_control_image_batch_is_repeated_or_cut_to_the_latent_batch(
    run_env: Any, tiny_sd15_ckpt: Path
) -> None:
    images = _image(3)
    assert torch.equal(fit_hint(images, 2, (SIZE, SIZE)), images[:2].movedim(-1, 1))
    assert torch.equal(fit_hint(images[:2], 4, (SIZE, SIZE)), images[[0, 1, 0, 1]].movedim(-1, 1))
    assert fit_hint(images[:1], 3, (SIZE, SIZE)).shape == (3, 3, SIZE, SIZE)
    out = _generate(run_env, tiny_sd15_ckpt, _advanced(run_env, "cn_a.safetensors", images, 1.0), batch=2)
    assert out.shape[0] == 2 and torch.isfinite(out).all()


def test_hint_is_center_cropped_and_resized_nearest_exact() -> None:
    wide = torch.zeros(1, 32, 64, 3)
    wide[:, :, 16:48] = 1.0  # the middle square survives the center crop
    hint = fit_hint(wide, 1, (16, 16))
    assert hint.shape == (1, 3, 16, 16) and bool((hint == 1.0).all())


def test_original_ldm_layout_loads_the_same_controlnet(
    nets: dict, models_dir: Path, tiny_sd15_ckpt: Path
) -> None:
    """An original-layout file (``control_model.*``): the encoder half as the checkpoint writes the
    UNet's, the hint encoder and zero convolutions by position."""
    from safetensors.torch import load_file

    cn = nets["cn_a"]
    ckpt = load_file(str(tiny_sd15_ckpt))
    unet_prefix = "model.diffusion_model."
    ldm = {
        "control_model." + k.removeprefix(unet_prefix): v
        for k, v in ckpt.items()
        if k.startswith(unet_prefix)
        and k.removeprefix(unet_prefix).split(".")[0] in ("input_blocks", "middle_block", "time_embed")
    }
    sd = cn.state_dict()
    n_blocks = len(cn.controlnet_cond_embedding.blocks)
    for key, value in sd.items():
        parts = key.split(".")
        if key.startswith("controlnet_cond_embedding."):
            name = parts[1]
            index = (
                0
                if name == "conv_in"
                else 2 * (n_blocks + 1)
                if name == "conv_out"
                else 2 * (int(parts[2]) + 1)
            )
            ldm[f"control_model.input_hint_block.{index}.{parts[-1]}"] = value
        elif key.startswith("controlnet_down_blocks."):
            ldm[f"control_model.zero_convs.{parts[1]}.0.{parts[-1]}"] = value
        elif key.startswith("controlnet_mid_block."):
            ldm[f"control_model.middle_block_out.0.{parts[-1]}"] = value
    path = models_dir / "controlnet" / "cn_a_ldm.safetensors"
    save_file({k: v.contiguous() for k, v in ldm.items()}, str(path))
    built = open_controlnet(path).load()
    ours = built.state_dict()
    assert ours.keys() == sd.keys()
    assert all(torch.equal(ours[k], sd[k]) for k in sd)


def test_sdxl_call_matches_diffusers_with_pooled_and_size_ids(
    tiny_models: dict, nets: dict, models_dir: Path
) -> None:
    unet = tiny_models["sdxl"].modules["unet"]
    handle = open_controlnet(
        models_dir / "controlnet" / "cn_xl_folder" / "diffusion_pytorch_model.safetensors"
    )
    assert handle.family == "sdxl"
    modules = {handle.key: handle.load()}
    image = _image()
    g = torch.Generator().manual_seed(2)
    embeds, pooled = torch.randn(1, 77, 64, generator=g), torch.randn(1, 32, generator=g)
    entry = replace(_entry(embeds, Control(handle, image, 0.8), modules), pooled=pooled)
    x, t = torch.randn(1, 4, SIZE // 8, SIZE // 8, generator=g), torch.tensor([700.0])
    den = UNetDenoiser(size_ids=True)
    kwargs = den.conditioning([entry], 1, (SIZE, SIZE))
    kwargs["control"] = kwargs["control"].at(None)
    added = {
        "text_embeds": pooled,
        "time_ids": torch.tensor([[SIZE, SIZE, 0, 0, SIZE, SIZE]], dtype=torch.float32),
    }
    with torch.no_grad():
        ours = den.forward(unet, x, t, kwargs)
        down, mid = nets["cn_xl"](
            x,
            t,
            encoder_hidden_states=embeds,
            controlnet_cond=image.movedim(-1, 1),
            conditioning_scale=0.8,
            added_cond_kwargs=added,
            return_dict=False,
        )
        ref = unet(
            x,
            t,
            encoder_hidden_states=embeds,
            added_cond_kwargs=added,
            down_block_additional_residuals=down,
            mid_block_additional_residual=mid,
        ).sample
    assert (ours - ref).abs().max() < 1e-4


def test_files_that_are_not_full_controlnets_are_refused(models_dir: Path) -> None:
    from nodes.core.tensors import ModelLoadError

    folder = models_dir / "controlnet"
    save_file({"body.0.weight": torch.zeros(4, 4)}, str(folder / "not_a_controlnet.safetensors"))
    with pytest.raises(ModelLoadError, match="not a ControlNet"):
        open_controlnet(folder / "not_a_controlnet.safetensors")
    save_file(
        {"difference": torch.zeros(1), "control_model.zero_convs.0.0.weight": torch.zeros(4, 4, 1, 1)},
        str(folder / "diff_cn.safetensors"),
    )
    with pytest.raises(ModelLoadError, match="diff"):
        open_controlnet(folder / "diff_cn.safetensors")


def test_old_apply_goes_to_the_negative_too_when_it_has_no_control(
    run_env: Any, tiny_sd15_ckpt: Path
) -> None:
    """ComfyUI's ControlNetApply marks its entries ``control_apply_to_uncond``: at sampling the
    control is copied onto the negative's entries unless the negative has a control of its own."""
    cn = ControlNetLoader().run(run_env, control_net_name="cn_a.safetensors")[0]
    other = ControlNetLoader().run(run_env, control_net_name="cn_b.safetensors")[0]

    def old_apply(pos: Any, neg: Any) -> Any:
        return ControlNetApply().run(run_env, conditioning=pos, control_net=cn, image=_image(), strength=1.0)[
            0
        ], neg

    def old_apply_own_negative(pos: Any, neg: Any) -> Any:
        neg = ControlNetApply().run(
            run_env, conditioning=neg, control_net=other, image=_image(), strength=0.5
        )[0]
        return old_apply(pos, neg)[0], neg

    both = _generate(run_env, tiny_sd15_ckpt, _advanced(run_env, "cn_a.safetensors", _image(), 1.0))
    assert torch.equal(_generate(run_env, tiny_sd15_ckpt, old_apply), both)
    own = _generate(run_env, tiny_sd15_ckpt, old_apply_own_negative)
    assert (own - both).abs().max() > 1e-3  # the negative kept its own control


def test_controls_to_uncond_follows_comfyuis_rule() -> None:
    from nodes.control.controlnet import controls_to_uncond

    c1, c2 = object(), object()
    e = torch.zeros(1, 77, 32)
    pos = (
        CondEntry(e, extras={"control": c1, "control_apply_to_uncond": True}),
        CondEntry(e, extras={"control": c2, "control_apply_to_uncond": True}),
        CondEntry(e, area=(2, 2, 0, 0), extras={"control": object(), "control_apply_to_uncond": True}),
    )
    neg = (CondEntry(e), CondEntry(e, area=(2, 2, 0, 0)))
    out = dict(controls_to_uncond((("positive", pos), ("negative", neg))))
    assert out["positive"] == pos and out["negative"][0].extras["control"] is c2  # the later control replaces
    assert "control" not in out["negative"][1].extras  # area entries take none
    unmarked = tuple(CondEntry(e, extras={"control": c1}) for _ in range(2))
    assert dict(controls_to_uncond((("positive", unmarked), ("negative", neg))))["negative"] == neg
