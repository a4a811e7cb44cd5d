"""IMAGE post-processing nodes: blend, blur, sharpen, quantize, morphology, RGB <-> YUV (ComfyUI's
names, inputs and semantics; ``comfy_extras/nodes_post_processing.py`` and ``nodes_morphology.py``).

Morphology is written with max-pooling over a flat square structuring element, the borders left
out of the max/min (kornia's default "geodesic" border, which ComfyUI uses); no kornia needed.
YUV is kornia's YCbCr (BT.601, chroma offset 0.5), which is what ComfyUI's nodes compute.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from engine.context import NodeContext
from engine.node import Node
from engine.schema import COMBO, FLOAT, IMAGE, INT, Input, NodeSchema, Output
from nodes.core.resize import gaussian_kernel, resize_image
from nodes.image.load_save import ImageError

BLEND_MODES = ("normal", "multiply", "screen", "overlay", "soft_light", "difference")
MORPHOLOGY_OPERATIONS = ("erode", "dilate", "open", "close", "gradient", "bottom_hat", "top_hat")
DITHER_METHODS = ("none", "floyd-steinberg", "bayer-2", "bayer-4", "bayer-8", "bayer-16")


def _image_out(description: str) -> Output:
    return Output("IMAGE", IMAGE, description)


def match_alpha(destination: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    """``source`` with ``destination``'s channel count: extra channels dropped, a missing alpha set to 1."""
    if source.shape[-1] > destination.shape[-1]:
        return source[..., : destination.shape[-1]]
    if source.shape[-1] < destination.shape[-1]:
        return F.pad(source, (0, destination.shape[-1] - source.shape[-1]), value=1.0)
    return source


def _soft_light_g(x: torch.Tensor) -> torch.Tensor:
    return torch.where(x <= 0.25, ((16 * x - 12) * x + 4) * x, torch.sqrt(x))


def blend(base: torch.Tensor, layer: torch.Tensor, mode: str) -> torch.Tensor:
    """The blend modes of ImageBlend (before mixing with blend_factor)."""
    if mode == "normal":
        return layer
    if mode == "multiply":
        return base * layer
    if mode == "screen":
        return 1 - (1 - base) * (1 - layer)
    if mode == "overlay":
        return torch.where(base <= 0.5, 2 * base * layer, 1 - 2 * (1 - base) * (1 - layer))
    if mode == "soft_light":
        dark = base - (1 - 2 * layer) * base * (1 - base)
        light = base + (2 * layer - 1) * (_soft_light_g(base) - base)
        return torch.where(layer <= 0.5, dark, light)
    if mode == "difference":
        return base - layer
    raise ImageError(f"unknown blend_mode {mode!r}; expected one of {', '.join(BLEND_MODES)}")


def _same_batch(image1: torch.Tensor, image2: torch.Tensor, names: tuple[str, str]) -> None:
    b1, b2 = image1.shape[0], image2.shape[0]
    if b1 != b2 and 1 not in (b1, b2):
        raise ImageError(
            f"{names[0]} has {b1} images and {names[1]} {b2}; give both the same batch size or one a single image"
        )


class ImageBlend(Node):
    SCHEMA = NodeSchema(
        node_id="ImageBlend",
        display_name="Image Blend",
        category="image/postprocessing",
        description="Blend image2 over image1 (image2 resized to image1's size, bicubic, centre crop).",
        inputs=(
            Input("image1", IMAGE, "The base images."),
            Input("image2", IMAGE, "The images laid over them."),
            Input(
                "blend_factor",
                FLOAT,
                "0 keeps image1, 1 gives the blend.",
                default=0.5,
                min=0.0,
                max=1.0,
                step=0.01,
            ),
            Input("blend_mode", COMBO, "How the layers combine.", options=BLEND_MODES, default="normal"),
        ),
        outputs=(_image_out("The blended images, clamped to 0..1."),),
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        image1: torch.Tensor,
        image2: torch.Tensor,
        blend_factor: float,
        blend_mode: str,
    ) -> tuple:
        image2 = match_alpha(image1, image2)
        if image1.shape[1:3] != image2.shape[1:3]:
            image2 = resize_image(image2, image1.shape[2], image1.shape[1], "bicubic", "center")
        _same_batch(image1, image2, ("image1", "image2"))
        mixed = image1 * (1 - blend_factor) + blend(image1, image2, blend_mode) * blend_factor
        return (torch.clamp(mixed, 0, 1),)


def _filter(image: torch.Tensor, kernel: torch.Tensor, radius: int, input_name: str) -> torch.Tensor:
    """Convolve each channel of [B, H, W, C] with ``kernel``, the borders mirrored."""
    h, w = image.shape[1:3]
    if radius >= min(h, w):
        raise ImageError(
            f"{input_name}={radius} needs an image larger than {radius} pixels on each side; "
            f"this one is {w}x{h}; use a smaller {input_name}"
        )
    channels = image.shape[-1]
    x = F.pad(image.movedim(-1, 1), (radius, radius, radius, radius), mode="reflect")  # (B, C, H+2r, W+2r)
    weights = kernel.to(image).expand(channels, 1, *kernel.shape)
    return F.conv2d(x, weights, groups=channels).movedim(1, -1)


class ImageBlur(Node):
    SCHEMA = NodeSchema(
        node_id="ImageBlur",
        display_name="Image Blur",
        category="image/postprocessing",
        description="Gaussian blur (kernel 2*radius+1, mirrored borders).",
        inputs=(
            Input("image", IMAGE, "The images."),
            Input("blur_radius", INT, "Kernel radius in pixels.", default=1, min=1, max=31, step=1),
            Input(
                "sigma", FLOAT, "Spread, relative to the radius.", default=1.0, min=0.1, max=10.0, step=0.1
            ),
        ),
        outputs=(_image_out("The blurred images."),),
    )

    def run(self, ctx: NodeContext, *, image: torch.Tensor, blur_radius: int, sigma: float) -> tuple:
        if blur_radius == 0:
            return (image,)
        kernel = gaussian_kernel(blur_radius * 2 + 1, sigma)
        return (_filter(image, kernel, blur_radius, "blur_radius"),)


class ImageSharpen(Node):
    SCHEMA = NodeSchema(
        node_id="ImageSharpen",
        display_name="Image Sharpen",
        category="image/postprocessing",
        description="Unsharp-style sharpening: subtract a scaled Gaussian around each pixel, keep the mean.",
        inputs=(
            Input("image", IMAGE, "The images."),
            Input("sharpen_radius", INT, "Kernel radius in pixels.", default=1, min=1, max=31, step=1),
            Input(
                "sigma", FLOAT, "Spread, relative to the radius.", default=1.0, min=0.1, max=10.0, step=0.01
            ),
            Input("alpha", FLOAT, "Strength.", default=1.0, min=0.0, max=5.0, step=0.01),
        ),
        outputs=(_image_out("The sharpened images, clamped to 0..1."),),
    )

    def run(
        self, ctx: NodeContext, *, image: torch.Tensor, sharpen_radius: int, sigma: float, alpha: float
    ) -> tuple:
        if sharpen_radius == 0:
            return (image,)
        size = sharpen_radius * 2 + 1
        kernel = gaussian_kernel(size, sigma) * -(alpha * 10)
        kernel[size // 2, size // 2] += 1.0 - kernel.sum()  # weights sum to 1: flat areas unchanged
        return (torch.clamp(_filter(image, kernel, sharpen_radius, "sharpen_radius"), 0, 1),)


def bayer_matrix(order: int) -> np.ndarray:
    """The normalised ``order`` x ``order`` ordered-dither matrix (values centred on 0, step 1/order²)."""
    if order == 1:
        return np.zeros((1, 1), dtype=np.float64)
    q = order * order
    inner = bayer_matrix(order // 2) * q
    top = np.hstack([inner - 1.5, inner + 0.5])
    bottom = np.hstack([inner + 1.5, inner - 0.5])
    return np.vstack([top, bottom]) / q


def _quantize_one(rgb_u8: np.ndarray, colors: int, dither: str) -> np.ndarray:
    im = Image.fromarray(rgb_u8)  # [H, W, 3] uint8: RGB
    palette = im.quantize(colors=colors)  # median cut: the palette (Pillow needs it separately, #5836)
    if dither == "none":
        out = im.quantize(palette=palette, dither=Image.Dither.NONE)
    elif dither == "floyd-steinberg":
        out = im.quantize(palette=palette, dither=Image.Dither.FLOYDSTEINBERG)
    else:
        order = int(dither.split("-")[-1])
        n_colors = len(palette.getpalette() or []) // 3
        matrix = (2 * 256 / n_colors) * bayer_matrix(order) + 0.5
        h, w = rgb_u8.shape[:2]
        tiled = np.tile(matrix, (math.ceil(h / order), math.ceil(w / order)))[:h, :w, None]
        shifted = np.clip(rgb_u8.astype(np.float64) + tiled, 0, 255).astype(np.uint8)
        out = Image.fromarray(shifted).quantize(palette=palette, dither=Image.Dither.NONE)
    return np.asarray(out.convert("RGB"), dtype=np.float32) / 255.0


class ImageQuantize(Node):
    SCHEMA = NodeSchema(
        node_id="ImageQuantize",
        display_name="ImageQuantize",
        category="image/postprocessing",
        description="Reduce each image to a palette of `colors` colours, optionally dithered.",
        inputs=(
            Input("image", IMAGE, "The images."),
            Input("colors", INT, "Palette size.", default=256, min=1, max=256, step=1),
            Input("dither", COMBO, "Dithering.", options=DITHER_METHODS, default="none"),
        ),
        outputs=(_image_out("The quantized images (alpha, if any, kept)."),),
    )

    def run(self, ctx: NodeContext, *, image: torch.Tensor, colors: int, dither: str) -> tuple:
        result = image.clone()
        for b in range(image.shape[0]):
            rgb = (
                (image[b, ..., :3].clamp(0, 1) * 255).to(torch.uint8).cpu().numpy()
            )  # truncating, as ComfyUI
            result[b, ..., :3] = torch.from_numpy(_quantize_one(rgb, colors, dither))
        return (result,)


def _dilate(x: torch.Tensor, size: int) -> torch.Tensor:
    """Max over a size x size window centred on each pixel (window origin size // 2), borders ignored."""
    before, after = size // 2, size - 1 - size // 2
    padded = F.pad(x, (before, after, before, after), value=float("-inf"))
    return F.max_pool2d(padded, size, stride=1)


def _erode(x: torch.Tensor, size: int) -> torch.Tensor:
    return -_dilate(-x, size)


def morphology(x: torch.Tensor, operation: str, size: int) -> torch.Tensor:
    """Grey-level morphology of [B, C, H, W] with a flat size x size square."""
    ops = {
        "erode": lambda: _erode(x, size),
        "dilate": lambda: _dilate(x, size),
        "open": lambda: _dilate(_erode(x, size), size),
        "close": lambda: _erode(_dilate(x, size), size),
        "gradient": lambda: _dilate(x, size) - _erode(x, size),
        "top_hat": lambda: x - _dilate(_erode(x, size), size),
        "bottom_hat": lambda: _erode(_dilate(x, size), size) - x,
    }
    if operation not in ops:
        raise ImageError(
            f"unknown operation {operation!r}; expected one of {', '.join(MORPHOLOGY_OPERATIONS)}"
        )
    return ops[operation]()


class Morphology(Node):
    SCHEMA = NodeSchema(
        node_id="Morphology",
        display_name="ImageMorphology",
        category="image/postprocessing",
        description="Erode, dilate, open, close, gradient or top/bottom hat with a square kernel.",
        inputs=(
            Input("image", IMAGE, "The images."),
            Input(
                "operation",
                COMBO,
                "The morphological operation.",
                options=MORPHOLOGY_OPERATIONS,
                default="erode",
            ),
            Input(
                "kernel_size",
                INT,
                "Side of the square structuring element.",
                default=3,
                min=3,
                max=999,
                step=1,
            ),
        ),
        outputs=(_image_out("The processed images."),),
    )

    def run(self, ctx: NodeContext, *, image: torch.Tensor, operation: str, kernel_size: int) -> tuple:
        return (morphology(image.movedim(-1, 1), operation, kernel_size).movedim(1, -1),)


def rgb_to_ycbcr(rgb: torch.Tensor) -> torch.Tensor:
    """[..., 3] RGB -> [..., 3] Y, Cb, Cr (BT.601 weights, chroma centred on 0.5)."""
    r, g, b = rgb.unbind(-1)
    y = 0.299 * r + 0.587 * g + 0.114 * b
    return torch.stack([y, (b - y) * 0.564 + 0.5, (r - y) * 0.713 + 0.5], dim=-1)


def ycbcr_to_rgb(ycc: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`rgb_to_ycbcr` (the same rounded coefficients kornia uses)."""
    y, cb, cr = ycc[..., 0], ycc[..., 1] - 0.5, ycc[..., 2] - 0.5
    return torch.stack([y + 1.403 * cr, y - 0.714 * cr - 0.344 * cb, y + 1.773 * cb], dim=-1)


class ImageRGBToYUV(Node):
    SCHEMA = NodeSchema(
        node_id="ImageRGBToYUV",
        display_name="Image RGB to YUV",
        category="image/color",
        description="Split an RGB image into Y, U and V images (each channel repeated as grey).",
        inputs=(Input("image", IMAGE, "The RGB images (alpha ignored)."),),
        outputs=(
            Output("Y", IMAGE, "Luma as a grey image."),
            Output("U", IMAGE, "Blue-difference chroma (0.5 = none) as a grey image."),
            Output("V", IMAGE, "Red-difference chroma (0.5 = none) as a grey image."),
        ),
    )

    def run(self, ctx: NodeContext, *, image: torch.Tensor) -> tuple:
        if image.shape[-1] < 3:
            raise ImageError(f"image has {image.shape[-1]} channel(s); RGB to YUV needs 3 (RGB) or 4 (RGBA)")
        ycc = rgb_to_ycbcr(image[..., :3])
        return tuple(ycc[..., i : i + 1].expand(*ycc.shape[:-1], 3) for i in range(3))


class ImageYUVToRGB(Node):
    SCHEMA = NodeSchema(
        node_id="ImageYUVToRGB",
        display_name="Image YUV to RGB",
        category="image/color",
        description="Join Y, U and V images (each averaged over its colour channels) into RGB.",
        inputs=(
            Input("Y", IMAGE, "Luma."),
            Input("U", IMAGE, "Blue-difference chroma."),
            Input("V", IMAGE, "Red-difference chroma."),
        ),
        outputs=(_image_out("The RGB images."),),
    )

    def run(self, ctx: NodeContext, *, Y: torch.Tensor, U: torch.Tensor, V: torch.Tensor) -> tuple:  # noqa: N803
        planes = {"Y": Y, "U": U, "V": V}
        sizes = {name: tuple(p.shape[:3]) for name, p in planes.items()}
        if len(set(sizes.values())) != 1:
            raise ImageError(f"Y, U and V must have the same batch and size; found {sizes}")
        ycc = torch.cat([p[..., :3].mean(dim=-1, keepdim=True) for p in planes.values()], dim=-1)
        return (ycbcr_to_rgb(ycc),)


NODES: list[type[Node]] = [
    ImageBlend,
    ImageBlur,
    ImageSharpen,
    ImageQuantize,
    Morphology,
    ImageRGBToYUV,
    ImageYUVToRGB,
]
