"""Save Image (Advanced) and Image Compare (nodes/image/save_advanced.py, image_encodings.py): the
files each format option writes, read back independently, with the workflow embedded; and the
options a format does not have refused with the ones it has."""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from engine.context import Folders, NodeContext
from engine.registry import NodeRegistry
from engine.validate import validate_node
from nodes.image import image_encodings as enc
from nodes.image import save_advanced as s

PROMPT = {"1": {"class_type": "SaveImageAdvanced", "inputs": {}}}
WORKFLOW = {"nodes": [], "note": "héllo"}


@pytest.fixture
def ctx(tmp_path: Path) -> NodeContext:
    folders = Folders(tmp_path / "in", tmp_path / "out", tmp_path / "tmp")
    folders.ensure()
    return NodeContext(node_id="9", prompt_id="p", folders=folders)


def save(ctx: NodeContext, images: torch.Tensor, format: str, **options: Any) -> tuple[Any, list[Path]]:
    out = s.SaveImageAdvanced().run(
        ctx,
        images=images,
        filename_prefix="adv/test",
        format=format,
        prompt=PROMPT,
        extra_pnginfo={"workflow": WORKFLOW},
        **{f"format.{k}": v for k, v in options.items()},
    )
    files = [ctx.folders.output_dir / e["subfolder"] / e["filename"] for e in out.ui["images"]]
    return out, files


def gradient(batch: int = 1, channels: int = 3, h: int = 4, w: int = 6) -> torch.Tensor:
    values = torch.linspace(0, 1, batch * h * w * channels).reshape(batch, h, w, channels)
    return values


def png_chunks(data: bytes) -> dict[bytes, list[bytes]]:
    chunks: dict[bytes, list[bytes]] = {}
    pos = 8
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        chunks.setdefault(kind, []).append(data[pos + 8 : pos + 8 + length])
        pos += 12 + length
    return chunks


def test_png_8_bit_is_comfyuis_png_with_the_workflow(ctx: NodeContext) -> None:
    images = gradient(batch=2)
    out, files = save(ctx, images, "png", bit_depth="8-bit", input_color_space="sRGB")
    assert out.values[0] is images
    assert [f.name for f in files] == ["test_00001_.png", "test_00002_.png"]
    with Image.open(files[0]) as im:
        assert im.mode == "RGB" and im.size == (6, 4)
        assert json.loads(im.text["prompt"]) == PROMPT and json.loads(im.text["workflow"]) == WORKFLOW


def test_png_16_bit_keeps_16_bit_values(ctx: NodeContext) -> None:
    grey = torch.tensor([0.0, 0.25, 0.5, 1.0]).reshape(1, 1, 4, 1)
    _, files = save(ctx, grey, "png", bit_depth="16-bit")
    with Image.open(files[0]) as im:  # Pillow reads 16-bit grey exactly
        assert im.mode in ("I;16", "I;16B", "I")
        assert list(np.asarray(im).reshape(-1)) == [0, 16384, 32768, 65535]  # round(v * 65535)
    data = files[0].read_bytes()
    chunks = png_chunks(data)
    width, height, depth, color_type = struct.unpack(">IIBB", chunks[b"IHDR"][0][:10])
    assert (width, height, depth, color_type) == (4, 1, 16, 0)
    texts = {c.split(b"\0", 1)[0]: c for c in chunks.get(b"tEXt", []) + chunks.get(b"iTXt", [])}
    assert b"prompt" in texts and b"workflow" in texts
    assert json.loads(texts[b"workflow"].split(b"\0", 1)[1]) == WORKFLOW  # JSON as SaveImage writes it


def test_png_text_outside_latin_1_goes_in_itxt() -> None:
    chunks = png_chunks(enc.png16(np.zeros((1, 1, 3)), {"note": "日本"}))
    assert b"tEXt" not in chunks
    assert chunks[b"iTXt"] == [b"note\0\0\0\0\0" + "日本".encode()]


def test_png_16_bit_rgb_rows(ctx: NodeContext) -> None:
    image = torch.zeros(1, 2, 1, 3)
    image[0, 1, 0] = torch.tensor([1.0, 0.5, 0.0])
    _, files = save(ctx, image, "png", bit_depth="16-bit")
    idat = b"".join(png_chunks(files[0].read_bytes())[b"IDAT"])
    rows = zlib.decompress(idat)
    assert rows == b"\0" + b"\0" * 6 + b"\0" + struct.pack(">HHH", 65535, 32768, 0)


def exr_header(data: bytes) -> tuple[dict[str, tuple[str, bytes]], int]:
    assert data[:4] == b"\x76\x2f\x31\x01"
    pos, attrs = 8, {}
    while data[pos] != 0:
        name_end = data.index(b"\0", pos)
        type_end = data.index(b"\0", name_end + 1)
        (size,) = struct.unpack("<i", data[type_end + 1 : type_end + 5])
        value = data[type_end + 5 : type_end + 5 + size]
        attrs[data[pos:name_end].decode()] = (data[name_end + 1 : type_end].decode(), value)
        pos = type_end + 5 + size
    return attrs, pos + 1


@pytest.mark.parametrize(
    ("bit_depth", "dtype", "pixel_type"), [("16-bit float", "<f2", 1), ("32-bit float", "<f4", 2)]
)
def test_exr_is_scene_linear_with_its_gamut(
    ctx: NodeContext, bit_depth: str, dtype: str, pixel_type: int
) -> None:
    image = torch.full((1, 2, 3, 3), 0.5)
    image[..., 2] = 1.0
    _, files = save(ctx, image, "exr", bit_depth=bit_depth, input_color_space="sRGB")
    assert files[0].suffix == ".exr"
    data = files[0].read_bytes()
    attrs, end = exr_header(data)
    assert attrs["compression"][1] == b"\0"
    assert struct.unpack("<iiii", attrs["dataWindow"][1]) == (0, 0, 2, 1)
    chlist = attrs["channels"][1]
    assert chlist.startswith(b"B\0" + struct.pack("<i", pixel_type))  # channels sorted: B, G, R
    assert struct.unpack("<8f", attrs["chromaticities"][1])[:2] == pytest.approx((0.64, 0.33))
    assert "prompt" in attrs and attrs["prompt"][0] == "string"
    (first_line,) = struct.unpack("<Q", data[end : end + 8])
    y, size = struct.unpack("<ii", data[first_line : first_line + 8])
    width = np.dtype(dtype).itemsize * 3
    assert (y, size) == (0, 3 * width)
    row = np.frombuffer(data[first_line + 8 : first_line + 8 + size], dtype=dtype)
    blue, green, red = row[0:3], row[3:6], row[6:9]
    assert blue == pytest.approx([1.0] * 3, abs=1e-3)
    assert red == pytest.approx([0.21404] * 3, abs=1e-3)  # sRGB 0.5 is 21.4 % linear light
    assert green == pytest.approx(red)


def test_transfer_functions_known_values() -> None:
    assert enc.srgb_to_linear(np.array([0.0, 0.04045, 0.5, 1.0])) == pytest.approx(
        [0.0, 0.04045 / 12.92, 0.214041, 1.0], abs=1e-6
    )
    assert enc.hlg_to_linear(np.array([0.0, 0.5, 1.0])) == pytest.approx([0.0, 1 / 12, 1.0], abs=1e-5)


def test_exr_acescg_and_linear_pass_through(ctx: NodeContext) -> None:
    image = torch.full((1, 1, 1, 3), 0.5)
    _, files = save(ctx, image, "exr", bit_depth="32-bit float", input_color_space="linear ACEScg")
    data = files[0].read_bytes()
    attrs, end = exr_header(data)
    assert struct.unpack("<8f", attrs["chromaticities"][1])[6:] == pytest.approx((0.32168, 0.33767))
    (line,) = struct.unpack("<Q", data[end : end + 8])
    assert np.frombuffer(data[line + 8 : line + 20], dtype="<f4") == pytest.approx([0.5] * 3)


def test_avif_still_and_animated(ctx: NodeContext) -> None:
    images = gradient(batch=3, h=16, w=16)
    _, stills = save(
        ctx, images, "avif", bit_depth="auto", input_color_space="sRGB", crf=18, save_mode="still images"
    )
    assert len(stills) == 3
    with Image.open(stills[0]) as im:
        assert im.format == "AVIF" and im.size == (16, 16)
        exif = im.getexif()
        assert exif[0x0110].startswith("prompt:") and exif[0x010F].startswith("workflow:")
    out, animated = save(
        ctx,
        images,
        "avif",
        crf=30,
        save_mode="animated",
        **{"save_mode.fps": 12.0, "save_mode.loop_count": 0},
    )
    assert len(animated) == 1 and out.ui["animated"] == [True]
    with Image.open(animated[0]) as im:
        assert getattr(im, "n_frames", 1) == 3


@pytest.mark.parametrize(
    ("format", "options", "says"),
    [
        ("png", {"bit_depth": "32-bit float"}, "not one of png's: 8-bit, 16-bit"),
        ("png", {"input_color_space": "HDR"}, "input_color_space 'HDR' is not one of png's: sRGB"),
        ("exr", {"bit_depth": "8-bit"}, "not one of exr's"),
        ("avif", {"bit_depth": "10-bit YUV420"}, "8-bit YUV 4:2:0 sRGB only"),
        ("avif", {"input_color_space": "HDR PQ"}, "save HDR as EXR"),
    ],
)
def test_options_a_format_lacks_are_refused(
    ctx: NodeContext, format: str, options: dict[str, str], says: str
) -> None:
    with pytest.raises(ValueError, match=says):
        save(ctx, gradient(), format, **options)
    assert not list(ctx.folders.output_dir.rglob("*.*"))  # nothing half-written


@pytest.mark.parametrize(
    ("format", "channels", "says"),
    [("png", 2, "PNG takes 1, 3 or 4"), ("exr", 2, "EXR takes"), ("avif", 4, "AVIF takes 1")],
)
def test_channel_counts_a_format_cannot_hold(ctx: NodeContext, format: str, channels: int, says: str) -> None:
    depth = {"png": "16-bit", "exr": "16-bit float", "avif": "auto"}[format]
    with pytest.raises(enc.EncodingError, match=says):
        save(ctx, gradient(channels=channels), format, bit_depth=depth)


def test_dynamic_combo_declares_what_reveals_each_option() -> None:
    by_name = {i.name: i for i in s.SaveImageAdvanced.SCHEMA.inputs}
    assert [i.name for i in s.SaveImageAdvanced.SCHEMA.inputs][:4] == [
        "images",
        "filename_prefix",
        "format",
        "format.bit_depth",
    ]
    assert by_name["format.crf"].extra["revealed_by"] == {"input": "format", "choices": ["avif"]}
    assert by_name["format.save_mode.fps"].extra["revealed_by"] == {
        "input": "format.save_mode",
        "choices": ["animated"],
    }


def test_image_compare_previews_both_sides_and_takes_the_view_value(ctx: NodeContext) -> None:
    out = s.ImageCompare().run(ctx, image_a=gradient(), image_b=None)
    assert len(out.ui["a_images"]) == 1 and out.ui["b_images"] == []
    entry = out.ui["a_images"][0]
    assert entry["type"] == "temp" and (ctx.folders.temp_dir / entry["filename"]).is_file()
    registry = NodeRegistry()
    registry.register_all(s.NODES)
    view = {"before": "/api/view?filename=a.png&type=temp", "after": "/api/view?filename=b.png&type=temp"}
    prompt = {"1": {"class_type": "ImageCompare", "inputs": {"compare_view": view}}}
    issues, _ = validate_node("1", prompt, registry)
    assert issues == []
