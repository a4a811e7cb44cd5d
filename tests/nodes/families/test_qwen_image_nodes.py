"""ComfyUI's Qwen-Image nodes: TextEncodeQwenImageEdit / EditPlus encode text-only instructions as ComfyUI
does (Edit: Qwen-Image's template; Plus: the edit template, its head dropped by the same rule), refuse
image inputs when the text encoder file has no vision tower (tests/nodes/families/test_qwen_image_edit.py covers
encoding with images); reference latents (the conditioning key
``reference_latents`` that ReferenceLatent and the edit nodes set) reach the transformer as ComfyUI
places them, equal to diffusers' transformer given the same packed tokens; ModelMergeQwenImage merges
block by block."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from nodes.core.cond import CondEntry
from nodes.demo.qwen_image import DEMO_QWEN25, DEMO_QWEN_IMAGE
from nodes.encode.conditioning import CLIPTextEncode
from nodes.families.components.flux_dit import pack
from nodes.families.components.qwen25_text import template_end
from nodes.families.components.qwen_text import load_qwen_tokenizer
from nodes.family_nodes.qwen_image_nodes import (
    EDIT_TEMPLATE,
    MERGE_PARTS,
    ModelMergeQwenImage,
    QwenEditError,
    TextEncodeQwenImageEdit,
    TextEncodeQwenImageEditPlus,
)
from nodes.load.handles import open_diffusion_model, open_text_encoders


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    from nodes.demo.qwen_image import demo_qwen_image_modules, write_qwen_image_files

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("qwen_image")
    modules = demo_qwen_image_modules()
    write_qwen_image_files(root, modules)
    return root, modules


def _clip(root: Path) -> Any:
    return open_text_encoders([root / "text_encoders" / DEMO_QWEN25], "qwen_image")


def test_edit_without_image_is_the_plain_encoding(qwen_dir: Any, make_ctx: Any) -> None:
    root, _ = qwen_dir
    ctx, clip = make_ctx(), _clip(root)
    (edit,) = TextEncodeQwenImageEdit().run(ctx, clip=clip, prompt="make it blue")[0]
    (plain,) = CLIPTextEncode().run(ctx, text="make it blue", clip=clip)[0]
    assert torch.equal(edit.embeds, plain.embeds) and not edit.extras


def test_edit_plus_without_images_uses_the_edit_template(qwen_dir: Any, make_ctx: Any) -> None:
    root, modules = qwen_dir
    (entry,) = TextEncodeQwenImageEditPlus().run(make_ctx(), clip=_clip(root), prompt="make it blue")[0]
    ids = load_qwen_tokenizer()(EDIT_TEMPLATE.format("make it blue"))["input_ids"]
    head = template_end(ids)
    assert load_qwen_tokenizer().decode(ids[head - 3 : head]) == "<|im_start|>user\n"
    with torch.no_grad():
        ref = modules["qwen25_7b"](input_ids=torch.tensor([ids])).last_hidden_state[:, head:]
    torch.testing.assert_close(entry.embeds, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "node,inputs",
    [
        (TextEncodeQwenImageEdit, {"image": torch.rand(1, 32, 32, 3)}),
        (
            TextEncodeQwenImageEditPlus,
            {"image1": torch.rand(1, 32, 32, 3), "image3": torch.rand(1, 32, 32, 3)},
        ),
    ],
)
def test_image_inputs_need_a_file_with_the_vision_tower(
    node: Any, inputs: dict[str, Any], qwen_dir: Any, make_ctx: Any, tmp_path: Path
) -> None:
    """A Qwen2.5-VL file without the ``visual.`` tensors encodes text, and refuses pictures naming
    the node, the file and the fix."""
    from safetensors.torch import load_file, save_file

    root, _ = qwen_dir
    text_only = tmp_path / "qwen_2.5_vl_text_only.safetensors"
    tensors = load_file(str(root / "text_encoders" / DEMO_QWEN25))
    save_file({k: v for k, v in tensors.items() if not k.startswith("visual.")}, str(text_only))
    clip = open_text_encoders([text_only], "qwen_image")
    node().run(make_ctx(), clip=clip, prompt="make it blue")
    with pytest.raises(
        QwenEditError,
        match=f"{node.__name__}: the text encoder file {text_only.name} has no Qwen2.5-VL vision tower.*"
        "qwen_2.5_vl_7b_fp8_scaled.*ReferenceLatent",
    ):
        node().run(make_ctx(), clip=clip, prompt="make it blue", **inputs)


def test_edit_nodes_need_the_qwen_image_clip(make_ctx: Any, tmp_path: Path) -> None:
    from safetensors.torch import save_file

    from nodes.demo.zimage import DEMO_QWEN3, demo_zimage_modules, zimage_files

    save_file(zimage_files(demo_zimage_modules(vae=False))[DEMO_QWEN3], str(tmp_path / DEMO_QWEN3))
    clip = open_text_encoders([tmp_path / DEMO_QWEN3], "lumina2")
    with pytest.raises(QwenEditError, match="needs the Qwen-Image text encoder, got the Z-Image CLIP"):
        TextEncodeQwenImageEditPlus().run(make_ctx(), clip=clip, prompt="x")


def test_reference_latents_reach_the_transformer_as_comfyui_places_them(qwen_dir: Any, make_ctx: Any) -> None:
    """Index method: the reference's patches follow the image's at frame index 1 (diffusers' rope
    numbers a second shape the same way), only the image tokens' output is kept; rows with and
    without references in one batch run apart and equal separate calls."""
    root, modules = qwen_dir
    handle = open_diffusion_model(root / "diffusion_models" / DEMO_QWEN_IMAGE)
    kind, module = handle.family.denoiser, handle.load()
    (cond,) = CLIPTextEncode().run(make_ctx(), text="make it blue", clip=_clip(root))[0]
    torch.manual_seed(5)
    raw_ref = torch.randn(1, 16, 4, 8)
    with_ref = replace(cond, extras={"reference_latents": [raw_ref]})
    x, sigma = torch.randn(2, 16, 8, 8), torch.tensor([0.7])
    kwargs = kind.conditioning([with_ref, cond], 1, (64, 64))
    with torch.no_grad():
        mine = kind.forward(module, x, sigma, kwargs)
        ref_tokens = pack(handle.latent_format.process_in(raw_ref))[0]
        tokens = torch.cat([pack(x[:1])[0], ref_tokens], dim=1)
        theirs = modules["unet"](
            hidden_states=tokens,
            encoder_hidden_states=cond.embeds,
            timestep=sigma,
            img_shapes=[[(1, 4, 4), (1, 2, 4)]],
            return_dict=False,
        )[0][:, :16]
        plain = modules["unet"](
            hidden_states=pack(x[1:])[0],
            encoder_hidden_states=cond.embeds,
            timestep=sigma,
            img_shapes=[[(1, 4, 4)]],
            return_dict=False,
        )[0]
    torch.testing.assert_close(pack(mine[:1])[0], theirs, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(pack(mine[1:])[0], plain, atol=1e-5, rtol=1e-5)
    assert (theirs - plain).abs().max() > 1e-3  # the reference changed the prediction
    video = replace(
        cond, extras={"reference_latents": [raw_ref.unsqueeze(2)]}
    )  # (B, C, 1, h, w), as ComfyUI's VAE
    with torch.no_grad():
        torch.testing.assert_close(
            kind.forward(module, x[:1], sigma, kind.conditioning([video], 1, (64, 64))), mine[:1]
        )


def test_index_timestep_zero_modulates_the_references_at_timestep_zero(qwen_dir: Any, make_ctx: Any) -> None:
    """FluxKontextMultiReferenceLatentMethod's ``index_timestep_zero`` (Qwen-Image-Edit-2511): the
    references placed as ``index``, modulated at timestep 0: equal to diffusers' transformer built with
    ``zero_cond_t=True`` (its 2511 variant) on the same weights; the module's flags are left as they were."""
    from diffusers import QwenImageTransformer2DModel

    from nodes.family_nodes.flux_nodes import FluxKontextMultiReferenceLatentMethod

    root, modules = qwen_dir
    handle = open_diffusion_model(root / "diffusion_models" / DEMO_QWEN_IMAGE)
    kind, module = handle.family.denoiser, handle.load()
    (cond,) = CLIPTextEncode().run(make_ctx(), text="make it blue", clip=_clip(root))[0]
    torch.manual_seed(6)
    raw_ref = torch.randn(1, 16, 4, 8)
    with_ref = [replace(cond, extras={"reference_latents": [raw_ref]})]
    (zero,) = FluxKontextMultiReferenceLatentMethod().run(
        make_ctx(), conditioning=with_ref, reference_latents_method="index_timestep_zero"
    )[0]
    assert zero.extras["reference_latents_method"] == "index_timestep_zero"
    x, sigma = torch.randn(1, 16, 8, 8), torch.tensor([0.7])
    config = {k: v for k, v in modules["unet"].config.items() if not k.startswith("_")}  # no default list
    edit_2511 = QwenImageTransformer2DModel.from_config({**config, "zero_cond_t": True}).eval()
    assert edit_2511.zero_cond_t
    edit_2511.load_state_dict(modules["unet"].state_dict())
    edit_2511.pos_embed = modules["unet"].pos_embed  # the same position embedder as the reference test's
    with torch.no_grad():
        mine = kind.forward(module, x, sigma, kind.conditioning([zero], 1, (64, 64)))
        index = kind.forward(module, x, sigma, kind.conditioning(with_ref, 1, (64, 64)))
        tokens = torch.cat([pack(x)[0], pack(handle.latent_format.process_in(raw_ref))[0]], dim=1)
        theirs = edit_2511(
            hidden_states=tokens,
            encoder_hidden_states=cond.embeds,
            timestep=sigma,
            img_shapes=[[(1, 4, 4), (1, 2, 4)]],
            return_dict=False,
        )[0][:, :16]
    torch.testing.assert_close(pack(mine)[0], theirs, atol=1e-5, rtol=1e-5)
    assert (mine - index).abs().max() > 1e-4  # the references' timestep changed the prediction
    assert not module.zero_cond_t and not any(b.zero_cond_t for b in module.transformer_blocks)


def test_a_reference_from_another_latent_space_is_refused(qwen_dir: Any) -> None:
    from nodes.core.sampling_hooks import ConditioningError

    root, _ = qwen_dir
    handle = open_diffusion_model(root / "diffusion_models" / DEMO_QWEN_IMAGE)
    entry = CondEntry(embeds=torch.zeros(1, 3, 32), extras={"reference_latents": [torch.zeros(1, 4, 8, 8)]})
    with pytest.raises(ConditioningError, match="16-channel latents from its own VAE"):
        handle.family.denoiser.check_conditioning(handle.load(), [entry], "positive")


def test_model_merge_qwen_image_block_by_block(qwen_dir: Any, make_ctx: Any, tmp_path: Path) -> None:
    from safetensors.torch import save_file

    from nodes.demo.qwen_image import demo_qwen_image_modules

    root, _ = qwen_dir
    other = demo_qwen_image_modules(seed=1)["unet"].state_dict()
    save_file({k: v.contiguous() for k, v in other.items()}, str(tmp_path / "other.safetensors"))
    names = [i.name for i in ModelMergeQwenImage.SCHEMA.inputs]
    assert names[:2] == ["model1", "model2"] and tuple(names[2:]) == MERGE_PARTS and len(MERGE_PARTS) == 66
    assert all(i.default == 1.0 for i in ModelMergeQwenImage.SCHEMA.inputs[2:])
    model1 = open_diffusion_model(root / "diffusion_models" / DEMO_QWEN_IMAGE)
    ratios = {n: 1.0 for n in MERGE_PARTS} | {"transformer_blocks.1.": 0.0, "txt_in.": 0.25}
    merged = ModelMergeQwenImage().run(
        make_ctx(), model1=model1, model2=open_diffusion_model(tmp_path / "other.safetensors"), **ratios
    )[0]
    mine, base = merged.load().state_dict(), model1.load().state_dict()
    for key, value in mine.items():
        if key.startswith("transformer_blocks.1."):
            expected = other[key]
        elif key.startswith("txt_in."):
            expected = 0.25 * base[key] + 0.75 * other[key]
        else:
            expected = base[key]  # norm_out.* takes the first ratio (pos_embeds.), 1
        torch.testing.assert_close(value, expected, msg=key)
