"""Latent and image nodes: sizes, VAE round trips, tiling, masks, load/save/preview with metadata."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from nodes.image.load_save import (
    EmptyImage,
    ImageInvert,
    ImageScale,
    ImageScaleBy,
    LoadImage,
    PreviewImage,
    SaveImage,
)
from nodes.latent.vae import (
    EmptyLatentImage,
    LatentUpscale,
    LatentUpscaleBy,
    SetLatentNoiseMask,
    VAEDecode,
    VAEDecodeTiled,
    VAEEncode,
    VAEEncodeForInpaint,
    VAEEncodeTiled,
)
from nodes.load.handles import open_checkpoint
from tests.nodes.latent.gen_fixtures import gradient_image


def test_empty_latent_shape_and_multiple_of_8_error(make_ctx: Any) -> None:
    out = EmptyLatentImage().run(make_ctx(), width=64, height=48, batch_size=2)[0]
    assert out["samples"].shape == (2, 4, 6, 8) and not out["samples"].any()
    message = EmptyLatentImage.validate_inputs(width=500, height=512, batch_size=1)
    assert isinstance(message, str) and "width=500 is not a multiple of 8" in message
    with pytest.raises(ValueError, match="multiple of 8"):
        EmptyLatentImage().run(make_ctx(), width=64, height=60, batch_size=1)


def test_latent_upscale_keeps_extras() -> None:
    latent = {"samples": torch.randn(1, 4, 8, 8), "batch_index": [3]}
    up = LatentUpscale().run(
        None, samples=latent, upscale_method="bilinear", width=128, height=0, crop="disabled"
    )[0]  # type: ignore[arg-type]
    assert up["samples"].shape == (1, 4, 16, 16) and up["batch_index"] == [3]
    by = LatentUpscaleBy().run(None, samples=latent, upscale_method="nearest-exact", scale_by=1.5)[0]  # type: ignore[arg-type]
    assert by["samples"].shape == (1, 4, 12, 12)


def test_vae_round_trip_and_tiling(tiny_sd15_ckpt: Any, make_ctx: Any) -> None:
    ck = open_checkpoint(tiny_sd15_ckpt)
    ctx = make_ctx()
    image = gradient_image(128)
    latent = VAEEncode().run(ctx, pixels=image, vae=ck.vae)[0]
    assert latent["samples"].shape == (1, 4, 16, 16)
    decoded = VAEDecode().run(ctx, samples=latent, vae=ck.vae)[0]
    assert decoded.shape == (1, 128, 128, 3) and 0 <= decoded.min() and decoded.max() <= 1
    tiled = VAEDecodeTiled().run(ctx, samples=latent, vae=ck.vae, tile_size=64, overlap=32)[0]
    assert tiled.shape == decoded.shape and torch.isfinite(tiled).all()
    one_tile = VAEDecodeTiled().run(ctx, samples=latent, vae=ck.vae, tile_size=128, overlap=0)[0]
    assert torch.allclose(one_tile, decoded, atol=1e-5)
    enc_tiled = VAEEncodeTiled().run(ctx, pixels=image, vae=ck.vae, tile_size=64, overlap=32)[0]
    assert enc_tiled["samples"].shape == latent["samples"].shape


def test_tile_blending_is_exact_for_a_local_function() -> None:
    from nodes.latent.vae import tiled

    x = torch.randn(2, 4, 20, 28)

    def up8(z: torch.Tensor) -> torch.Tensor:  # pointwise + nearest upscale: tiling must not show
        return (z * 2 + 1).repeat_interleave(8, -1).repeat_interleave(8, -2)

    assert torch.allclose(tiled(x, up8, 8, 4, 8.0), up8(x), atol=1e-5)
    assert torch.allclose(
        tiled(up8(x), lambda p: p[..., ::8, ::8], 64, 32, 1 / 8), up8(x)[..., ::8, ::8], atol=1e-5
    )


def test_inpaint_masks(tiny_sd15_ckpt: Any, make_ctx: Any) -> None:
    ck = open_checkpoint(tiny_sd15_ckpt)
    ctx = make_ctx()
    mask = torch.zeros(1, 64, 64)
    mask[:, 16:48, 16:48] = 1
    latent = VAEEncodeForInpaint().run(ctx, pixels=gradient_image(64), vae=ck.vae, mask=mask, grow_mask_by=6)[
        0
    ]
    assert latent["noise_mask"].shape == (1, 1, 64, 64) and latent["noise_mask"][0, 0, 12, 12] == 1
    plain = SetLatentNoiseMask().run(ctx, samples={"samples": torch.zeros(1, 4, 8, 8)}, mask=mask)[0]
    assert plain["noise_mask"].shape == (1, 1, 64, 64)


def test_load_image_alpha_mask_and_errors(make_ctx: Any) -> None:
    ctx = make_ctx()
    rgba = np.zeros((16, 24, 4), dtype=np.uint8)
    rgba[..., 0] = 255
    rgba[..., 3] = 255
    rgba[:8, :, 3] = 0  # top half transparent
    Image.fromarray(rgba, "RGBA").save(ctx.folders.input_dir / "red.png")
    image, mask = LoadImage().run(ctx, image="red.png")
    assert image.shape == (1, 16, 24, 3) and image[0, 0, 0, 0] == 1.0
    assert mask.shape == (1, 16, 24) and mask[0, 0, 0] == 1.0 and mask[0, 15, 0] == 0.0
    assert LoadImage.fingerprint(ctx.folders, image="red.png") != LoadImage.fingerprint(
        ctx.folders, image="x.png"
    )

    (ctx.folders.input_dir / "notes.png").write_text("not an image")
    with pytest.raises(ValueError, match="'notes.png' is not an image"):
        LoadImage().run(ctx, image="notes.png")
    with pytest.raises(ValueError, match="'missing.png' not found in the input folder"):
        LoadImage().run(ctx, image="missing.png")
    with pytest.raises(ValueError, match="outside the input folder"):
        LoadImage().run(ctx, image="../../etc/passwd")


def test_save_image_counters_subfolders_and_metadata(make_ctx: Any) -> None:
    ctx = make_ctx()
    images = torch.rand(2, 8, 8, 3)
    prompt = {"1": {"class_type": "EmptyImage", "inputs": {}}}
    workflow = {"nodes": [], "links": []}
    out = SaveImage().run(
        ctx, images=images, filename_prefix="renders/cat", prompt=prompt, extra_pnginfo={"workflow": workflow}
    )
    names = [i["filename"] for i in out.ui["images"]]  # type: ignore[index]
    assert names == ["cat_00001_.png", "cat_00002_.png"]
    assert out.ui["images"][0]["subfolder"] == "renders" and out.ui["images"][0]["type"] == "output"  # type: ignore[index]
    again = SaveImage().run(ctx, images=images[:1], filename_prefix="renders/cat", prompt=prompt)
    assert again.ui["images"][0]["filename"] == "cat_00003_.png"  # type: ignore[index]
    with Image.open(ctx.folders.output_dir / "renders" / "cat_00001_.png") as png:
        assert json.loads(png.text["prompt"]) == prompt and json.loads(png.text["workflow"]) == workflow
        saved = np.asarray(png, dtype=np.float32) / 255
    # ComfyUI's quantisation: uint8(clip(255 * x)), truncated, not rounded
    expected = np.floor(np.clip(images[0].numpy() * 255, 0, 255)) / 255
    assert np.array_equal(saved, expected.astype(np.float32))

    quiet = make_ctx(png_metadata=False)
    SaveImage().run(quiet, images=images[:1], filename_prefix="plain", prompt=prompt)
    with Image.open(quiet.folders.output_dir / "plain_00001_.png") as png:
        assert "prompt" not in png.text
    with pytest.raises(ValueError, match="outside the output folder"):
        SaveImage().run(ctx, images=images, filename_prefix="../escape")


def test_preview_and_image_ops(make_ctx: Any) -> None:
    ctx = make_ctx()
    red = EmptyImage().run(ctx, width=20, height=10, batch_size=2, color=0xFF0000)[0]
    assert red.shape == (2, 10, 20, 3) and red[0, 0, 0].tolist() == [1.0, 0.0, 0.0]
    assert ImageInvert().run(ctx, image=red)[0][0, 0, 0].tolist() == [0.0, 1.0, 1.0]
    assert ImageScale().run(ctx, image=red, upscale_method="lanczos", width=40, height=0, crop="disabled")[
        0
    ].shape == (2, 20, 40, 3)
    assert ImageScale().run(ctx, image=red, upscale_method="bilinear", width=10, height=10, crop="center")[
        0
    ].shape == (2, 10, 10, 3)
    assert ImageScaleBy().run(ctx, image=red, upscale_method="area", scale_by=0.5)[0].shape == (2, 5, 10, 3)
    out = PreviewImage().run(ctx, images=red)
    first = out.ui["images"][0]  # type: ignore[index]
    assert first["type"] == "temp" and (ctx.folders.temp_dir / first["filename"]).is_file()
