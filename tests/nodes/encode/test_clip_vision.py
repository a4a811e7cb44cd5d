"""CLIP vision: preprocessing equal to CLIPImageProcessor, the transformers and OpenCLIP file layouts
(architecture read from shapes), the encode node's outputs, memory-manager loading and bad files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from nodes.core.weights import ModelLoadError
from nodes.demo.vision import tiny_clip_vision
from nodes.encode.clip_vision import CLIPVisionEncode, ClipVisionHandle, CLIPVisionLoader, preprocess

CONFIGS = Path(__file__).resolve().parents[3] / "models" / "configs"
LEVEL = 1 / 255 / 0.2613  # one 8-bit level after normalisation (smallest CLIP std)


def _to_open_clip(sd: dict[str, torch.Tensor], prefix: str = "visual.") -> dict[str, torch.Tensor]:
    """transformers CLIPVisionModelWithProjection keys → OpenCLIP's visual tower (the inverse map)."""
    out: dict[str, torch.Tensor] = {}
    top = {
        "embeddings.patch_embedding.weight": "conv1.weight",
        "embeddings.class_embedding": "class_embedding",
        "embeddings.position_embedding.weight": "positional_embedding",
        "pre_layrnorm.weight": "ln_pre.weight",
        "pre_layrnorm.bias": "ln_pre.bias",
        "post_layernorm.weight": "ln_post.weight",
        "post_layernorm.bias": "ln_post.bias",
    }
    names = {
        "layer_norm1": "ln_1",
        "layer_norm2": "ln_2",
        "self_attn.out_proj": "attn.out_proj",
        "mlp.fc1": "mlp.c_fc",
        "mlp.fc2": "mlp.c_proj",
    }
    layers = {int(k.split(".")[3]) for k in sd if k.startswith("vision_model.encoder.layers.")}
    for k, v in sd.items():
        short = k.removeprefix("vision_model.")
        if short in top:
            out[prefix + top[short]] = v
    out[prefix + "proj"] = sd["visual_projection.weight"].t().contiguous()
    for i in layers:
        base = f"vision_model.encoder.layers.{i}."
        for kind in ("weight", "bias"):
            qkv = [sd[f"{base}self_attn.{p}_proj.{kind}"] for p in "qkv"]
            out[f"{prefix}transformer.resblocks.{i}.attn.in_proj_{kind}"] = torch.cat(qkv)
            for ours, theirs in names.items():
                out[f"{prefix}transformer.resblocks.{i}.{theirs}.{kind}"] = sd[f"{base}{ours}.{kind}"]
    return out


def _image(h: int, w: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(1, h, w, 3, generator=g) * 255).round() / 255


@pytest.mark.parametrize(("h", "w"), [(224, 224), (300, 400), (512, 256), (231, 517)])
def test_preprocess_equals_clip_image_processor(h: int, w: int) -> None:
    from transformers import CLIPImageProcessor

    proc = CLIPImageProcessor.from_pretrained(CONFIGS / "clip_vision")
    image = _image(h, w)
    ref = proc((image[0].numpy() * 255).round().astype(np.uint8), return_tensors="pt").pixel_values
    ours = preprocess(image, 224, "center")
    diff = (ref - ours).abs()
    assert ours.shape == ref.shape == (1, 3, 224, 224)
    assert diff.max() <= LEVEL * 1.01  # one 8-bit level at most ...
    assert (diff > 1e-4).float().mean() < 0.005  # ... on a few pixels (PIL's fixed-point rounding)


def test_crop_none_squashes_whole_image() -> None:
    image = torch.zeros(1, 100, 400, 3)
    image[:, :, :50] = 1.0  # a white stripe at the far left: cropped away by "center", kept by "none"
    center, squashed = preprocess(image, 224, "center"), preprocess(image, 224, "none")
    assert center.shape == squashed.shape == (1, 3, 224, 224)
    assert center[..., :10].max() < 0 < squashed[..., :10].min()
    with pytest.raises(TypeError, match="must be an IMAGE"):
        preprocess(torch.zeros(1, 4, 8, 8), 224, "center")


@pytest.fixture(scope="module")
def vision_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    """The same tiny encoder as a transformers folder, a bare single file and an OpenCLIP file."""
    root = tmp_path_factory.mktemp("clip_vision")
    model = tiny_clip_vision(seed=4)
    model.save_pretrained(root / "hf")
    sd = {k: v.contiguous() for k, v in model.state_dict().items() if not k.endswith("position_ids")}
    save_file(sd, str(root / "bare.safetensors"))
    save_file(_to_open_clip(sd), str(root / "open_clip_vit.safetensors"))
    save_file({"image_proj.proj.weight": torch.zeros(4, 4)}, str(root / "ip.safetensors"))
    return model, root


@pytest.mark.parametrize("name", ["hf/model.safetensors", "bare.safetensors", "open_clip_vit.safetensors"])
def test_layouts_load_to_the_same_model(
    vision_files: tuple[Any, Path], name: str, make_ctx: Any, model_folders: Any
) -> None:
    model, root = vision_files
    model_folders.add_folder("clip_vision", root)
    ctx = make_ctx()
    handle = CLIPVisionLoader().run(ctx, clip_name=name)[0]
    assert handle.layout == ("open_clip" if "open_clip" in name else "transformers")
    assert (handle.embed_dim, handle.hidden_size, handle.image_size) == (32, 32, 224)
    image = _image(160, 200, seed=2)
    out = CLIPVisionEncode().run(ctx, clip_vision=handle, image=image, crop="center")[0]
    with torch.no_grad():
        ref = model(pixel_values=preprocess(image, 224, "center"), output_hidden_states=True)
    assert torch.allclose(out.image_embeds, ref.image_embeds, atol=1e-5)
    assert torch.allclose(out.last_hidden_state, ref.last_hidden_state, atol=1e-5)
    assert torch.allclose(out.penultimate_hidden_states, ref.hidden_states[-2], atol=1e-5)
    assert [x["kind"] for x in ctx.models.stats()["loads"]] == ["clip_vision"]


def test_bad_files_teach(vision_files: tuple[Any, Path]) -> None:
    _, root = vision_files
    with pytest.raises(ModelLoadError, match="IP-Adapter file; put it in models/ipadapter"):
        ClipVisionHandle.from_file(root / "ip.safetensors")
    (root / "enc.bin").write_bytes(b"\x80\x02}q\x00.")
    with pytest.raises(ModelLoadError, match="refusing to load a pickled"):
        ClipVisionHandle.from_file(root / "enc.bin")
