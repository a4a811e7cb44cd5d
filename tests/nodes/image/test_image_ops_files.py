"""Image files (nodes/image/files.py): LoadImageMask, LoadImageOutput, SaveAnimatedWEBP and
SaveAnimatedPNG (naming, frames, embedded workflow as ComfyUI writes it, guard, kept bytes)."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image, ImageSequence

from engine.image_guard import Guarded, Verdict
from engine.registry import NodeRegistry
from nodes.image.files import (
    LoadImageMask,
    LoadImageOutput,
    SaveAnimatedPNG,
    SaveAnimatedWEBP,
    list_output_images,
    register_output_options,
)
from tests.nodes.image.image_ctx import image_ctx


@pytest.fixture()
def ctx(tmp_path: Path) -> Any:
    return image_ctx(tmp_path)


def _rgba_file(path: Path) -> None:
    rgba = np.zeros((4, 6, 4), dtype=np.uint8)
    rgba[..., 0], rgba[..., 1], rgba[..., 2] = 255, 128, 0
    rgba[..., 3] = 255
    rgba[:2, :, 3] = 0  # top half transparent
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(rgba, "RGBA").save(path)


@pytest.mark.parametrize(
    ("channel", "top", "bottom"), [("alpha", 1.0, 0.0), ("red", 1.0, 1.0), ("blue", 0.0, 0.0)]
)
def test_load_image_mask_channels(ctx: Any, channel: str, top: float, bottom: float) -> None:
    _rgba_file(ctx.folders.input_dir / "a.png")
    mask = LoadImageMask().run(ctx, image="a.png", channel=channel)[0]
    assert mask.shape == (1, 4, 6) and mask[0, 0, 0] == top and mask[0, 3, 0] == bottom
    green = LoadImageMask().run(ctx, image="a.png", channel="green")[0]
    assert green[0, 3, 0].item() == pytest.approx(128 / 255)


def test_load_image_mask_missing_file_says_where(ctx: Any) -> None:
    with pytest.raises(ValueError, match="'gone.png' not found in the input folder"):
        LoadImageMask().run(ctx, image="gone.png", channel="alpha")


def test_load_image_output_reads_annotated_output_names(ctx: Any) -> None:
    _rgba_file(ctx.folders.output_dir / "renders" / "b.png")
    image, mask = LoadImageOutput().run(ctx, image="renders/b.png [output]")
    assert image.shape == (1, 4, 6, 3) and mask[0, 0, 0] == 1
    with pytest.raises(ValueError, match="outside the output folder"):
        LoadImageOutput().run(ctx, image="../../x.png [output]")
    assert LoadImageOutput.fingerprint(ctx.folders, image="renders/b.png [output]") != "missing"


def test_output_images_are_listed_newest_first_for_the_combo(ctx: Any) -> None:
    _rgba_file(ctx.folders.output_dir / "old.png")
    _rgba_file(ctx.folders.output_dir / "sub" / "new.png")
    os.utime(ctx.folders.output_dir / "old.png", (1, 1))
    assert list_output_images(ctx.folders.output_dir) == ["sub/new.png [output]", "old.png [output]"]
    registry = NodeRegistry()
    registry.register_all([LoadImageOutput], origin="core")
    register_output_options(registry, ctx.folders.output_dir)
    spec = registry.object_info("LoadImageOutput")["LoadImageOutput"]["input"]["required"]["image"]
    assert spec[0] == ["sub/new.png [output]", "old.png [output]"]
    assert spec[1]["image_folder"] == "output" and spec[1]["remote"]["route"] == "/internal/files/output"


FRAMES = torch.stack([torch.full((4, 5, 3), v) for v in (0.0, 0.5, 1.0)])
PROMPT = {"1": {"class_type": "EmptyImage", "inputs": {}}}
WORKFLOW: dict[str, list[Any]] = {"nodes": [], "links": []}


def test_animated_webp_frames_names_and_exif_metadata(ctx: Any) -> None:
    out = SaveAnimatedWEBP().run(
        ctx,
        images=FRAMES,
        filename_prefix="anim/clip",
        fps=10.0,
        lossless=True,
        quality=80,
        method="fastest",
        prompt=PROMPT,
        extra_pnginfo={"workflow": WORKFLOW},
    )
    assert out.ui == {
        "images": [{"filename": "clip_00001_.webp", "subfolder": "anim", "type": "output"}],
        "animated": (True,),
    }
    path = ctx.folders.output_dir / "anim" / "clip_00001_.webp"
    with Image.open(path) as webp:
        webp.load()
        assert getattr(webp, "n_frames", 1) == 3 and webp.info["duration"] == 100
        frames = [np.asarray(f.convert("RGB")) for f in ImageSequence.Iterator(webp)]
        exif = webp.getexif()
    assert [f[0, 0, 0] for f in frames] == [0, 127, 255]  # lossless, 0.5 truncates to 127 as in ComfyUI
    assert json.loads(exif[0x0110].removeprefix("prompt:")) == PROMPT
    assert json.loads(exif[0x010F].removeprefix("workflow:")) == WORKFLOW
    again = SaveAnimatedWEBP().run(
        ctx,
        images=FRAMES[:1],
        filename_prefix="anim/clip",
        fps=6.0,
        lossless=False,
        quality=50,
        method="default",
    )
    assert again.ui == {"images": [{"filename": "clip_00002_.webp", "subfolder": "anim", "type": "output"}]}


def test_animated_png_frames_and_comf_chunks(ctx: Any) -> None:
    SaveAnimatedPNG().run(
        ctx,
        images=FRAMES,
        filename_prefix="clip",
        fps=4.0,
        compress_level=1,
        prompt=PROMPT,
        extra_pnginfo={"workflow": WORKFLOW},
    )
    data = (ctx.folders.output_dir / "clip_00001_.png").read_bytes()
    with Image.open(ctx.folders.output_dir / "clip_00001_.png") as png:
        assert getattr(png, "n_frames", 1) == 3 and png.info["duration"] == 250
    assert b"comfprompt\x00" + json.dumps(PROMPT).encode() in data
    assert b"comfworkflow\x00" + json.dumps(WORKFLOW).encode() in data
    assert data.index(b"comfprompt") > data.index(b"IDAT")  # after the image data, as ComfyUI writes
    SaveAnimatedPNG().run(ctx, images=FRAMES, filename_prefix="clip", fps=4.0, compress_level=1)
    assert (ctx.folders.output_dir / "clip_00002_.png").is_file()  # shares SaveImage's counter


def test_animated_savers_honour_no_metadata_and_keep_bytes(tmp_path: Path) -> None:
    ctx = image_ctx(tmp_path, keep=True, png_metadata=False)
    out = SaveAnimatedPNG().run(
        ctx, images=FRAMES, filename_prefix="c", fps=1.0, compress_level=1, prompt=PROMPT
    )
    data = (ctx.folders.output_dir / "c_00001_.png").read_bytes()
    assert b"comf" not in data
    assert ctx.kept_images is not None and ctx.kept_images.data["output//c_00001_.png"] == data
    assert out.ui is not None


@dataclasses.dataclass
class _BlackGuard:
    policy: str = "enforce"

    def check_images(self, images: Any) -> Guarded:
        return Guarded(torch.zeros_like(images), tuple(Verdict(True, "black") for _ in images))


def test_animated_savers_pass_the_guard(tmp_path: Path) -> None:
    ctx = dataclasses.replace(image_ctx(tmp_path), image_guard=_BlackGuard())  # type: ignore[arg-type]
    SaveAnimatedPNG().run(ctx, images=FRAMES, filename_prefix="g", fps=1.0, compress_level=1)
    with Image.open(ctx.folders.output_dir / "g_00001_.png") as png:
        assert "loom_safety" in png.info
        assert all(np.asarray(f.convert("RGB")).max() == 0 for f in ImageSequence.Iterator(png))
    SaveAnimatedWEBP().run(
        ctx, images=FRAMES, filename_prefix="g", fps=1.0, lossless=True, quality=80, method="default"
    )
    with Image.open(ctx.folders.output_dir / "g_00002_.webp") as webp:
        assert all(np.asarray(f.convert("RGB")).max() == 0 for f in ImageSequence.Iterator(webp))
