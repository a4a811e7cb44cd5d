"""Image file encodings beyond Pillow's 8-bit PNG: 16-bit PNG, OpenEXR (half/float, scene-linear)
and AVIF, with the transfer functions SaveImageAdvanced's colour spaces need.

The PNG and EXR writers are written here (both formats are simple: PNG is zlib-compressed rows in
chunks, EXR an uncompressed scanline file); AVIF goes through Pillow's AVIF plugin, which writes
8-bit YUV 4:2:0.
"""

from __future__ import annotations

import io
import json
import struct
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

# CIE xy of the red, green, blue primaries and the white point (OpenEXR's chromaticities attribute)
REC709 = (0.64, 0.33, 0.30, 0.60, 0.15, 0.06, 0.3127, 0.3290)
REC2020 = (0.708, 0.292, 0.170, 0.797, 0.131, 0.046, 0.3127, 0.3290)
ACES_AP1 = (0.713, 0.293, 0.165, 0.830, 0.128, 0.044, 0.32168, 0.33767)

HLG_A = 0.17883277
HLG_B = 1.0 - 4.0 * HLG_A
HLG_C = 0.5 - HLG_A * float(np.log(4.0 * HLG_A))


class EncodingError(ValueError):
    """Pixels a format cannot hold (channel count, bit depth); the message says what it takes."""


def srgb_to_linear(x: np.ndarray) -> np.ndarray:
    """The inverse sRGB EOTF (IEC 61966-2-1), on values in 0..1."""
    return np.where(x <= 0.04045, x / 12.92, ((x + 0.055) / 1.055) ** 2.4)


def hlg_to_linear(x: np.ndarray) -> np.ndarray:
    """The inverse HLG OETF (ITU-R BT.2100): signal 0..1 to scene-linear light 0..1."""
    x = np.clip(x, 0.0, 1.0)
    high = (np.exp((np.maximum(x, 0.5) - HLG_C) / HLG_A) + HLG_B) / 12.0
    return np.where(x <= 0.5, x * x / 3.0, high)


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return (
        struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    )


def _png_text(key: str, value: str) -> bytes:
    try:
        return _png_chunk(b"tEXt", key.encode("latin-1") + b"\0" + value.encode("latin-1"))
    except UnicodeEncodeError:  # PNG's tEXt is Latin-1; anything else goes in iTXt (UTF-8)
        return _png_chunk(b"iTXt", key.encode("latin-1") + b"\0\0\0\0\0" + value.encode("utf-8"))


def png16(pixels: np.ndarray, text: Mapping[str, str], compress_level: int = 4) -> bytes:
    """A 16-bit PNG of ``pixels`` ([H, W, C] floats in 0..1, C = 1, 3 or 4) with text chunks."""
    height, width, channels = pixels.shape
    color_type = {1: 0, 3: 2, 4: 6}.get(channels)
    if color_type is None:
        raise EncodingError(f"PNG takes 1, 3 or 4 channels; these images have {channels}")
    values = np.round(np.clip(pixels, 0.0, 1.0) * 65535.0).astype(">u2")
    rows = b"".join(b"\0" + values[y].tobytes() for y in range(height))  # filter type 0 per row
    header = struct.pack(">IIBBBBB", width, height, 16, color_type, 0, 0, 0)
    out = [b"\x89PNG\r\n\x1a\n", _png_chunk(b"IHDR", header)]
    out += [_png_text(k, v) for k, v in text.items()]
    out += [_png_chunk(b"IDAT", zlib.compress(rows, compress_level)), _png_chunk(b"IEND", b"")]
    return b"".join(out)


def _attribute(name: str, kind: str, value: bytes) -> bytes:
    return name.encode() + b"\0" + kind.encode() + b"\0" + struct.pack("<i", len(value)) + value


def exr(pixels: np.ndarray, half: bool, chromaticities: Sequence[float], strings: Mapping[str, str]) -> bytes:
    """An uncompressed scanline OpenEXR of scene-linear ``pixels`` ([H, W, C], C = 1, 3 or 4;
    half or 32-bit float) with the gamut's chromaticities and string attributes."""
    height, width, channels = pixels.shape
    names = {1: ["Y"], 3: ["R", "G", "B"], 4: ["R", "G", "B", "A"]}.get(channels)
    if names is None:
        raise EncodingError(f"EXR takes 1, 3 or 4 channels; these images have {channels}")
    order = sorted(range(channels), key=lambda i: names[i])  # EXR stores channels by name
    dtype, pixel_type = (np.dtype("<f2"), 1) if half else (np.dtype("<f4"), 2)
    chlist = (
        b"".join(names[i].encode() + b"\0" + struct.pack("<iB3xii", pixel_type, 0, 1, 1) for i in order)
        + b"\0"
    )
    box = struct.pack("<iiii", 0, 0, width - 1, height - 1)
    header = [
        _attribute("channels", "chlist", chlist),
        _attribute("chromaticities", "chromaticities", struct.pack("<8f", *chromaticities)),
        _attribute("compression", "compression", b"\0"),
        _attribute("dataWindow", "box2i", box),
        _attribute("displayWindow", "box2i", box),
        _attribute("lineOrder", "lineOrder", b"\0"),
        _attribute("pixelAspectRatio", "float", struct.pack("<f", 1.0)),
        _attribute("screenWindowCenter", "v2f", struct.pack("<ff", 0.0, 0.0)),
        _attribute("screenWindowWidth", "float", struct.pack("<f", 1.0)),
        *(_attribute(k, "string", v.encode("utf-8")) for k, v in strings.items()),
    ]
    head = b"\x76\x2f\x31\x01" + struct.pack("<i", 2) + b"".join(header) + b"\0"
    values = pixels.astype(dtype)
    lines = []
    for y in range(height):
        data = b"".join(values[y, :, i].tobytes() for i in order)
        lines.append(struct.pack("<ii", y, len(data)) + data)
    offsets, position = [], len(head) + 8 * height
    for line in lines:
        offsets.append(position)
        position += len(line)
    return head + struct.pack(f"<{height}Q", *offsets) + b"".join(lines)


def exif_metadata(metadata: Mapping[str, Any]) -> Any:
    """ComfyUI's way of putting the workflow into WebP/AVIF EXIF: ``prompt:{json}`` in tag 0x0110,
    each extra key as ``key:{json}`` from tag 0x010F downwards."""
    from PIL import Image  # lazy: PIL (~50 ms); only a save needs it

    exif = Image.Exif()
    tag = 0x010F
    for key, value in metadata.items():
        if key == "prompt":
            exif[0x0110] = "prompt:" + json.dumps(value)
        else:
            exif[tag] = f"{key}:{json.dumps(value)}"
            tag -= 1
    return exif


def avif(
    frames: Sequence[np.ndarray], quality: int, metadata: Mapping[str, Any], fps: float | None, loop: int
) -> bytes:
    """8-bit AVIF of 1- or 3-channel ``frames`` (floats 0..1): one still, or an animation at ``fps``."""
    from PIL import Image  # lazy: as above

    images = []
    for frame in frames:
        channels = frame.shape[-1]
        if channels not in (1, 3):
            raise EncodingError(f"AVIF takes 1 (grey) or 3 (RGB) channels; these images have {channels}")
        pixels = np.clip(255.0 * frame, 0, 255).astype(np.uint8)
        images.append(Image.fromarray(pixels[..., 0] if channels == 1 else pixels).convert("RGB"))
    buffer = io.BytesIO()
    options: dict[str, Any] = {"quality": quality, "subsampling": "4:2:0", "exif": exif_metadata(metadata)}
    if fps is not None and len(images) > 1:
        options.update(save_all=True, append_images=images[1:], duration=round(1000.0 / fps), loop=loop)
    images[0].save(buffer, format="AVIF", **options)
    return buffer.getvalue()
