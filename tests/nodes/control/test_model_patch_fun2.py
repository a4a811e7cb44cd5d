"""ZImageFunControlnet with alibaba-pai's Fun ControlNet 2.0/2.1 layout (inpainting inputs, control
refiner blocks) on the tiny Z-Image demo: the file's tensors are the built module's; one model call
equals the documented maths written out here with standard forward hooks on the plain model (the
33-channel control input: control latent, kept-region mask channel, latent of the masked inpaint
image; refiner hints after the noise refiner blocks, from the tokens entering it; control layers
from the stream the refiner stage left and the tokens entering the first main block), for a control
image with an inpaint image and mask, an inpaint image alone and a control image alone; strength 0
samples exactly the unpatched image; missing images and mismatched masks are refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from nodes.control.model_patch import ModelPatchError, ModelPatchLoader, ZImageFunControlnet
from nodes.demo.model_patch import DEMO_FUN_CONTROL, DEMO_FUN_CONTROL_21, make_model_patch_demo
from nodes.encode.conditioning import CLIPTextEncode
from tests.nodes.control.test_model_patch_control import (
    SIZE,
    _image,
    _patched_call,
    _sample,
    _zimage,
    fun_maths,
    hooked_and_plain,
)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from nodes.demo.zimage import make_zimage_demo

    torch.set_num_threads(1)
    path = tmp_path_factory.mktemp("fun2")
    make_zimage_demo(path)
    make_model_patch_demo(path)
    return path


@pytest.fixture()
def ctx(root: Path, manager: Any, tmp_path: Path) -> Any:
    from engine.context import Folders, NodeContext
    from engine.folders import ModelFolders

    folders = Folders(tmp_path / "in", tmp_path / "out", tmp_path / "tmp", model_files=ModelFolders(root))
    folders.ensure()
    return NodeContext(node_id="7", prompt_id="test", folders=folders, models=manager)


def test_2_1_file_tensors_are_the_built_modules(root: Path, ctx: Any) -> None:
    handle = ModelPatchLoader().run(ctx, name=DEMO_FUN_CONTROL_21)[0]
    state = handle.load().state_dict()
    tensors = load_file(str(root / "model_patches" / DEMO_FUN_CONTROL_21))
    assert {k.replace(".block.", "."): v for k, v in state.items()}.keys() == tensors.keys()
    assert all(torch.equal(state[k], tensors[k.replace(".block.", ".")]) for k in state)
    config = dict(handle.config)
    assert (config["extra"], config["refiner_control"], config["broken"]) == (17, True, False)
    assert tensors["control_all_x_embedder.2-1.weight"].shape[1] == 4 * 33


def _latent(vae_module: Any, latent_format: Any, pixels: torch.Tensor) -> torch.Tensor:
    encoded = vae_module.encode(pixels.movedim(-1, 1) * 2 - 1, return_dict=False)[0].mode()
    return latent_format.process_in(encoded)


def _control(
    tensors: dict[str, torch.Tensor], vae_module: Any, latent_format: Any, image: Any, inpaint: Any, mask: Any
) -> torch.Tensor:
    """The embedded control tokens (1, n, 64): ComfyUI's 33-channel input, written out."""
    grey = torch.full((1, SIZE, SIZE, 3), 0.5)
    inpaint = grey if inpaint is None else inpaint
    if mask is not None:
        keep = (1.0 - mask).reshape(1, SIZE, SIZE, 1)
        inpaint = (inpaint - 0.5) * keep.round() + 0.5
    inpainted = _latent(vae_module, latent_format, inpaint)
    h, w = inpainted.shape[-2:]
    channel = (
        torch.zeros(1, 1, h, w)
        if mask is None
        else F.interpolate((1.0 - mask).reshape(1, 1, SIZE, SIZE), size=(h, w), mode="nearest")
    )
    control = _latent(vae_module, latent_format, grey if image is None else image)
    latent = torch.cat([control, channel, inpainted], dim=1)
    c = latent.shape[1]  # 2×2 patches, patch-major and channel last
    cells = [latent[:, :, r::2, s::2] for r in range(2) for s in range(2)]
    tokens = torch.stack(cells, dim=-1).permute(0, 2, 3, 4, 1).reshape(1, (h // 2) * (w // 2), 4 * c)
    return F.linear(
        tokens, tensors["control_all_x_embedder.2-1.weight"], tensors["control_all_x_embedder.2-1.bias"]
    )


def _mask() -> torch.Tensor:
    mask = torch.zeros(1, SIZE, SIZE)
    mask[:, SIZE // 4 : SIZE // 2, :] = 1.0
    return mask


@pytest.mark.parametrize("inputs", ["image+inpaint+mask", "inpaint+mask", "image"])
def test_2_1_model_call_is_the_documented_maths(root: Path, ctx: Any, inputs: str) -> None:
    model, clip, vae = _zimage(root, ctx)
    pos = CLIPTextEncode().run(ctx, text="a cat", clip=clip)[0]
    patch = ModelPatchLoader().run(ctx, name=DEMO_FUN_CONTROL_21)[0]
    strength = 0.8
    image = _image() if "image" in inputs.split("+") else None
    inpaint = _image(seed=8) if "inpaint" in inputs else None
    mask = _mask() if "mask" in inputs else None
    patched = ZImageFunControlnet().run(
        ctx,
        model=model,
        model_patch=patch,
        vae=vae,
        strength=strength,
        image=image,
        inpaint_image=inpaint,
        mask=mask,
    )[0]
    tensors = load_file(str(root / "model_patches" / DEMO_FUN_CONTROL_21))
    module, vae_module, denoiser, x, t, kwargs, got = _patched_call(model, vae, patch, patched, pos)
    with torch.no_grad():
        block, linear = fun_maths(tensors)
        control = _control(tensors, vae_module, model.latent_format, image, inpaint, mask).expand(2, -1, -1)
        n = control.shape[1]
        state: dict[str, Any] = {}

        def refiner_in(layer: Any, args: Any, kw: Any) -> None:  # the tokens entering the noise refiner
            stream, _, freqs, adaln = args[:4]
            c = linear("control_noise_refiner.0.before_proj", control) + stream[:, :n]
            c = block("control_noise_refiner.0.")(c, None, freqs[:, :n], adaln)
            state["refiner_hint"], state["c"] = linear("control_noise_refiner.0.after_proj", c), c

        def refiner_out(layer: Any, args: Any, kw: Any, out: torch.Tensor) -> torch.Tensor:
            out = out.clone()
            out[:, :n] += strength * state["refiner_hint"]
            return out

        def main_in(layer: Any, args: Any, kw: Any) -> None:  # the tokens entering the first main block
            stream, _, freqs, adaln = args[:4]
            c = linear("control_layers.0.before_proj", state["c"]) + stream[:, :n]
            state["hints"] = []
            for i in range(2):  # 2 main blocks, 2 control layers: a hint after every block
                c = block(f"control_layers.{i}.")(c, None, freqs[:, :n], adaln)
                state["hints"].append(linear(f"control_layers.{i}.after_proj", c))

        def main_out(layer: Any, args: Any, kw: Any, out: torch.Tensor) -> torch.Tensor:
            out = out.clone()
            out[:, :n] += strength * state["hints"][list(module.layers).index(layer)]
            return out

        (refiner,) = module.noise_refiner  # the demo transformer has one noise refiner block
        handles = [
            refiner.register_forward_pre_hook(refiner_in, with_kwargs=True),
            refiner.register_forward_hook(refiner_out, with_kwargs=True),
            module.layers[0].register_forward_pre_hook(main_in, with_kwargs=True),
        ]
        handles += [layer.register_forward_hook(main_out, with_kwargs=True) for layer in module.layers]
        expected, plain = hooked_and_plain(denoiser, module, (x, t, kwargs), handles)
    assert (got - expected).abs().max() < 1e-5
    assert (got - plain).abs().max() > 1e-3


def test_2_1_strength_zero_is_the_unpatched_image(root: Path, ctx: Any) -> None:
    model, clip, vae = _zimage(root, ctx)
    pos = CLIPTextEncode().run(ctx, text="a cat", clip=clip)[0]
    neg = CLIPTextEncode().run(ctx, text="", clip=clip)[0]
    patch = ModelPatchLoader().run(ctx, name=DEMO_FUN_CONTROL_21)[0]
    plain = _sample(ctx, model, pos, neg)

    def apply(strength: float) -> Any:
        return ZImageFunControlnet().run(
            ctx,
            model=model,
            model_patch=patch,
            vae=vae,
            strength=strength,
            inpaint_image=_image(),
            mask=_mask(),
        )[0]

    assert torch.equal(_sample(ctx, apply(0.0), pos, neg), plain)
    assert (_sample(ctx, apply(1.0), pos, neg) - plain).abs().max() > 1e-3


# --- bad input ------------------------------------------------------------------------------------
def test_missing_images_and_mismatched_masks_are_refused(root: Path, ctx: Any) -> None:
    model, _, vae = _zimage(root, ctx)
    v2 = ModelPatchLoader().run(ctx, name=DEMO_FUN_CONTROL_21)[0]
    v1 = ModelPatchLoader().run(ctx, name=DEMO_FUN_CONTROL)[0]
    with pytest.raises(
        ModelPatchError, match=r"node 7\) got no image.*or the image to inpaint to inpaint_image"
    ):
        ZImageFunControlnet().run(ctx, model=model, model_patch=v2, vae=vae, strength=1.0, mask=_mask())
    with pytest.raises(ModelPatchError, match=r"got no image; connect the control image .*image input$"):
        ZImageFunControlnet().run(
            ctx, model=model, model_patch=v1, vae=vae, strength=1.0, inpaint_image=_image()
        )
    with pytest.raises(
        ModelPatchError, match="got 3 masks for 2 inpaint images; give one mask, or one per image"
    ):
        ZImageFunControlnet().run(
            ctx,
            model=model,
            model_patch=v2,
            vae=vae,
            strength=1.0,
            inpaint_image=torch.cat([_image(), _image(seed=4)]),
            mask=_mask().repeat(3, 1, 1),
        )


def test_broken_2_0_files_are_recognised_and_run_as_comfyui_runs_them(tmp_path: Path) -> None:
    """A 15-layer 2.0 file whose refiner after_proj is all zeros: the control layers stand in for the
    refiner (hint 0: layer 0's; hint 1: layer 1's after layers 1..14), then run again from the
    stream they left for the main blocks (a hint every 30 / 15 = 2 blocks)."""
    from safetensors.torch import save_file

    from nodes.control.model_patch import open_model_patch
    from nodes.families.components.zimage_fun_control import FunControlKind, fun_control_module

    torch.manual_seed(0)
    net = fun_control_module(15, 2, 16, 64, 2, 17, refiner_control=True)
    with torch.no_grad():
        for name, p in net.named_parameters():
            p.copy_(torch.randn_like(p) * 0.05 + (1.0 if "norm" in name else 0.0))
        net.control_noise_refiner[0].after_proj.weight.zero_()
    path = tmp_path / "fun_2.0_broken.safetensors"
    save_file({k.replace(".block.", "."): v.contiguous() for k, v in net.state_dict().items()}, str(path))
    handle = open_model_patch(path)
    assert dict(handle.config)["broken"] is True
    module = handle.load()
    gen = torch.Generator().manual_seed(1)
    n, control, adaln = 4, torch.randn(1, 4, 64, generator=gen), torch.randn(1, 64, generator=gen)
    freqs = torch.polar(torch.ones(1, 8, 16), torch.rand(1, 8, 16, generator=gen) * 6.28)
    x_refiner, x_main, image = (torch.randn(1, 8, 64, generator=gen) for _ in range(3))
    hooks = FunControlKind().block_hooks(module, control, 0.5, {"main": 30, "refiner": 2})
    layers = module.control_layers
    with torch.no_grad():
        got = [hooks["refiner"](i, image, (x_refiner, None, freqs, adaln), {}) for i in range(2)]
        got += [hooks["main"](i, image, (x_main, None, freqs, adaln), {}) for i in range(3)]
        c = layers[0].block(layers[0].before_proj(control) + x_refiner[:, :n], None, freqs[:, :n], adaln)
        refiner_hints = [layers[0].after_proj(c)]
        for i, layer in enumerate(layers[1:]):
            c = layer.block(c, None, freqs[:, :n], adaln)
            refiner_hints += [layer.after_proj(c)] if i == 0 else []
        c = layers[0].block(layers[0].before_proj(c) + x_main[:, :n], None, freqs[:, :n], adaln)
        main_hint0 = layers[0].after_proj(c)
        main_hint1 = layers[1].after_proj(layers[1].block(c, None, freqs[:, :n], adaln))

    def added(hint: torch.Tensor) -> torch.Tensor:
        return torch.cat([image[:, :n] + 0.5 * hint, image[:, n:]], dim=1)

    expected = [added(refiner_hints[0]), added(refiner_hints[1]), added(main_hint0), image, added(main_hint1)]
    for mine, ref in zip(got, expected, strict=True):
        assert (mine - ref).abs().max() < 1e-5
    assert (got[1] - got[0]).abs().max() > 1e-3
