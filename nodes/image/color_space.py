"""Colour spaces and histograms: ImageColorSpace (sRGB / HDR HLG / HDR PQ) and ImageHistogram
(ComfyUI's names, inputs and semantics; ``comfy_extras/nodes_images.py`` and ``nodes_curve.py``).

ImageColorSpace goes through display-linear Rec.2020 light in cd/m² (BT.2100): sRGB white is 203
nits, the HLG reference display peaks at 1000 nits with a system gamma of 1.2, PQ is absolute up
to 10000 nits. Converting to a narrower space tone-maps luminance above its white (extended
Reinhard, one white point for the whole batch) and pulls out-of-gamut colours toward their
luminance. Alpha is passed through; the arithmetic is float32.
"""

from __future__ import annotations

import numpy as np
import torch

from engine.context import NodeContext
from engine.node import Node
from engine.schema import COMBO, IMAGE, Input, NodeSchema, Output

COLOR_SPACES = ("sRGB", "HDR", "HDR PQ")
HISTOGRAM = "HISTOGRAM"  # ComfyUI's V3 type: a list of 256 bin counts

Matrix = tuple[tuple[float, float, float], ...]
REC709_TO_REC2020: Matrix = (
    (0.6274038959346991, 0.3292830383778837, 0.0433130656874172),
    (0.0690972893582320, 0.9195403950754587, 0.0113623155663092),
    (0.0163914388751503, 0.0880133078772259, 0.8955952532476238),
)
REC2020_TO_REC709: Matrix = (
    (1.6604910021084338, -0.5876411387885494, -0.0728498633198846),
    (-0.1245504745215905, 1.1328998971259600, -0.0083494226043695),
    (-0.0181507633549053, -0.1005788980080076, 1.1187296613629125),
)
REC709_LUMA = (0.2126390058715103, 0.7151686787677559, 0.0721923153607337)
REC2020_LUMA = (0.2627, 0.6780, 0.0593)
PQ_M1, PQ_M2 = 2610 / 16384, 2523 / 32
PQ_C1, PQ_C2, PQ_C3 = 3424 / 4096, 2413 / 128, 2392 / 128
HLG_A, HLG_B = 0.17883277, 0.28466892
HLG_C = 0.55991072928  # 0.5 - a * ln(4a)
SDR_WHITE_NITS, HLG_PEAK_NITS, HLG_GAMMA = 203.0, 1000.0, 1.2


class ColorSpaceError(ValueError):
    """A colour space the node does not know; the message names the input and the choices."""


def apply_matrix(rgb: torch.Tensor, matrix: Matrix) -> torch.Tensor:
    return rgb @ rgb.new_tensor(matrix).T


def luminance(rgb: torch.Tensor, weights: tuple[float, float, float]) -> torch.Tensor:
    return (rgb * rgb.new_tensor(weights)).sum(dim=-1, keepdim=True)


def srgb_to_linear(rgb: torch.Tensor) -> torch.Tensor:
    """The inverse sRGB transfer curve (IEC 61966-2-1)."""
    return torch.where(rgb <= 0.04045, rgb / 12.92, ((rgb.clamp(min=0.0) + 0.055) / 1.055) ** 2.4)


def hlg_to_linear(signal: torch.Tensor) -> torch.Tensor:
    """The inverse HLG OETF (BT.2100): signal 0..1 to scene light 0..1."""
    high = (torch.exp((signal.clamp(min=0.5) - HLG_C) / HLG_A) + HLG_B) / 12.0
    return torch.where(signal <= 0.5, signal**2 / 3.0, high)


def tone_map(rgb: torch.Tensor, weights: tuple[float, float, float]) -> torch.Tensor:
    """Extended Reinhard on luminance with the batch's peak as white; nothing changes at peak <= 1."""
    lum = luminance(rgb, weights).clamp_min(0.0)
    peak = lum.amax().clamp_min(1.0)
    scale = (1.0 + lum / peak.square()) / (1.0 + lum)
    return rgb * torch.where(peak > 1.0001, scale, torch.ones_like(scale))


def compress_gamut(rgb: torch.Tensor, weights: tuple[float, float, float]) -> torch.Tensor:
    """Colours outside 0..1 desaturated toward their luminance just enough to fit, then clamped."""
    lum = luminance(rgb, weights).clamp(0.0, 1.0)
    tiny = torch.finfo(rgb.dtype).tiny
    low, high = rgb.amin(dim=-1, keepdim=True), rgb.amax(dim=-1, keepdim=True)
    upper = (1.0 - lum) / (high - lum).clamp_min(tiny)
    lower = lum / (lum - low).clamp_min(tiny)
    saturation = torch.minimum(upper, lower).clamp(0.0, 1.0)
    inside = (low >= -1e-5) & (high <= 1.00001)
    return torch.where(inside, rgb, lum + (rgb - lum) * saturation).clamp(0.0, 1.0)


def to_display_nits(rgb: torch.Tensor, source: str) -> torch.Tensor:
    """Encoded ``source`` pixels as display-linear Rec.2020 light in cd/m²."""
    if source == "sRGB":
        return apply_matrix(srgb_to_linear(rgb), REC709_TO_REC2020) * SDR_WHITE_NITS
    if source == "HDR":
        scene = hlg_to_linear(rgb)
        lum = luminance(scene, REC2020_LUMA).clamp_min(0.0)
        return scene * (lum.pow(HLG_GAMMA - 1.0) * HLG_PEAK_NITS)
    # PQ, evaluated around 1 to keep float32 precision
    p = (rgb.clamp_min(0.0).log() / PQ_M2).expm1()
    return ((p + (1.0 - PQ_C1)).clamp_min(0.0) / ((PQ_C2 - PQ_C3) - PQ_C3 * p)).pow(1.0 / PQ_M1) * 10000.0


def from_display_nits(nits: torch.Tensor, source: str, destination: str) -> torch.Tensor:
    """Display light in cd/m² encoded for ``destination`` (tone-mapped where it is narrower)."""
    if destination == "sRGB":
        rgb = apply_matrix(nits / SDR_WHITE_NITS, REC2020_TO_REC709)
        rgb = compress_gamut(tone_map(rgb, REC709_LUMA), REC709_LUMA)
        return torch.where(rgb <= 0.0031308, rgb * 12.92, 1.055 * rgb.pow(1.0 / 2.4) - 0.055)
    if destination == "HDR":
        rgb = nits / HLG_PEAK_NITS
        if source == "HDR PQ":
            rgb = tone_map(rgb, REC2020_LUMA)
        lum = luminance(rgb, REC2020_LUMA).clamp_min(torch.finfo(rgb.dtype).tiny)
        rgb = rgb * lum.pow(1.0 / HLG_GAMMA - 1.0)
        if source == "HDR PQ":
            rgb = compress_gamut(rgb, REC2020_LUMA)
        low = (3.0 * rgb.clamp_min(0.0)).sqrt()
        high = HLG_A * (12.0 * rgb.clamp_min(1.0 / 12.0) - HLG_B).log() + HLG_C
        return torch.where(rgb <= 1.0 / 12.0, low, high)
    p = (nits.clamp_min(0.0) / 10000.0).pow(PQ_M1)
    p = ((PQ_C1 - 1.0) + (PQ_C2 - PQ_C3) * p) / (1.0 + PQ_C3 * p)
    return (p.log1p() * PQ_M2).exp()


def convert_color_space(image: torch.Tensor, source: str, destination: str) -> torch.Tensor:
    for name, value in (("source", source), ("destination", destination)):
        if value not in COLOR_SPACES:
            raise ColorSpaceError(
                f"{name}: unknown colour space {value!r}; expected one of {', '.join(COLOR_SPACES)}"
            )
    if source == destination:
        return image
    rgb = from_display_nits(to_display_nits(image[..., :3].float(), source), source, destination)
    if image.shape[-1] == 4:
        rgb = torch.cat((rgb, image[..., 3:].float()), dim=-1)
    return rgb


class ImageColorSpace(Node):
    SCHEMA = NodeSchema(
        node_id="ImageColorSpace",
        display_name="Convert Image Color Space",
        category="image/color",
        description="Convert sRGB (Rec.709), HDR (Rec.2020 HLG), and HDR PQ (Rec.2020 PQ). Uses 203-nit SDR "
        "white and a 1000-nit HLG reference display. Narrowing tone-maps excess luminance across the batch "
        "and compresses out-of-gamut colors. Straight alpha is not color-transformed.",
        inputs=(
            Input("image", IMAGE, "The images."),
            Input("source", COMBO, "Color space of the input pixels.", options=COLOR_SPACES, default="sRGB"),
            Input(
                "destination",
                COMBO,
                "Color space of the output pixels. Set the save node to this same color space.",
                options=COLOR_SPACES,
                default="sRGB",
            ),
        ),
        outputs=(Output("IMAGE", IMAGE, "The converted images."),),
    )

    def run(
        self, ctx: NodeContext, *, image: torch.Tensor, source: str, destination: str
    ) -> tuple[torch.Tensor]:
        return (convert_color_space(image, source, destination),)


def bin_counts(values: np.ndarray) -> list[int]:
    """256 counts of 8-bit values."""
    return [int(c) for c in np.bincount(values.ravel(), minlength=256)[:256]]


class ImageHistogram(Node):
    SCHEMA = NodeSchema(
        node_id="ImageHistogram",
        display_name="Image Histogram",
        category="utils",
        description="The 256-bin histograms of the first image: RGB (the channels' mean), luminance, red, green, blue.",
        inputs=(Input("image", IMAGE, "The images (the first is measured)."),),
        outputs=(
            Output("rgb", HISTOGRAM, "The mean of the red, green and blue counts (floored)."),
            Output("luminance", HISTOGRAM, "Counts of BT.709 luminance."),
            Output("red", HISTOGRAM, "Counts of the red channel."),
            Output("green", HISTOGRAM, "Counts of the green channel."),
            Output("blue", HISTOGRAM, "Counts of the blue channel."),
        ),
    )

    def run(self, ctx: NodeContext, *, image: torch.Tensor) -> tuple[list[int], ...]:
        if image.ndim != 4 or image.shape[-1] < 3:
            raise ColorSpaceError(
                f"image: expected an RGB IMAGE [B, H, W, 3 or 4], found {tuple(image.shape)}"
            )
        pixels = image[0].detach().cpu().float().numpy()
        levels = np.clip(pixels * 255, 0, 255).astype(np.uint8)
        red, green, blue = (bin_counts(levels[..., c]) for c in range(3))
        rgb = [(r + g + b) // 3 for r, g, b in zip(red, green, blue, strict=True)]
        lum = 0.2126 * pixels[..., 0] + 0.7152 * pixels[..., 1] + 0.0722 * pixels[..., 2]
        return (rgb, bin_counts(np.clip(lum * 255, 0, 255).astype(np.uint8)), red, green, blue)


NODES: list[type[Node]] = [ImageColorSpace, ImageHistogram]
