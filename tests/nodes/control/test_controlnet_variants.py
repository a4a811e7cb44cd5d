"""Diff ControlNets (the model's UNet weights + the file's differences), union / ProMax SDXL
ControlNets with SetUnionControlNetType (ComfyUI's type list and semantics), the other apply
nodes (AliMama inpainting, "with VAE", CLIPTextEncodeControlnet) and the files Loom refuses."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from nodes.control.apply_variants import (
    CLIPTextEncodeControlnet,
    ControlNetApplySD3,
    ControlNetInpaintingAliMamaApply,
)
from nodes.control.controlnet import (
    Control,
    ControlNetApplyAdvanced,
    ControlNetLoader,
    DiffControlNetLoader,
    open_controlnet,
)
from nodes.control.controlnet_union import UNION_TYPES, SetUnionControlNetType, union_forward
from nodes.core.cond import CondEntry
from nodes.core.sampling_hooks import ConditioningError
from nodes.core.tensors import ModelLoadError
from nodes.demo.control import demo_union, diff_controlnet
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
    unet = tiny_models["sd15"].modules["unet"]
    out = {
        "cn": demo_controlnet(unet, 11),
        "union": demo_union(tiny_models["sdxl"].modules["unet"]),
        "union6": demo_union(tiny_models["sdxl"].modules["unet"], seed=4, types=6),
    }
    save_file(
        {k: v.contiguous() for k, v in diff_controlnet(out["cn"], unet).items()},
        str(folder / "v_diff.safetensors"),
    )
    save_file(
        {k: v.contiguous() for k, v in out["cn"].state_dict().items()}, str(folder / "v_full.safetensors")
    )
    out["union"].save_pretrained(folder / "v_union")
    save_file(
        {k: v.contiguous() for k, v in out["union6"].state_dict().items()},
        str(folder / "v_union6.safetensors"),
    )
    return out


@pytest.fixture(scope="module")
def run_env(models_dir: Path, nets: dict, tmp_path_factory: pytest.TempPathFactory) -> Any:
    from engine.context import Folders, NodeContext
    from engine.folders import ModelFolders
    from engine.memory.manager import ModelManager

    work = tmp_path_factory.mktemp("cnv_work")
    manager = ModelManager(ram_budget_bytes=2**30, prefetch=False)
    yield NodeContext(
        "1",
        "test",
        Folders(work / "in", work / "out", work / "tmp", model_files=ModelFolders(models_dir)),
        models=manager,
    )
    manager.close()


def _image(batch: int = 1, seed: int = 5) -> torch.Tensor:
    return torch.rand(batch, SIZE, SIZE, 3, generator=torch.Generator().manual_seed(seed))


def _prompts(ctx: Any, ckpt: Path) -> tuple[Any, Any, Any]:
    ck = open_checkpoint(ckpt)
    enc = CLIPTextEncode()
    return ck, enc.run(ctx, text="a cat", clip=ck.clip)[0], enc.run(ctx, text="blurry", clip=ck.clip)[0]


def _sample(ctx: Any, ck: Any, pos: Any, neg: Any) -> torch.Tensor:
    latent = EmptyLatentImage().run(ctx, width=SIZE, height=SIZE, batch_size=1)[0]
    return KSampler().run(
        ctx,
        model=ck.unet,
        seed=3,
        steps=2,
        cfg=5.0,
        sampler_name="euler",
        scheduler="normal",
        denoise=1.0,
        positive=pos,
        negative=neg,
        latent_image=latent,
    )[0]["samples"]


def _apply(ctx: Any, pos: Any, neg: Any, cn: Any, strength: float = 1.0) -> tuple[Any, Any]:
    return ControlNetApplyAdvanced().run(
        ctx,
        positive=pos,
        negative=neg,
        control_net=cn,
        image=_image(),
        strength=strength,
        start_percent=0.0,
        end_percent=1.0,
    )


# --- diff ControlNets ------------------------------------------------------------------------------
def test_diff_controlnet_is_the_models_unet_plus_the_difference(
    run_env: Any, nets: dict, tiny_sd15_ckpt: Path
) -> None:
    ck = open_checkpoint(tiny_sd15_ckpt)
    handle = DiffControlNetLoader().run(run_env, model=ck.unet, control_net_name="v_diff.safetensors")[0]
    assert handle.base is ck.unet and handle.family == "sd15"
    ours, want = handle.load().state_dict(), nets["cn"].state_dict()
    assert ours.keys() == want.keys()
    assert max(float((ours[k] - want[k]).abs().max()) for k in want) < 1e-5
    full = ControlNetLoader().run(run_env, control_net_name="v_full.safetensors")[0]
    assert handle.key != full.key  # a diff ControlNet's module depends on its model
    with_diff = _sample(run_env, ck, *_apply(run_env, *_prompts(run_env, tiny_sd15_ckpt)[1:], handle))
    with_full = _sample(run_env, ck, *_apply(run_env, *_prompts(run_env, tiny_sd15_ckpt)[1:], full))
    assert (with_diff - with_full).abs().max() < 1e-4


def test_diff_loader_takes_full_files_and_plain_loader_refuses_diff_files(
    run_env: Any, tiny_sd15_ckpt: Path, tiny_sdxl_ckpt: Path
) -> None:
    ck = open_checkpoint(tiny_sd15_ckpt)
    full = DiffControlNetLoader().run(run_env, model=ck.unet, control_net_name="v_full.safetensors")[0]
    assert (
        full.base is None
        and full.key == ControlNetLoader().run(run_env, control_net_name="v_full.safetensors")[0].key
    )
    with pytest.raises(ModelLoadError, match="DiffControlNetLoader"):
        ControlNetLoader().run(run_env, control_net_name="v_diff.safetensors")
    xl = open_checkpoint(tiny_sdxl_ckpt)
    with pytest.raises(ModelLoadError, match=r"v_diff\.safetensors.*sd15.*sdxl"):
        DiffControlNetLoader().run(run_env, model=xl.unet, control_net_name="v_diff.safetensors")


# --- union ControlNets -----------------------------------------------------------------------------
def test_union_config_is_read_from_the_tensors(nets: dict, models_dir: Path) -> None:
    single = open_controlnet(models_dir / "controlnet" / "v_union6.safetensors")
    folder = open_controlnet(models_dir / "controlnet" / "v_union" / "diffusion_pytorch_model.safetensors")
    assert single.union_types == 6 and folder.union_types == 8 and single.family == folder.family == "sdxl"
    built = single.load().state_dict()
    want = nets["union6"].state_dict()
    assert built.keys() == want.keys() and all(torch.equal(built[k], want[k]) for k in want)


def _union_call(module: Any, control_type: tuple[int, ...], rows: int = 1, strength: float = 0.8) -> Any:
    g = torch.Generator().manual_seed(1)
    x, hint = torch.randn(rows, 4, 8, 8, generator=g), torch.rand(rows, 3, SIZE, SIZE, generator=g)
    hidden, pooled = torch.randn(rows, 77, 64, generator=g), torch.randn(rows, 32, generator=g)
    added = {
        "text_embeds": pooled,
        "time_ids": torch.tensor([[SIZE, SIZE, 0, 0, SIZE, SIZE]] * rows, dtype=torch.float32),
    }
    t = torch.full((rows,), 400.0)
    with torch.no_grad():
        ours = union_forward(module, x, t, hint, control_type, strength, hidden, added)
    return ours, (x, t, hint, hidden, added)


def test_union_forward_equals_diffusers_where_their_semantics_agree(nets: dict) -> None:
    """diffusers' forward adds the UNet input's mean as a second token to the union transformer;
    ComfyUI's does not. With the attention's output projection zeroed the tokens cannot mix, and
    both must agree exactly."""
    module = copy.deepcopy(nets["union"])
    with torch.no_grad():
        for layer in module.transformer_layes:
            layer.attn.out_proj.weight.zero_()
            layer.attn.out_proj.bias.zero_()
    (down, mid), (x, t, hint, hidden, added) = _union_call(module, (3,))
    one_hot = torch.zeros(1, 8)
    one_hot[0, 3] = 1.0
    with torch.no_grad():
        ref_down, ref_mid = module(
            x,
            t,
            encoder_hidden_states=hidden,
            controlnet_cond=[hint],
            control_type=one_hot,
            control_type_idx=[3],
            conditioning_scale=0.8,
            added_cond_kwargs=added,
            return_dict=False,
        )
    assert max(float((a - b).abs().max()) for a, b in zip(down, ref_down, strict=True)) < 1e-5
    assert (mid - ref_mid).abs().max() < 1e-5


def test_union_rows_do_not_mix_and_the_type_matters(nets: dict) -> None:
    module = nets["union"]
    (down2, _), _ = _union_call(module, (3,), rows=2)
    (down1, _), _ = _union_call(module, (3,), rows=2)
    (auto, _), _ = _union_call(module, (), rows=2)
    (depth, _), _ = _union_call(module, (1,), rows=2)
    assert torch.equal(down2[0], down1[0])
    g = torch.Generator().manual_seed(
        1
    )  # row 0 alone gives row 0 of the batch (attention over each row's token)
    x, hint = torch.randn(2, 4, 8, 8, generator=g), torch.rand(2, 3, SIZE, SIZE, generator=g)
    hidden, pooled = torch.randn(2, 77, 64, generator=g), torch.randn(2, 32, generator=g)
    added = {
        "text_embeds": pooled[:1],
        "time_ids": torch.tensor([[SIZE, SIZE, 0, 0, SIZE, SIZE]], dtype=torch.float32),
    }
    with torch.no_grad():
        alone, _ = union_forward(
            module, x[:1], torch.full((1,), 400.0), hint[:1], (3,), 0.8, hidden[:1], added
        )
    assert (alone[0] - down2[0][:1]).abs().max() < 1e-5
    assert (auto[0] - down2[0]).abs().max() > 1e-4 and (depth[0] - down2[0]).abs().max() > 1e-4


def test_set_union_type_follows_comfyui_list(run_env: Any, models_dir: Path) -> None:
    assert list(UNION_TYPES) == [
        "openpose",
        "depth",
        "hed/pidi/scribble/ted",
        "canny/lineart/anime_lineart/mlsd",
        "normal",
        "segment",
        "tile",
        "repaint",
    ]
    assert SetUnionControlNetType.SCHEMA.inputs[1].options[0] == "auto"
    cn = ControlNetLoader().run(run_env, control_net_name="v_union/diffusion_pytorch_model.safetensors")[0]
    canny = SetUnionControlNetType().run(run_env, control_net=cn, type="canny/lineart/anime_lineart/mlsd")[0]
    auto = SetUnionControlNetType().run(run_env, control_net=canny, type="auto")[0]
    assert canny.control_type == (3,) and auto.control_type == () and cn.control_type == ()
    assert canny.key == cn.key  # the type is not part of the weights: one resident module
    six = ControlNetLoader().run(run_env, control_net_name="v_union6.safetensors")[0]
    with pytest.raises(ValueError, match=r"6 control types.*'repaint' is number 7"):
        SetUnionControlNetType().run(run_env, control_net=six, type="repaint")


def test_union_controlnet_samples_on_sdxl_and_is_refused_on_sd15(
    run_env: Any, tiny_sdxl_ckpt: Path, tiny_sd15_ckpt: Path
) -> None:
    cn = ControlNetLoader().run(run_env, control_net_name="v_union/diffusion_pytorch_model.safetensors")[0]
    typed = SetUnionControlNetType().run(run_env, control_net=cn, type="depth")[0]
    ck, pos, neg = _prompts(run_env, tiny_sdxl_ckpt)
    plain = _sample(run_env, ck, pos, neg)
    assert (_sample(run_env, ck, *_apply(run_env, pos, neg, typed)) - plain).abs().max() > 1e-3
    ck15, pos15, neg15 = _prompts(run_env, tiny_sd15_ckpt)
    with pytest.raises(ConditioningError, match=r"v_union.*sdxl.*sd15"):
        _sample(run_env, ck15, *_apply(run_env, pos15, neg15, typed))


# --- the other apply nodes and refused files --------------------------------------------------------
def test_alimama_and_with_vae_apply_as_apply_controlnet_for_pixel_controlnets(
    run_env: Any, tiny_sd15_ckpt: Path
) -> None:
    cn = ControlNetLoader().run(run_env, control_net_name="v_full.safetensors")[0]
    _, pos, neg = _prompts(run_env, tiny_sd15_ckpt)
    image, mask = _image(), torch.ones(1, SIZE, SIZE)
    common = {
        "positive": pos,
        "negative": neg,
        "control_net": cn,
        "vae": None,
        "image": image,
        "strength": 0.6,
        "start_percent": 0.1,
        "end_percent": 0.9,
    }
    for out in (
        ControlNetApplySD3().run(run_env, **common),
        ControlNetInpaintingAliMamaApply().run(run_env, mask=mask, **common),
    ):
        c = out[0][0].extras["control"]
        assert (c.handle, c.strength, c.start_percent, c.end_percent) == (
            cn,
            0.6,
            0.1,
            0.9,
        ) and c.image is image
        assert out[1][0].extras["control"] is c
    names = [i.name for i in ControlNetInpaintingAliMamaApply.SCHEMA.inputs]
    assert names == [
        "positive",
        "negative",
        "control_net",
        "vae",
        "image",
        "mask",
        "strength",
        "start_percent",
        "end_percent",
    ]
    assert [i.name for i in ControlNetApplySD3.SCHEMA.inputs] == [n for n in names if n != "mask"]


def test_controlnet_prompt_replaces_the_controlnets_cross_attention_only(
    run_env: Any, nets: dict, tiny_models: dict, tiny_sd15_ckpt: Path, models_dir: Path
) -> None:
    ck, pos, _ = _prompts(run_env, tiny_sd15_ckpt)
    out = CLIPTextEncodeControlnet().run(run_env, clip=ck.clip, conditioning=pos, text="a dog")[0]
    other = CLIPTextEncode().run(run_env, text="a dog", clip=ck.clip)[0][0]
    assert torch.equal(out[0].extras["cross_attn_controlnet"], other.embeds) and torch.equal(
        out[0].embeds, pos[0].embeds
    )
    handle = open_controlnet(models_dir / "controlnet" / "v_full.safetensors")
    modules = {handle.key: nets["cn"]}
    extras = {
        "control_modules": modules,
        "percent_to_sigma": lambda p: 0.0,
        "control": Control(handle, _image(), 1.0),
        "cross_attn_controlnet": other.embeds,
    }
    den, unet = UNetDenoiser(), tiny_models["sd15"].modules["unet"]
    x, t = torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(3)), torch.tensor([500.0])
    kwargs = den.conditioning([CondEntry(embeds=pos[0].embeds, extras=extras)], 1, (SIZE, SIZE))
    kwargs["control"] = kwargs["control"].at(None)
    with torch.no_grad():
        ours = den.forward(unet, x, t, kwargs)
        down, mid = nets["cn"](
            x,
            t,
            encoder_hidden_states=other.embeds,
            controlnet_cond=_image().movedim(-1, 1),
            return_dict=False,
        )
        ref = unet(
            x,
            t,
            encoder_hidden_states=pos[0].embeds,
            down_block_additional_residuals=down,
            mid_block_additional_residual=mid,
        ).sample
    assert (ours - ref).abs().max() < 1e-4
    extras["cross_attn_controlnet"] = torch.zeros(1, 77, 64)  # an SDXL-wide prompt for an SD1.5 ControlNet
    kwargs = den.conditioning([CondEntry(embeds=pos[0].embeds, extras=extras)], 1, (SIZE, SIZE))
    with pytest.raises(ConditioningError, match="64-wide embeddings but the conditioning has 32"):
        den.forward(unet, x, t, {**kwargs, "control": kwargs["control"].at(None)})


def test_shuffle_controlnets_average_their_residuals_over_the_image(nets: dict, models_dir: Path) -> None:
    path = models_dir / "controlnet" / "v_full_shuffle_fp16.safetensors"
    save_file({k: v.contiguous() for k, v in nets["cn"].state_dict().items()}, str(path))
    handle = open_controlnet(path)
    assert handle.config["global_pool_conditions"] is True
    g = torch.Generator().manual_seed(2)
    x, hidden = torch.randn(1, 4, 8, 8, generator=g), torch.randn(1, 77, 32, generator=g)
    with torch.no_grad():
        res = handle.residuals(
            handle.load(), x, torch.tensor([300.0]), _image(), 1, 1.0, {"encoder_hidden_states": hidden}
        )
        down, _ = nets["cn"](
            x,
            torch.tensor([300.0]),
            encoder_hidden_states=hidden,
            controlnet_cond=_image().movedim(-1, 1),
            return_dict=False,
        )
    assert res.down is not None and all(r.shape[-2:] == (1, 1) for r in res.down)
    assert (
        max(
            float((r - d.mean(dim=(2, 3), keepdim=True)).abs().max())
            for r, d in zip(res.down, down, strict=True)
        )
        < 1e-5
    )


def test_dit_files_in_no_known_layout_are_refused_saying_what_is_missing(models_dir: Path) -> None:
    (models_dir / "controlnet").mkdir(parents=True, exist_ok=True)
    path = models_dir / "controlnet" / "flux_union.safetensors"
    save_file(
        {"controlnet_blocks.0.weight": torch.zeros(4, 4), "controlnet_x_embedder.weight": torch.zeros(4, 64)},
        str(path),
    )
    with pytest.raises(ModelLoadError, match=r"flux_instantx ControlNet but has no 'x_embedder.weight'"):
        open_controlnet(path)
    odd = models_dir / "controlnet" / "odd_dit.safetensors"
    save_file({"single_blocks.0.linear1.weight": torch.zeros(4, 4)}, str(odd))
    with pytest.raises(
        ModelLoadError, match=r"transformer \(DiT\) tensors .* no ControlNet layout Loom knows"
    ):
        open_controlnet(odd)
    lora = models_dir / "controlnet" / "control_lora.safetensors"
    save_file(
        {"lora_controlnet": torch.zeros(1), "input_hint_block.0.weight": torch.zeros(16, 3, 3, 3)}, str(lora)
    )
    with pytest.raises(ModelLoadError, match="Control-LoRA"):
        open_controlnet(lora)
