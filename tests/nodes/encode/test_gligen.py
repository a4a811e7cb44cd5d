"""GLIGENLoader and GLIGENTextBoxApply on the tiny SD1.5 checkpoint: closed gates give the unpatched
result bit for bit; the grounding tokens and a fuser equal a direct re-implementation of ComfyUI's
formulas on fixed tensors; boxes change the positive branch only and leave the plain conditioning
alone; boxes chain; SDXL models, wrong phrase widths and files that are not GLIGEN get teaching
errors; a workflow runs through the executor."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from nodes.core.tensors import ModelLoadError
from nodes.demo.attention_patches import gligen_tensors
from nodes.encode.conditioning import CLIPTextEncode
from nodes.encode.gligen import GligenBoxes, GLIGENLoader, GLIGENTextBoxApply, load_gligen
from nodes.latent.vae import EmptyLatentImage
from nodes.load.handles import open_checkpoint
from nodes.sample.ksampler import KSampler
from tests.nodes.patches.test_hypernetwork import sample_and_save
from tests.nodes.test_generation_e2e import make_executor, run


@pytest.fixture(scope="module")
def sd15(tiny_sd15_ckpt: Any) -> Any:
    return open_checkpoint(tiny_sd15_ckpt)


@pytest.fixture()
def env(sd15: Any, make_ctx: Any, models_dir: Path) -> dict[str, Any]:
    torch.set_num_threads(1)
    folder = models_dir / "gligen"
    folder.mkdir(exist_ok=True)
    unet, width = sd15.unet.load(), int(sd15.clip.load()["clip_l"].config.hidden_size)
    for name, gate in (("open.safetensors", 0.6), ("closed.safetensors", 0.0)):
        if not (folder / name).is_file():
            save_file(gligen_tensors(unet, width, gate=gate), str(folder / name))
    ctx = make_ctx()
    enc = CLIPTextEncode()
    return {
        "ctx": ctx,
        "ck": sd15,
        "models": models_dir,
        "unet": unet,
        "pos": enc.run(ctx, text="a cat and a dog", clip=sd15.clip)[0],
        "neg": enc.run(ctx, text="blurry", clip=sd15.clip)[0],
        "latent": EmptyLatentImage().run(ctx, width=64, height=64, batch_size=1)[0],
    }


def _sample(env: dict[str, Any], positive: Any = None, model: Any = None) -> torch.Tensor:
    return KSampler().run(
        env["ctx"],
        model=model or env["ck"].unet,
        seed=3,
        steps=2,
        cfg=6.0,
        sampler_name="euler",
        scheduler="normal",
        positive=positive or env["pos"],
        negative=env["neg"],
        latent_image=env["latent"],
        denoise=1.0,
    )[0]["samples"]


def _boxes(env: dict[str, Any], name: str, cond: Any = None, clip: Any = None, **box: int) -> Any:
    gligen = GLIGENLoader().run(env["ctx"], gligen_name=name)[0]
    kw = {"width": 32, "height": 24, "x": 8, "y": 16, **box}
    return GLIGENTextBoxApply().run(
        env["ctx"],
        conditioning_to=cond or env["pos"],
        clip=clip or env["ck"].clip,
        gligen_textbox_model=gligen,
        text="a cat",
        **kw,
    )[0]


def test_closed_gates_give_the_unpatched_result(env: dict[str, Any]) -> None:
    from nodes.encode.gligen import with_middle_patch

    denoiser, unet = env["ck"].unet.denoiser, env["unet"]
    boxed = _boxes(env, "closed.safetensors")
    x = torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        plain = denoiser.forward(
            unet, x, torch.tensor([10, 10]), denoiser.conditioning(env["pos"], 2, (64, 64))
        )
        kwargs = denoiser.conditioning(boxed, 2, (64, 64))
        assert (
            isinstance(kwargs["gligen"], GligenBoxes)
            and with_middle_patch(None, kwargs["gligen"], x)["patches"]
        )
        assert torch.equal(denoiser.forward(unet, x, torch.tensor([10, 10]), kwargs), plain)
    # sampled, the boxed positive runs apart from the negative (as in ComfyUI, whose patched conds do
    # not batch with unpatched ones), so only the batch size's rounding differs
    torch.testing.assert_close(_sample(env, boxed), _sample(env), rtol=1e-5, atol=1e-3)


def test_boxes_change_the_result_and_leave_the_plain_conditioning_alone(env: dict[str, Any]) -> None:
    plain = _sample(env)
    boxed = _boxes(env, "open.safetensors")
    out = _sample(env, boxed)
    assert torch.isfinite(out).all() and not torch.allclose(out, plain, atol=1e-4)
    assert "gligen" not in env["pos"][0].extras and torch.equal(_sample(env), plain)
    assert torch.equal(_sample(env, boxed), out)
    moved = _sample(env, _boxes(env, "open.safetensors", x=32, y=0))
    assert not torch.allclose(moved, out, atol=1e-5)


def test_boxes_chain_in_order(env: dict[str, Any]) -> None:
    one = _boxes(env, "open.safetensors")
    two = _boxes(env, "open.safetensors", cond=one, width=16, height=16, x=40, y=40)
    boxes = two[0].extras["gligen"].boxes
    assert isinstance(two[0].extras["gligen"], GligenBoxes) and len(boxes) == 2
    assert [b[1:] for b in boxes] == [
        (3, 4, 2, 1),
        (2, 2, 5, 5),
    ]  # (h, w, y, x) in latent cells, as ComfyUI's // 8


def _comfy_fuser(
    sd: dict[str, torch.Tensor], x: torch.Tensor, objs: torch.Tensor, heads: int
) -> torch.Tensor:
    """ComfyUI's GatedSelfAttentionDense written out on the state dict, as the reference."""

    def lin(name: str, t: torch.Tensor, bias: bool = True) -> torch.Tensor:
        return torch.nn.functional.linear(t, sd[f"{name}.weight"], sd[f"{name}.bias"] if bias else None)

    def norm(name: str, t: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.layer_norm(t, t.shape[-1:], sd[f"{name}.weight"], sd[f"{name}.bias"])

    n = x.shape[1]
    h = norm("norm1", torch.cat([x, lin("linear", objs)], 1))
    q, k, v = (lin(f"attn.to_{p}", h, bias=False) for p in "qkv")
    b, t, d = q.shape
    q, k, v = (m.reshape(b, t, heads, d // heads).transpose(1, 2) for m in (q, k, v))
    w = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d // heads), dim=-1)
    a = lin("attn.to_out.0", (w @ v).transpose(1, 2).reshape(b, t, d))[:, :n]
    x = x + torch.tanh(sd["alpha_attn"]) * a
    f, g = lin("ff.net.0.proj", norm("norm2", x)).chunk(2, dim=-1)
    return x + torch.tanh(sd["alpha_dense"]) * lin("ff.net.2", f * torch.nn.functional.gelu(g))


def test_tokens_and_fusers_equal_comfyuis_formulas(env: dict[str, Any]) -> None:
    path = env["models"] / "gligen" / "open.safetensors"
    model = load_gligen(path)
    from safetensors.torch import load_file

    sd = load_file(str(path))
    gen = torch.Generator().manual_seed(1)
    phrase = torch.randn(1, model.key_dim, generator=gen)
    objs = model.tokens(2, 8, 8, [(phrase, 3, 4, 2, 1)])
    # ComfyUI: box (x1, y1, x2, y2) = (x/w, y/h, (x+w)/w, (y+h)/h), Fourier sin/cos per frequency, 29 null slots
    box = torch.tensor([1 / 8, 2 / 8, 5 / 8, 5 / 8])
    bands = 100 ** (torch.arange(8) / 8)
    xyxy = torch.cat([f(b * box) for b in bands for f in (torch.sin, torch.cos)])
    pos = {k.removeprefix("position_net."): v for k, v in sd.items() if k.startswith("position_net.")}
    rows = [torch.cat([phrase[0], xyxy])] + [
        torch.cat([pos["null_positive_feature"], pos["null_position_feature"]])
    ] * 29
    h = torch.stack(rows)
    for i in (0, 2):
        h = torch.nn.functional.silu(
            torch.nn.functional.linear(h, pos[f"linears.{i}.weight"], pos[f"linears.{i}.bias"])
        )
    ref = torch.nn.functional.linear(h, pos["linears.4.weight"], pos["linears.4.bias"])
    assert objs.shape == (2, 30, model.key_dim)
    torch.testing.assert_close(objs[1], ref, rtol=0, atol=1e-5)
    prefix = next(k for k in sd if ".fuser." in k).split(".fuser.")[0] + ".fuser."
    fsd = {k.removeprefix(prefix): v for k, v in sd.items() if k.startswith(prefix)}
    x = torch.randn(2, 64, model.widths[0], generator=gen)
    with torch.no_grad():
        out = model.fusers[0](x, objs)
    torch.testing.assert_close(out, _comfy_fuser(fsd, x, objs, heads=1), rtol=0, atol=1e-5)


def test_middle_patch_runs_after_the_self_attention_residual(env: dict[str, Any]) -> None:
    from nodes.families.components.unet_patching import run_patched, transformer_places

    unet = env["unet"]
    x = torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(2))
    kwargs = {"encoder_hidden_states": env["pos"][0].embeds}
    seen: list[int] = []

    def patch(h: torch.Tensor, extra: dict[str, Any]) -> torch.Tensor:
        seen.append(extra["transformer_index"])
        return h

    with torch.no_grad():
        plain = unet(x, torch.tensor([10]), return_dict=False, **kwargs)[0]
        same = run_patched(unet, x, torch.tensor([10]), kwargs, {"patches": {"middle_patch": [patch]}})
    assert seen == list(range(len(load_gligen(env["models"] / "gligen" / "open.safetensors").widths)))
    torch.testing.assert_close(same, plain, rtol=0, atol=1e-6)
    blocks = [tb for _, t in transformer_places(unet) for tb in t.transformer_blocks]
    assert all(
        not tb.norm1._forward_pre_hooks and not tb.attn1._forward_hooks for tb in blocks
    )  # hooks removed


def test_sdxl_and_wrong_files_get_teaching_errors(env: dict[str, Any], tiny_sdxl_ckpt: Path) -> None:
    xl = open_checkpoint(tiny_sdxl_ckpt)
    narrow = load_gligen(env["models"] / "gligen" / "open.safetensors")
    with pytest.raises(
        ValueError,
        match="pooled CLIP output is 32 wide.*needs 768.*checkpoint family this GLIGEN file was made for",
    ):
        GLIGENTextBoxApply().run(
            env["ctx"],
            conditioning_to=env["pos"],
            clip=env["ck"].clip,
            gligen_textbox_model=replace(narrow, key_dim=768),
            text="a cat",
            width=8,
            height=8,
            x=0,
            y=0,
        )
    boxed = _boxes(env, "open.safetensors")
    with pytest.raises(
        ValueError,
        match="GLIGEN boxes from open.safetensors, made for a UNet.*of the family this GLIGEN file was made for",
    ):
        KSampler().run(
            env["ctx"],
            model=xl.unet,
            seed=3,
            steps=1,
            cfg=6.0,
            sampler_name="euler",
            scheduler="normal",
            positive=[boxed[0]],
            negative=env["neg"],
            latent_image=env["latent"],
            denoise=1.0,
        )
    save_file(
        {"lora_unet_x.lora_up.weight": torch.zeros(2, 2)}, str(env["models"] / "gligen" / "lora.safetensors")
    )
    with pytest.raises(ModelLoadError, match="this is not a GLIGEN model.*models/gligen"):
        GLIGENLoader().run(env["ctx"], gligen_name="lora.safetensors")


def test_workflow_runs_end_to_end(env: dict[str, Any], tmp_path: Path) -> None:
    prompt: dict[str, Any] = {
        "1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "tiny_sd15.safetensors"}},
        "2": {"class_type": "GLIGENLoader", "inputs": {"gligen_name": "open.safetensors"}},
        "3": {"class_type": "CLIPTextEncode", "inputs": {"text": "a cat and a dog", "clip": ["1", 1]}},
        "8": {
            "class_type": "GLIGENTextBoxApply",
            "inputs": {
                "conditioning_to": ["3", 0],
                "clip": ["1", 1],
                "gligen_textbox_model": ["2", 0],
                "text": "a cat",
                "width": 32,
                "height": 32,
                "x": 0,
                "y": 0,
            },
        },
        "9": {
            "class_type": "GLIGENTextBoxApply",
            "inputs": {
                "conditioning_to": ["8", 0],
                "clip": ["1", 1],
                "gligen_textbox_model": ["2", 0],
                "text": "a dog",
                "width": 32,
                "height": 32,
                "x": 32,
                "y": 32,
            },
        },
        **sample_and_save(["1", 0], ["9", 0], ["3", 0]),
    }
    result = run(make_executor(env["models"], tmp_path), prompt)
    assert result.status == "success", (result.node_errors, result.error)
    assert len(result.outputs["7"]["images"]) == 1


def test_schemas_are_comfyuis() -> None:
    assert [(i.name, i.type) for i in GLIGENLoader.SCHEMA.inputs] == [("gligen_name", "COMBO")]
    assert [o.type for o in GLIGENLoader.SCHEMA.outputs] == ["GLIGEN"]
    schema = GLIGENTextBoxApply.SCHEMA
    assert [(i.name, i.type, i.default, i.min, i.max, i.step) for i in schema.inputs] == [
        ("conditioning_to", "CONDITIONING", None, None, None, None),
        ("clip", "CLIP", None, None, None, None),
        ("gligen_textbox_model", "GLIGEN", None, None, None, None),
        ("text", "STRING", None, None, None, None),
        ("width", "INT", 64, 8, 16384, 8),
        ("height", "INT", 64, 8, 16384, 8),
        ("x", "INT", 0, 0, 16384, 8),
        ("y", "INT", 0, 0, 16384, 8),
    ]
    assert schema.category == "conditioning/gligen" and [o.type for o in schema.outputs] == ["CONDITIONING"]


def test_flux_refuses_gligen_boxes(env: dict[str, Any], flux_demo: Path) -> None:
    from nodes.demo.flux import DEMO_CLIP_L, DEMO_FLUX_DEV, DEMO_T5XXL
    from nodes.load.handles import open_diffusion_model, open_text_encoders

    clip = open_text_encoders(
        [flux_demo / "text_encoders" / DEMO_T5XXL, flux_demo / "text_encoders" / DEMO_CLIP_L], "flux"
    )
    pos = CLIPTextEncode().run(env["ctx"], text="a cat", clip=clip)[0]
    boxes = _boxes(env, "open.safetensors")[0].extras["gligen"]
    boxed = [replace(pos[0], extras={**pos[0].extras, "gligen": boxes})]
    flux = open_diffusion_model(flux_demo / "diffusion_models" / DEMO_FLUX_DEV)
    with pytest.raises(ValueError, match="positive conditioning has GLIGEN boxes .*this MODEL is Flux"):
        KSampler().run(
            env["ctx"],
            model=flux,
            seed=3,
            steps=1,
            cfg=1.0,
            sampler_name="euler",
            scheduler="normal",
            positive=boxed,
            negative=pos,
            latent_image={"samples": torch.zeros(1, 16, 8, 8)},
            denoise=1.0,
        )
