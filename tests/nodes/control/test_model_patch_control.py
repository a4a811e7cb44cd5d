"""ModelPatchLoader with DiffSynth's block-wise Qwen-Image ControlNet and QwenImageDiffsynthControlnet.

On the tiny Qwen-Image demo and the demo patch files (``models/model_patches``): the file's tensors
are the built module's; strength 0 samples exactly the unpatched image; a nonzero strength changes
it, and one model call equals the documented maths written out here (the control image VAE-encoded,
put in the model's latent space, packed in 2×2 patches, projected by ``img_in``; after each block
``h[:, :n] += strength · output_proj(gelu(input_proj(rms(h)·wx + rms(c)·wy)))``), computed with
standard forward hooks on the plain model; the inpainting variant's mask channel; a patch on another
family's model is refused naming both."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from nodes.control.model_patch import ModelPatchError, ModelPatchLoader, QwenImageDiffsynthControlnet
from nodes.core.sampling_hooks import ModelCall
from nodes.demo.model_patch import (
    DEMO_BLOCKWISE,
    DEMO_BLOCKWISE_INPAINT,
    DEMO_FUN_CONTROL,
    make_model_patch_demo,
)
from nodes.demo.qwen_image import DEMO_QWEN25, DEMO_QWEN_IMAGE, DEMO_QWEN_VAE
from nodes.encode.conditioning import CLIPTextEncode
from nodes.family_nodes.flux_nodes import EmptySD3LatentImage
from nodes.load.handles import open_diffusion_model, open_text_encoders, open_vae
from nodes.sample.ksampler import KSampler

SIZE = 64
WORKFLOWS = Path(__file__).resolve().parents[3] / "web" / "workflows"


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from nodes.demo.qwen_image import make_qwen_image_demo
    from nodes.demo.zimage import make_zimage_demo

    torch.set_num_threads(1)
    path = tmp_path_factory.mktemp("model_patch")
    make_qwen_image_demo(path)
    make_zimage_demo(path)
    make_model_patch_demo(path)
    return path


@pytest.fixture()
def ctx(root: Path, manager: Any, tmp_path: Path) -> Any:
    from engine.context import Folders, NodeContext
    from engine.folders import ModelFolders

    folders = Folders(
        tmp_path / "input", tmp_path / "output", tmp_path / "temp", model_files=ModelFolders(root)
    )
    folders.ensure()
    return NodeContext(node_id="1", prompt_id="test", folders=folders, models=manager)


def _image(seed: int = 3, size: int = SIZE) -> torch.Tensor:
    return torch.rand(1, size, size, 3, generator=torch.Generator().manual_seed(seed))


def _parts(root: Path, ctx: Any) -> tuple[Any, Any, Any, Any]:
    model = open_diffusion_model(root / "diffusion_models" / DEMO_QWEN_IMAGE)
    clip = open_text_encoders([root / "text_encoders" / DEMO_QWEN25], "qwen_image")
    vae = open_vae(root / "vae" / DEMO_QWEN_VAE)
    pos = CLIPTextEncode().run(ctx, text="a cat", clip=clip)[0]
    return model, clip, vae, pos


def _sample(ctx: Any, model: Any, pos: Any, neg: Any) -> torch.Tensor:
    latent = EmptySD3LatentImage().run(ctx, width=SIZE, height=SIZE, batch_size=1)[0]
    return KSampler().run(
        ctx,
        model=model,
        seed=7,
        steps=2,
        cfg=2.0,
        sampler_name="euler",
        scheduler="simple",
        positive=pos,
        negative=neg,
        latent_image=latent,
        denoise=1.0,
    )[0]["samples"]


def test_file_tensors_are_the_built_modules(root: Path, ctx: Any) -> None:
    for name in (DEMO_BLOCKWISE, DEMO_BLOCKWISE_INPAINT):
        handle = ModelPatchLoader().run(ctx, name=name)[0]
        module = handle.load()
        tensors = load_file(str(root / "model_patches" / name))
        state = module.state_dict()
        assert sorted(state) == sorted(tensors)
        assert all(torch.equal(state[k], tensors[k]) for k in tensors)
        assert dict(handle.config)["inputs"] == (68 if name == DEMO_BLOCKWISE_INPAINT else 64)


def test_strength_zero_samples_the_unpatched_image_and_nonzero_changes_it(root: Path, ctx: Any) -> None:
    model, clip, vae, pos = _parts(root, ctx)
    neg = CLIPTextEncode().run(ctx, text="", clip=clip)[0]
    patch = ModelPatchLoader().run(ctx, name=DEMO_BLOCKWISE)[0]
    plain = _sample(ctx, model, pos, neg)
    off = QwenImageDiffsynthControlnet().run(
        ctx, model=model, model_patch=patch, vae=vae, image=_image(), strength=0.0
    )[0]
    on = QwenImageDiffsynthControlnet().run(
        ctx, model=model, model_patch=patch, vae=vae, image=_image(), strength=1.0
    )[0]
    assert torch.equal(_sample(ctx, off, pos, neg), plain)
    assert (_sample(ctx, on, pos, neg) - plain).abs().max() > 1e-3


def _patched_call(model: Any, vae: Any, patch: Any, patched: Any, pos: Any) -> tuple[Any, ...]:
    """One call of ``patched`` through its sampling hooks on a fixed (x, t) pair of rows, with the
    resident modules the sampler would give: (module, vae module, denoiser, x, t, kwargs, output)."""
    module, vae_module, network = model.load(), vae.load(), patch.load()
    x = torch.randn(2, 16, SIZE // 8, SIZE // 8, generator=torch.Generator().manual_seed(0))
    t = torch.tensor([0.6, 0.6])
    denoiser = model.denoiser
    kwargs = denoiser.conditioning(pos, 2, (SIZE, SIZE))
    with torch.no_grad():
        hooks = patched.sampling_hooks(module, {patch.key: network, vae.key: vae_module})
        got = hooks.apply_model(
            lambda call: denoiser.forward(module, call.x_in, call.timestep, dict(call.cond_kwargs))
        )(ModelCall(x, t, t, kwargs, ("cond", "uncond")))
    return module, vae_module, denoiser, x, t, kwargs, got


def _rms(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * weight


def _expected_tokens(
    tensors: dict[str, torch.Tensor],
    vae_module: Any,
    image: torch.Tensor,
    latent_format: Any,
    keep: torch.Tensor | None,
) -> torch.Tensor:
    pixels = image.movedim(-1, 1) * 2 - 1
    latent = vae_module.encode(pixels, return_dict=False)[0].mode()
    latent = latent_format.process_in(latent)
    extra = tensors["img_in.weight"].shape[1] - 64
    if extra:
        mask = (
            torch.ones_like(latent[:, :1])
            if keep is None
            else F.interpolate(keep, size=latent.shape[-2:], mode="bilinear")
        )
        latent = torch.cat([latent, mask], dim=1)
    b, c, h, w = latent.shape
    patches = [latent[:, :, r::2, s::2] for r in range(2) for s in range(2)]  # (row, col) cell offsets
    tokens = torch.stack(patches, dim=2).reshape(b, c * 4, (h // 2) * (w // 2)).transpose(1, 2)
    return F.linear(tokens, tensors["img_in.weight"], tensors["img_in.bias"])


@pytest.mark.parametrize(
    ("name", "with_mask"),
    [(DEMO_BLOCKWISE, False), (DEMO_BLOCKWISE_INPAINT, True), (DEMO_BLOCKWISE_INPAINT, False)],
)
def test_one_model_call_is_the_documented_maths(root: Path, ctx: Any, name: str, with_mask: bool) -> None:
    model, _, vae, pos = _parts(root, ctx)
    patch = ModelPatchLoader().run(ctx, name=name)[0]
    strength = 0.7
    mask = torch.zeros(1, SIZE, SIZE)
    mask[:, :, SIZE // 2 :] = 1.0
    patched = QwenImageDiffsynthControlnet().run(
        ctx,
        model=model,
        model_patch=patch,
        vae=vae,
        image=_image(size=48),
        strength=strength,
        mask=mask if with_mask else None,
    )[0]
    tensors = load_file(str(root / "model_patches" / name))
    module, vae_module, denoiser, x, t, kwargs, got = _patched_call(model, vae, patch, patched, pos)
    with torch.no_grad():
        # the image fitted as ComfyUI does ("area" scale, centre crop: square to square is a plain area resize)
        image = F.interpolate(_image(size=48).movedim(-1, 1), size=(SIZE, SIZE), mode="area").movedim(1, -1)
        keep = (1.0 - mask).reshape(1, 1, SIZE, SIZE) if with_mask else None
        control = _expected_tokens(tensors, vae_module, image, model.latent_format, keep)

        def after(block: Any, args: Any, kwargs_: Any, out: tuple[torch.Tensor, torch.Tensor]) -> Any:
            i = list(module.transformer_blocks).index(block)
            p = f"controlnet_blocks.{i}."
            h = out[1]
            y = _rms(h, tensors[p + "x_rms.weight"]) + _rms(control, tensors[p + "y_rms.weight"])
            y = F.linear(
                F.gelu(F.linear(y, tensors[p + "input_proj.weight"], tensors[p + "input_proj.bias"])),
                tensors[p + "output_proj.weight"],
                tensors[p + "output_proj.bias"],
            )
            return out[0], h + strength * y

        handles = [b.register_forward_hook(after, with_kwargs=True) for b in module.transformer_blocks]
        try:
            expected = denoiser.forward(module, x, t, dict(kwargs))
        finally:
            for h in handles:
                h.remove()
        plain = denoiser.forward(module, x, t, dict(kwargs))
    assert (got - expected).abs().max() < 1e-5
    assert (got - plain).abs().max() > 1e-3


def test_a_patch_on_another_familys_model_names_both(root: Path, ctx: Any, tiny_sd15_ckpt: Path) -> None:
    from nodes.demo.zimage import DEMO_ZIMAGE
    from nodes.load.handles import open_checkpoint

    patch = ModelPatchLoader().run(ctx, name=DEMO_BLOCKWISE)[0]
    vae = open_vae(root / "vae" / DEMO_QWEN_VAE)
    zimage = open_diffusion_model(root / "diffusion_models" / DEMO_ZIMAGE)
    with pytest.raises(ModelPatchError, match="made for Qwen-Image models, but the model is Z-Image"):
        QwenImageDiffsynthControlnet().run(
            ctx, model=zimage, model_patch=patch, vae=vae, image=_image(), strength=1.0
        )
    sd15 = open_checkpoint(tiny_sd15_ckpt).unet
    with pytest.raises(
        ModelPatchError, match=f"made for Qwen-Image models, but the model is {sd15.family.title}"
    ):
        QwenImageDiffsynthControlnet().run(
            ctx, model=sd15, model_patch=patch, vae=vae, image=_image(), strength=1.0
        )


def test_schema_is_comfyuis() -> None:
    schema = QwenImageDiffsynthControlnet.SCHEMA
    assert [(i.name, i.type, i.optional) for i in schema.inputs] == [
        ("model", "MODEL", False),
        ("model_patch", "MODEL_PATCH", False),
        ("vae", "VAE", False),
        ("image", "IMAGE", False),
        ("strength", "FLOAT", False),
        ("mask", "MASK", True),
    ]
    strength = schema.inputs[4]
    assert (strength.default, strength.min, strength.max, strength.step) == (1.0, -10.0, 10.0, 0.01)
    assert [o.type for o in schema.outputs] == ["MODEL"] and schema.category == "advanced/loaders/qwen"


@pytest.mark.parametrize(
    "name",
    [
        "qwen_image_diffsynth_controlnet",
        "qwen_image_diffsynth_inpaint",
        "zimage_fun_controlnet",
        "zimage_fun_controlnet_inpaint",
    ],
)
def test_example_workflow_runs_offline_on_the_demo_models(root: Path, tmp_path: Path, name: str) -> None:
    import json

    import numpy as np
    from PIL import Image

    from tests.nodes.test_generation_e2e import make_executor, run

    prompt = json.loads((WORKFLOWS / f"{name}.api.json").read_text())
    assert prompt["73"]["class_type"].endswith("Controlnet") and prompt["3"]["inputs"]["model"] == ["73", 0]
    result = run(make_executor(root, tmp_path), prompt)
    assert result.status == "success", (result.node_errors, result.error)
    (save,) = [k for k, v in prompt.items() if v["class_type"] == "SaveImage"]
    (image,) = result.outputs[save]["images"]
    with Image.open(tmp_path / "output" / image["subfolder"] / image["filename"]) as png:
        assert png.size == (64, 64) and np.asarray(png).std() > 1.0


# --- Z-Image Fun ControlNet --------------------------------------------------------------------------
def _zimage(root: Path, ctx: Any) -> tuple[Any, Any, Any]:
    from nodes.demo.flux import DEMO_FLUX_VAE
    from nodes.demo.zimage import DEMO_QWEN3, DEMO_ZIMAGE

    model = open_diffusion_model(root / "diffusion_models" / DEMO_ZIMAGE)
    clip = open_text_encoders([root / "text_encoders" / DEMO_QWEN3], "lumina2")
    return model, clip, open_vae(root / "vae" / DEMO_FLUX_VAE)


def test_fun_controlnet_file_tensors_are_the_built_modules(root: Path, ctx: Any) -> None:
    handle = ModelPatchLoader().run(ctx, name=DEMO_FUN_CONTROL)[0]
    state = handle.load().state_dict()
    tensors = load_file(str(root / "model_patches" / DEMO_FUN_CONTROL))
    assert {k.replace(".block.", "."): v for k, v in state.items()}.keys() == tensors.keys()
    assert all(torch.equal(state[k], tensors[k.replace(".block.", ".")]) for k in state)
    assert dict(handle.config) == {
        "layers": 2,
        "refiners": 2,
        "channels": 16,
        "extra": 0,
        "dim": 64,
        "heads": 2,
        "refiner_control": False,
        "broken": False,
    }


def test_fun_controlnet_strength_zero_is_the_unpatched_image(root: Path, ctx: Any) -> None:
    from nodes.control.model_patch import ZImageFunControlnet

    model, clip, vae = _zimage(root, ctx)
    pos = CLIPTextEncode().run(ctx, text="a cat", clip=clip)[0]
    neg = CLIPTextEncode().run(ctx, text="", clip=clip)[0]
    patch = ModelPatchLoader().run(ctx, name=DEMO_FUN_CONTROL)[0]
    plain = _sample(ctx, model, pos, neg)
    off = ZImageFunControlnet().run(
        ctx, model=model, model_patch=patch, vae=vae, strength=0.0, image=_image()
    )[0]
    on = ZImageFunControlnet().run(
        ctx, model=model, model_patch=patch, vae=vae, strength=1.0, image=_image()
    )[0]
    assert torch.equal(_sample(ctx, off, pos, neg), plain)
    assert (_sample(ctx, on, pos, neg) - plain).abs().max() > 1e-3


def fun_maths(tensors: dict[str, torch.Tensor]) -> tuple[Any, Any]:
    """(a Z-Image block of the file's tensors under a prefix, a named linear of them) for the Fun
    ControlNet references: plain blocks of the demo's width and heads, the projections by hand."""
    from diffusers.models.transformers.transformer_z_image import ZImageTransformerBlock

    def block(prefix: str) -> Any:
        b = ZImageTransformerBlock(0, 64, 2, 2, 1e-5, True, modulation=True)
        b.load_state_dict(
            {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix) and "_proj." not in k}
        )
        return b

    def linear(name: str, v: torch.Tensor) -> torch.Tensor:
        return F.linear(v, tensors[name + ".weight"], tensors[name + ".bias"])

    return block, linear


def test_fun_controlnet_model_call_is_the_documented_maths(root: Path, ctx: Any) -> None:
    from nodes.control.model_patch import ZImageFunControlnet

    model, clip, vae = _zimage(root, ctx)
    pos = CLIPTextEncode().run(ctx, text="a cat", clip=clip)[0]
    patch = ModelPatchLoader().run(ctx, name=DEMO_FUN_CONTROL)[0]
    strength = 0.8
    patched = ZImageFunControlnet().run(
        ctx, model=model, model_patch=patch, vae=vae, strength=strength, image=_image()
    )[0]
    tensors = load_file(str(root / "model_patches" / DEMO_FUN_CONTROL))
    module, vae_module, denoiser, x, t, kwargs, got = _patched_call(model, vae, patch, patched, pos)
    with torch.no_grad():
        block, linear = fun_maths(tensors)

        pixels = _image().movedim(-1, 1) * 2 - 1
        latent = model.latent_format.process_in(vae_module.encode(pixels, return_dict=False)[0].mode())
        b, c, h, w = latent.shape  # 2×2 patches, patch-major and channel last (Z-Image's embedder order)
        cells = [latent[:, :, r::2, s::2] for r in range(2) for s in range(2)]
        tokens = torch.stack(cells, dim=-1).permute(0, 2, 3, 4, 1).reshape(b, (h // 2) * (w // 2), 4 * c)
        control = linear("control_all_x_embedder.2-1", tokens).expand(2, -1, -1)
        n = control.shape[1]
        hints: list[torch.Tensor] = []

        def first(layer: Any, args: Any, kw: Any) -> None:
            stream, _, freqs, adaln = args[:4]
            cc = control
            for i in range(2):
                cc = block(f"control_noise_refiner.{i}.")(cc, None, freqs[:, :n], adaln)
            cc = linear("control_layers.0.before_proj", cc) + stream[:, :n]
            for i in range(2):  # 2 main blocks, 2 control layers: a hint after every block
                cc = block(f"control_layers.{i}.")(cc, None, freqs[:, :n], adaln)
                hints.append(linear(f"control_layers.{i}.after_proj", cc))

        def after(layer: Any, args: Any, kw: Any, out: torch.Tensor) -> torch.Tensor:
            i = list(module.layers).index(layer)
            out = out.clone()
            out[:, :n] += strength * hints[i]
            return out

        handles = [module.layers[0].register_forward_pre_hook(first, with_kwargs=True)]
        handles += [layer.register_forward_hook(after, with_kwargs=True) for layer in module.layers]
        expected, plain = hooked_and_plain(denoiser, module, (x, t, kwargs), handles)
    assert (got - expected).abs().max() < 1e-5
    assert (got - plain).abs().max() > 1e-3


def hooked_and_plain(
    denoiser: Any, module: Any, call: tuple[Any, Any, Any], handles: list[Any]
) -> tuple[Any, Any]:
    """The denoiser's output for ``call`` (x, t, kwargs) with the forward hooks of ``handles``, then
    (hooks removed) without them."""
    x, t, kwargs = call
    try:
        expected = denoiser.forward(module, x, t, dict(kwargs))
    finally:
        for handle in handles:
            handle.remove()
    return expected, denoiser.forward(module, x, t, dict(kwargs))


def test_patches_on_the_other_familys_model_name_both(root: Path, ctx: Any) -> None:
    from nodes.control.model_patch import ZImageFunControlnet

    model, _, vae, _ = _parts(root, ctx)
    patch = ModelPatchLoader().run(ctx, name=DEMO_FUN_CONTROL)[0]
    with pytest.raises(ModelPatchError, match="made for Z-Image models, but the model is Qwen-Image"):
        ZImageFunControlnet().run(ctx, model=model, model_patch=patch, vae=vae, strength=1.0, image=_image())
    with pytest.raises(ModelPatchError, match="got no image"):
        ZImageFunControlnet().run(ctx, model=model, model_patch=patch, vae=vae, strength=1.0)


def test_fun_controlnet_schema_is_comfyuis() -> None:
    from nodes.control.model_patch import ZImageFunControlnet

    schema = ZImageFunControlnet.SCHEMA
    assert [(i.name, i.type, i.optional) for i in schema.inputs] == [
        ("model", "MODEL", False),
        ("model_patch", "MODEL_PATCH", False),
        ("vae", "VAE", False),
        ("strength", "FLOAT", False),
        ("image", "IMAGE", True),
        ("inpaint_image", "IMAGE", True),
        ("mask", "MASK", True),
    ]
    strength = schema.inputs[3]
    assert (strength.default, strength.min, strength.max, strength.step) == (1.0, -10.0, 10.0, 0.01)
    assert [o.type for o in schema.outputs] == ["MODEL"] and schema.category == "advanced/loaders/zimage"
