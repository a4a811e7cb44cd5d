"""Qwen-Image-Edit's prompt encoding with pictures, as ComfyUI does it: the picture goes through
Qwen2.5-VL's vision tower (read from the ``visual.`` tensors of the text encoder file), its tokens
replace the template's ``<|image_pad|>`` and the language model runs with the multimodal rotary
positions. On a tiny random Qwen2.5-VL saved in ComfyUI's file layout, Loom's conditioning equals
transformers' ``Qwen2_5_VLForConditionalGeneration`` given the same patches (the last hidden state,
the template's head dropped). ComfyUI's preprocessing equals transformers' image processor (the
shipped config) where no resize is needed and differs, by design, where it resizes; the picture
sizes, templates and reference latents are ComfyUI's node behaviour."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from nodes.families.components.qwen25_text import IMAGE_PAD, template_end
from nodes.families.components.qwen25_vision import (
    PROCESSOR_DIR,
    ImageEmbeds,
    Qwen25Vision,
    splice_positions,
    vision_input,
)
from nodes.families.components.qwen_text import load_qwen_tokenizer
from nodes.family_nodes.qwen_image_edit import (
    EDIT_TEMPLATE,
    IMAGE_TEMPLATE,
    PICTURE,
    encode_edit,
    scale_to_pixels,
)
from nodes.family_nodes.qwen_image_nodes import TextEncodeQwenImageEdit, TextEncodeQwenImageEditPlus
from nodes.load.handles import open_text_encoders

TEXT = dict(
    vocab_size=152064,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=16,
    rms_norm_eps=1e-6,
    max_position_embeddings=128000,
    rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3]},
    use_cache=False,
    tie_word_embeddings=False,
)
VISION = dict(
    depth=4,
    hidden_size=32,
    intermediate_size=48,
    num_heads=2,
    out_hidden_size=32,
    window_size=112,
    fullatt_block_indexes=[3],  # Loom's rule for towers shallower than 8 blocks: the last one
)


@pytest.fixture(scope="module")
def vl(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    """A tiny seeded Qwen2.5-VL and its state dict saved as ComfyUI's qwen_2.5_vl_7b file is laid
    out (``model.`` language model, ``visual.`` tower, ``lm_head``)."""
    from safetensors.torch import save_file
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = Qwen2_5_VLForConditionalGeneration(
        Qwen2_5_VLConfig(text_config=TEXT, vision_config=VISION)
    ).eval()
    with torch.no_grad():  # larger random weights than the initialiser's, so every part matters
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.2 if p.ndim > 1 else 1 + 0.1 * torch.randn_like(p))
    file: dict[str, torch.Tensor] = {}
    for key, value in model.state_dict().items():
        key = key.replace("model.language_model.", "model.").replace("model.visual.", "visual.")
        file[key] = value.contiguous()
    path = tmp_path_factory.mktemp("qwen25vl") / "qwen_2.5_vl_7b.safetensors"
    save_file(file, str(path))
    return model, path


def picture(height: int, width: int, seed: int = 0) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    return torch.from_numpy(rng.integers(0, 256, (1, height, width, 3)).astype(np.float32) / 255)


def transformers_hidden(
    model: Any, text: str, pictures: list[torch.Tensor], mrope: bool = True
) -> torch.Tensor:
    """transformers' last hidden state of ``text`` (one ``<|image_pad|>`` per picture, expanded to
    the picture's tokens as its processor does), given Loom's patches of ``pictures``; without the
    token types (``mrope=False``) transformers numbers the positions 0, 1, 2... on every axis."""
    items = [vision_input(p) for p in pictures]
    counts = iter([item.patches.shape[0] // 4 for item in items])
    ids: list[int] = []
    for token in load_qwen_tokenizer()(text, add_special_tokens=False)["input_ids"]:
        ids += [IMAGE_PAD] * next(counts) if token == IMAGE_PAD else [token]
    batch = torch.tensor([ids])
    with torch.no_grad():
        out = model(
            input_ids=batch,
            attention_mask=torch.ones_like(batch),
            pixel_values=torch.cat([item.patches for item in items]),
            image_grid_thw=torch.tensor([item.grid for item in items]),
            mm_token_type_ids=(batch == IMAGE_PAD).int() if mrope else None,
            output_hidden_states=True,
        )
    return out.hidden_states[-1]


def drop_head(text: str, hidden: torch.Tensor) -> torch.Tensor:
    return hidden[:, template_end(load_qwen_tokenizer()(text, add_special_tokens=False)["input_ids"]) :]


def test_plus_with_two_pictures_equals_transformers(vl: Any, make_ctx: Any) -> None:
    """image1 and image3 become "Picture 1:" and "Picture 3:" in the edit template, each read at
    ~384² pixels; windowed and full-attention blocks both run (the pictures span several 112-px
    windows). Without the multimodal positions the result would differ."""
    model, path = vl
    first, third = picture(200, 300), picture(150, 120, seed=1)
    (entry,) = TextEncodeQwenImageEditPlus().run(
        make_ctx(),
        clip=open_text_encoders([path], "qwen_image"),
        prompt="make it blue",
        image1=first,
        image3=third,
    )[0]
    text = EDIT_TEMPLATE.format(f"Picture 1: {PICTURE}Picture 3: {PICTURE}make it blue")
    scaled = [scale_to_pixels(p, 384 * 384) for p in (first, third)]
    assert [vision_input(p).grid for p in scaled] == [(1, 22, 34), (1, 30, 24)]
    theirs = drop_head(text, transformers_hidden(model, text, scaled))
    assert entry.embeds.shape == theirs.shape
    torch.testing.assert_close(entry.embeds, theirs, atol=1e-4, rtol=0)
    assert not entry.extras  # no VAE: no reference latents
    one_d = drop_head(text, transformers_hidden(model, text, scaled, mrope=False))
    assert (entry.embeds - one_d).abs().max() > 1e-2


def test_edit_with_a_picture_equals_transformers(vl: Any, make_ctx: Any) -> None:
    """TextEncodeQwenImageEdit reads the picture at ~1024² pixels in the template with the vision
    placeholders; the head dropped is the 64 tokens diffusers' edit pipeline drops."""
    model, path = vl
    image = picture(48, 64)
    (entry,) = TextEncodeQwenImageEdit().run(
        make_ctx(), clip=open_text_encoders([path], "qwen_image"), prompt="make it blue", image=image
    )[0]
    scaled = scale_to_pixels(image, 1024 * 1024)
    assert scaled.shape == (1, 887, 1182, 3) and vision_input(scaled).grid == (1, 64, 84)
    text = IMAGE_TEMPLATE.format("make it blue")
    assert template_end(load_qwen_tokenizer()(text, add_special_tokens=False)["input_ids"]) == 64
    torch.testing.assert_close(
        entry.embeds, drop_head(text, transformers_hidden(model, text, [scaled])), atol=1e-4, rtol=0
    )


def test_diffusers_edit_pipeline_encoding_with_the_same_processor_output(vl: Any, make_ctx: Any) -> None:
    """diffusers' QwenImageEditPipeline.encode_prompt (template, processor output, 64-token drop)
    gives Loom's conditioning once its text encoder gets the token types; as shipped, diffusers
    0.42 does not pass them to transformers 5, which then falls back to 1-D positions (different)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, QwenImageEditPipeline
    from PIL import Image
    from transformers import BatchFeature, Qwen2VLImageProcessor

    model, path = vl
    image = picture(168, 224)  # a multiple of 28 within the pixel bounds: no resize on either side
    processor = Qwen2VLImageProcessor.from_pretrained(PROCESSOR_DIR, local_files_only=True)
    tokenizer = load_qwen_tokenizer()

    def processor_call(text: list[str], images: Any, **_: Any) -> Any:
        pixels = processor(images=images, return_tensors="pt")
        counts = iter((pixels["image_grid_thw"].prod(-1) // 4).tolist())
        ids: list[int] = []
        for token in tokenizer(text[0], add_special_tokens=False)["input_ids"]:
            ids += [IMAGE_PAD] * next(counts) if token == IMAGE_PAD else [token]
        batch = torch.tensor([ids])
        return BatchFeature({"input_ids": batch, "attention_mask": torch.ones_like(batch), **pixels})

    class WithTokenTypes(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = model
            self.dtype = torch.float32

        def forward(self, input_ids: torch.Tensor, **kwargs: Any) -> Any:
            return self.inner(input_ids=input_ids, mm_token_type_ids=(input_ids == IMAGE_PAD).int(), **kwargs)

    pipe: Any = QwenImageEditPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(),
        vae=None,
        text_encoder=model,
        tokenizer=tokenizer,
        processor=None,
        transformer=None,
    )
    pipe.processor = processor_call
    pil = Image.fromarray((image[0].numpy() * 255).round().astype(np.uint8))
    with torch.no_grad():
        as_shipped, _ = pipe.encode_prompt("make it blue", image=pil, device=torch.device("cpu"))
        pipe.text_encoder = WithTokenTypes()
        with_types, _ = pipe.encode_prompt("make it blue", image=pil, device=torch.device("cpu"))
    clip = open_text_encoders([path], "qwen_image")  # the node's encoding, at the picture's own size
    mine = encode_edit(make_ctx(), clip, "make it blue", IMAGE_TEMPLATE, [image], "TextEncodeQwenImageEdit")
    torch.testing.assert_close(mine[0].embeds, with_types, atol=1e-4, rtol=0)
    assert (mine[0].embeds - as_shipped).abs().max() > 1e-2


def test_preprocessing_equals_transformers_processor_without_resize() -> None:
    """The shipped processor config loads in transformers offline; where the picture needs no
    resize both give the same patches and grid."""
    from transformers import Qwen2VLImageProcessor

    processor = Qwen2VLImageProcessor.from_pretrained(PROCESSOR_DIR, local_files_only=True)
    image = picture(56, 84)
    theirs = processor(images=[(image[0].numpy() * 255).round().astype(np.uint8)], return_tensors="pt")
    mine = vision_input(image)
    assert theirs["image_grid_thw"].tolist() == [list(mine.grid)] == [[1, 4, 6]]
    torch.testing.assert_close(mine.patches, theirs["pixel_values"], atol=1e-5, rtol=0)


def test_preprocessing_resizes_as_comfyui_not_as_transformers() -> None:
    """A 50×90 picture: both round it to 56×84 (same grid), but ComfyUI resizes the float image
    bilinearly where transformers resizes the 8-bit picture with PIL's bicubic filter."""
    import torch.nn.functional as F
    from transformers import Qwen2VLImageProcessor

    processor = Qwen2VLImageProcessor.from_pretrained(PROCESSOR_DIR, local_files_only=True)
    image = picture(50, 90)
    theirs = processor(images=[(image[0].numpy() * 255).round().astype(np.uint8)], return_tensors="pt")
    mine = vision_input(image)
    assert theirs["image_grid_thw"].tolist() == [list(mine.grid)] == [[1, 4, 6]]
    assert (mine.patches - theirs["pixel_values"]).abs().max() > 0.1
    bilinear = F.interpolate(image.movedim(-1, 1), size=(56, 84), mode="bilinear", align_corners=False)
    mean = torch.tensor([0.48145466, 0.4578275, 0.40821073]).view(1, 3, 1, 1)
    std = torch.tensor([0.26862954, 0.26130258, 0.27577711]).view(1, 3, 1, 1)
    first_patch = ((bilinear - mean) / std)[0, :, :14, :14]  # merged token 0, patch (0, 0), both frames
    torch.testing.assert_close(mine.patches[0].view(3, 2, 14, 14)[:, 0], first_patch)
    torch.testing.assert_close(mine.patches[0].view(3, 2, 14, 14)[:, 1], first_patch)


def test_positions_are_transformers_rope_index(vl: Any) -> None:
    """Text, a 3×5 picture, text, a 4×2 picture, text: Loom's positions equal transformers' rope index."""
    model, _ = vl
    pieces: list[int | ImageEmbeds] = [
        1,
        2,
        ImageEmbeds(torch.zeros(15, 32), 3, 5),
        3,
        ImageEmbeds(torch.zeros(8, 32), 4, 2),
        4,
        5,
    ]
    ids = torch.tensor([[1, 2, *[IMAGE_PAD] * 15, 3, *[IMAGE_PAD] * 8, 4, 5]])
    theirs, _ = model.model.get_rope_index(
        ids, mm_token_type_ids=(ids == IMAGE_PAD).int(), image_grid_thw=torch.tensor([[1, 6, 10], [1, 8, 4]])
    )
    assert torch.equal(splice_positions(pieces), theirs[:, 0])


def test_full_size_vision_config_on_meta_device() -> None:
    """Qwen2.5-VL-7B's tower (1280 wide, 32 blocks, MLP 3420, merged to 3584): the config read back
    from its file layout is the released one and covers every parameter."""
    from accelerate import init_empty_weights
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel

    from nodes.core.weights import TensorIndex, TensorInfo

    with init_empty_weights():
        real = Qwen2_5_VisionTransformerPretrainedModel(
            Qwen2_5_VLVisionConfig(hidden_size=1280, out_hidden_size=3584, intermediate_size=3420)
        )
    index = TensorIndex(
        Path("qwen_2.5_vl_7b.safetensors"),
        {f"visual.{k}": TensorInfo("BF16", tuple(v.shape)) for k, v in real.state_dict().items()},
    )
    config = Qwen25Vision().config_from_tensors(index)
    assert {k: config[k] for k in ("depth", "num_heads", "fullatt_block_indexes", "spatial_merge_size")} == {
        "depth": 32,
        "num_heads": 16,
        "fullatt_block_indexes": [7, 15, 23, 31],
        "spatial_merge_size": 2,
    }
    with init_empty_weights():
        built = Qwen25Vision().empty(config)
    assert {k: v.shape for k, v in built.state_dict().items()} == {
        k: v.shape for k, v in real.state_dict().items()
    }
    assert sum(v.numel() for v in real.state_dict().values()) == pytest.approx(0.6766e9, rel=1e-3)


# --- the nodes with a VAE, and the example workflow on the demo files ----------------------------


def test_picture_sizes_are_comfyuis() -> None:
    """A 30×40 picture: ~1024² for Edit's tower and VAE (sides rounded), ~1024² rounded to 8 for
    Plus's VAE, ~384² for Plus's tower."""
    image = picture(30, 40)
    sizes = [
        tuple(scale_to_pixels(image, *budget).shape[1:3]) for budget in ((1024**2,), (1024**2, 8), (384**2,))
    ]
    assert sizes == [(887, 1182), (888, 1184), (333, 443)]


SMALL = 96 * 96  # the tests' reference budget: a 1-megapixel VAE encode takes the demo VAE ~16 s here


def test_reference_latents_are_the_vae_encodings(
    qwen_image_demo: Path, make_ctx: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a VAE, each picture's reference latent is VAEEncode's latent of the picture scaled to
    the reference budget (Edit: the picture the tower reads; Plus: sides rounded to 8), appended in
    picture order. The budget is shrunk here (ComfyUI's is 1024², checked above)."""
    from nodes.demo.qwen_image import DEMO_QWEN25, DEMO_QWEN_VAE
    from nodes.family_nodes import qwen_image_nodes
    from nodes.latent.vae import VAEEncode
    from nodes.load.handles import open_vae

    monkeypatch.setattr(qwen_image_nodes, "REFERENCE_PIXELS", SMALL)
    ctx = make_ctx()
    clip = open_text_encoders([qwen_image_demo / "text_encoders" / DEMO_QWEN25], "qwen_image")
    vae = open_vae(qwen_image_demo / "vae" / DEMO_QWEN_VAE)
    first, second = picture(30, 40), picture(40, 40, seed=1)

    def vae_encode(image: torch.Tensor) -> torch.Tensor:
        return VAEEncode().run(ctx, pixels=image, vae=vae)[0]["samples"]

    (edit,) = TextEncodeQwenImageEdit().run(ctx, clip=clip, prompt="x", vae=vae, image=first)[0]
    (ref,) = edit.extras["reference_latents"]
    assert torch.equal(ref, vae_encode(scale_to_pixels(first, SMALL)))
    (plus,) = TextEncodeQwenImageEditPlus().run(
        ctx, clip=clip, prompt="x", vae=vae, image2=first, image3=second
    )[0]
    refs = plus.extras["reference_latents"]
    assert len(refs) == 2
    for got, image in zip(refs, (first, second), strict=True):
        assert torch.equal(got, vae_encode(scale_to_pixels(image, SMALL, 8)))


def test_edit_workflow_runs_offline(
    qwen_image_demo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shipped graph (ComfyUI's Qwen-Image-Edit template: ImageScaleToTotalPixels → VAEEncode
    for the latent, TextEncodeQwenImageEdit with the VAE and the picture for both prompts,
    ModelSamplingAuraFlow 3, CFGNorm, KSampler 20 steps cfg 2.5) with shortcuts for this CPU: the
    latent is scaled to 0.01 megapixels instead of 1, the reference budget is shrunk (see above)
    and it samples 4 steps instead of 20. No network connection is opened, even with the hub's
    offline switches unset."""
    import json
    import socket

    from PIL import Image

    from nodes.family_nodes import qwen_image_nodes
    from tests.nodes.test_generation_e2e import make_executor, run

    workflows = Path(__file__).resolve().parents[3] / "web" / "workflows"
    prompt = json.loads((workflows / "qwen_image_edit.api.json").read_text())
    assert prompt["76"]["class_type"] == prompt["77"]["class_type"] == "TextEncodeQwenImageEdit"
    assert prompt["76"]["inputs"]["image"] == ["93", 0] and prompt["76"]["inputs"]["vae"] == ["39", 0]
    assert prompt["93"]["inputs"]["megapixels"] == 1.0 and prompt["3"]["inputs"]["steps"] == 20
    prompt["93"]["inputs"]["megapixels"] = 0.01
    prompt["3"]["inputs"]["steps"] = 4
    monkeypatch.setattr(qwen_image_nodes, "REFERENCE_PIXELS", SMALL)
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    for owner, attr in ((socket, "getaddrinfo"), (socket, "create_connection"), (socket.socket, "connect")):
        monkeypatch.setattr(owner, attr, lambda *a, **k: pytest.fail(f"network access: {a}"))
    executor = make_executor(qwen_image_demo, tmp_path)
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 255, (48, 64, 3), dtype=np.uint8)).save(
        tmp_path / "input" / "qwen_edit_input.png"
    )
    result = run(executor, prompt)
    assert result.status == "success", (result.node_errors, result.error)
    (image,) = result.outputs["60"]["images"]
    with Image.open(tmp_path / "output" / image["subfolder"] / image["filename"]) as png:
        assert png.size == (112, 88) and np.asarray(png).std() > 1.0


def test_fp8_scaled_vision_tower_is_dequantised(tmp_path: Path) -> None:
    """In ComfyUI's qwen_2.5_vl_7b_fp8_scaled.safetensors layers may be fp8 with a scale_weight each;
    the tower built from such a file holds weight · scale and reads a picture like that float tower."""
    from safetensors.torch import save_file

    from nodes.demo.qwen_image import DEMO_QWEN25, demo_qwen_image_modules, qwen_image_files
    from nodes.families.components.qwen25_vision import embed_image
    from nodes.family_nodes.qwen_image_edit import vision_handle

    modules = demo_qwen_image_modules()
    name = "qwen_2.5_vl_7b_fp8_scaled.safetensors"
    file: dict[str, torch.Tensor] = {"scaled_fp8": torch.zeros(0, dtype=torch.float8_e4m3fn)}
    for key, tensor in qwen_image_files(modules)[DEMO_QWEN25].items():
        if key.startswith("visual.blocks.") and key.endswith(".weight") and tensor.ndim == 2:
            scale = tensor.abs().max() / 448.0
            quantised = (tensor / scale).to(torch.float8_e4m3fn)
            file[key] = quantised
            file[key.removesuffix(".weight") + ".scale_weight"] = scale.reshape(())
            with torch.no_grad():
                modules["visual"].state_dict()[key.removeprefix("visual.")].copy_(quantised.float() * scale)
        else:
            file[key] = tensor
    save_file({k: v.contiguous() for k, v in file.items()}, str(tmp_path / name))
    tower = vision_handle(
        open_text_encoders([tmp_path / name], "qwen_image"), "TextEncodeQwenImageEdit"
    ).load()
    image = picture(56, 84)
    mine, float_tower = embed_image(tower, image), embed_image(modules["visual"], image)
    assert (mine.rows, mine.cols) == (float_tower.rows, float_tower.cols) == (2, 3)
    torch.testing.assert_close(mine.tokens.float(), float_tower.tokens, atol=1e-5, rtol=1e-5)


def test_older_demo_text_encoder_without_a_whole_tower(tmp_path: Path, make_ctx: Any) -> None:
    """Earlier demo text encoders held two stray ``visual.`` tensors, not a tower: a picture gets the
    node's error, and make-demo-model writes the Qwen-Image demo again."""
    from safetensors.torch import load_file, save_file

    from nodes.demo.qwen_image import DEMO_QWEN25, make_qwen_image_demo, qwen_image_demo_is_current
    from nodes.family_nodes.qwen_image_edit import QwenEditError

    make_qwen_image_demo(tmp_path)
    assert qwen_image_demo_is_current(tmp_path)
    path = tmp_path / "text_encoders" / DEMO_QWEN25
    tensors = {k: v for k, v in load_file(str(path)).items() if not k.startswith("visual.")}
    tensors |= {
        "visual.patch_embed.proj.weight": torch.zeros(16, 3, 2, 14, 14),
        "visual.merger.mlp.0.weight": torch.zeros(16, 64),
    }
    save_file(tensors, str(path))
    assert not qwen_image_demo_is_current(tmp_path)
    with pytest.raises(
        QwenEditError, match="TextEncodeQwenImageEditPlus: the text encoder file .* no Qwen2.5-VL vision"
    ):
        TextEncodeQwenImageEditPlus().run(
            make_ctx(), clip=open_text_encoders([path], "qwen_image"), prompt="x", image1=picture(28, 28)
        )
