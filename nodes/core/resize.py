"""Resizing tensors the way ComfyUI's ``upscale_method`` choices do (``comfy.utils.common_upscale``).

One entry point, :func:`resize`, works on ``[B, C, H, W]`` (latents, or images moved to
channels-first) and implements every method ComfyUI offers on its scale nodes:

- ``nearest-exact``, ``bilinear``, ``area``, ``bicubic``: ``torch.nn.functional.interpolate``
  (``align_corners=False``, no antialiasing), as ComfyUI calls it.
- ``bislerp``: bilinear placement of samples, but each pair of neighbours is blended by spherical
  interpolation of the channel vectors (direction slerped, length lerped) — ComfyUI's latent upscale
  that keeps the latent's norm. Written from the description of ``comfy.utils.bislerp``.
- ``lanczos``: separable Lanczos-3 with Pillow's kernel support and normalisation (the filter widens
  by the scale factor when shrinking), computed in float. ComfyUI goes through 8-bit PIL images, so
  this method is meant for images in 0..1: the input and each pass are clamped to 0..1 as Pillow
  clamps to 0..255; unlike ComfyUI the result is not quantised to 8 bits.

``crop="center"`` first cuts the input to the target aspect ratio around its centre (ComfyUI's
rounding), so the result is not stretched.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

UPSCALE_METHODS = ("nearest-exact", "bilinear", "area", "bicubic", "bislerp", "lanczos")
CROP_METHODS = ("disabled", "center")
_INTERPOLATE = ("nearest-exact", "bilinear", "area", "bicubic")


def center_crop(samples: torch.Tensor, width: int, height: int) -> torch.Tensor:
    """Cut ``samples`` [..., H, W] to the aspect ratio ``width / height``, keeping the centre."""
    old_h, old_w = samples.shape[-2], samples.shape[-1]
    old_aspect, new_aspect = old_w / old_h, width / height
    x = y = 0
    if old_aspect > new_aspect:
        x = round((old_w - old_w * (new_aspect / old_aspect)) / 2)
    elif old_aspect < new_aspect:
        y = round((old_h - old_h * (old_aspect / new_aspect)) / 2)
    return samples[..., y : old_h - y, x : old_w - x]


def resize(
    samples: torch.Tensor, width: int, height: int, method: str, crop: str = "disabled"
) -> torch.Tensor:
    """Resize ``samples`` [B, C, H, W] to ``height`` x ``width`` with one of :data:`UPSCALE_METHODS`."""
    if samples.ndim != 4:
        raise ValueError(f"resize expects a [B, C, H, W] tensor, found shape {tuple(samples.shape)}")
    if width < 1 or height < 1:
        raise ValueError(f"cannot resize to {width}x{height}; both sides must be at least 1 pixel")
    if method not in UPSCALE_METHODS:
        raise ValueError(f"unknown upscale_method {method!r}; expected one of {', '.join(UPSCALE_METHODS)}")
    if crop not in CROP_METHODS:
        raise ValueError(f"unknown crop {crop!r}; expected one of {', '.join(CROP_METHODS)}")
    if crop == "center":
        samples = center_crop(samples, width, height)
    if method == "bislerp":
        return bislerp(samples, width, height)
    if method == "lanczos":
        return lanczos(samples, width, height)
    kwargs = {"align_corners": False} if method in ("bilinear", "bicubic") else {}
    return F.interpolate(samples, size=(height, width), mode=method, **kwargs)


# --- bislerp -------------------------------------------------------------------------------------


def _linear_taps(
    n_in: int, n_out: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For each output position along one axis: the two source indices and the blend ratio that
    half-pixel-centred bilinear sampling uses (source = (i + 0.5) * n_in / n_out - 0.5, clamped)."""
    pos = ((torch.arange(n_out, device=device, dtype=torch.float32) + 0.5) * (n_in / n_out) - 0.5).clamp(
        0, n_in - 1
    )
    first = pos.floor().long()
    second = (first + 1).clamp(max=n_in - 1)
    return first, second, pos - first


def slerp_vectors(a: torch.Tensor, b: torch.Tensor, ratio: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """Blend vectors along ``dim``: directions by spherical interpolation, lengths linearly.
    Nearly identical directions give ``a``; nearly opposite ones fall back to a linear blend."""
    norm_a = a.norm(dim=dim, keepdim=True)
    norm_b = b.norm(dim=dim, keepdim=True)
    unit_a = torch.where(norm_a == 0, torch.zeros_like(a), a / norm_a)
    unit_b = torch.where(norm_b == 0, torch.zeros_like(b), b / norm_b)
    dot = (unit_a * unit_b).sum(dim=dim, keepdim=True)
    omega = torch.acos(dot.clamp(-1.0, 1.0))
    sin_omega = torch.sin(omega)
    blended = (torch.sin((1.0 - ratio) * omega) * unit_a + torch.sin(ratio * omega) * unit_b) / sin_omega
    blended = blended * (norm_a * (1.0 - ratio) + norm_b * ratio)
    linear = a * (1.0 - ratio) + b * ratio
    out = torch.where(dot < 1e-5 - 1, linear, blended)
    return torch.where(dot > 1 - 1e-5, a, out)


def bislerp(samples: torch.Tensor, width: int, height: int) -> torch.Tensor:
    """Resize [B, C, H, W] by bilinear placement with :func:`slerp_vectors` blending over C
    (first along the width, then along the height)."""
    dtype = samples.dtype
    x = samples.float()
    cols_a, cols_b, col_ratio = _linear_taps(x.shape[-1], width, x.device)
    x = slerp_vectors(x[..., cols_a], x[..., cols_b], col_ratio.view(1, 1, 1, -1))  # (B, C, H, width)
    rows_a, rows_b, row_ratio = _linear_taps(x.shape[-2], height, x.device)
    x = slerp_vectors(
        x[..., rows_a, :], x[..., rows_b, :], row_ratio.view(1, 1, -1, 1)
    )  # (B, C, height, width)
    return x.to(dtype)


# --- lanczos -------------------------------------------------------------------------------------


def _lanczos3(x: torch.Tensor) -> torch.Tensor:
    """The Lanczos window with a = 3: sinc(x) * sinc(x / 3) inside |x| < 3, else 0."""
    return torch.where(x.abs() < 3, torch.sinc(x) * torch.sinc(x / 3), torch.zeros_like(x))


def lanczos_weights(n_in: int, n_out: int, device: torch.device | None = None) -> torch.Tensor:
    """The [n_out, n_in] matrix of normalised Lanczos-3 taps Pillow uses to resample one axis."""
    scale = n_in / n_out
    widen = max(scale, 1.0)  # shrinking: stretch the kernel over more source pixels (antialiasing)
    support = 3.0 * widen
    centers = (torch.arange(n_out, dtype=torch.float64, device=device) + 0.5) * scale
    first = (centers - support + 0.5).floor().clamp(min=0)  # Pillow's window, end exclusive
    last = (centers + support + 0.5).floor().clamp(max=n_in)
    source = torch.arange(n_in, dtype=torch.float64, device=device)
    inside = (source[None, :] >= first[:, None]) & (source[None, :] < last[:, None])
    taps = _lanczos3((source[None, :] - centers[:, None] + 0.5) / widen) * inside
    totals = taps.sum(dim=1, keepdim=True)
    return (taps / torch.where(totals == 0, torch.ones_like(totals), totals)).float()


def lanczos(samples: torch.Tensor, width: int, height: int) -> torch.Tensor:
    """Resize [B, C, H, W] images in 0..1 with separable Lanczos-3 (width first, as Pillow)."""
    dtype = samples.dtype
    x = samples.float().clamp(0, 1)
    if x.shape[-1] != width:
        x = (x @ lanczos_weights(x.shape[-1], width, x.device).T).clamp(0, 1)  # (B, C, H, width)
    if x.shape[-2] != height:
        rows = lanczos_weights(x.shape[-2], height, x.device)  # (height, H)
        x = torch.einsum("oh,bchw->bcow", rows, x).clamp(0, 1)  # (B, C, height, width)
    return x.to(dtype)


# --- helpers for the image and mask layouts -------------------------------------------------------


def resize_image(
    image: torch.Tensor, width: int, height: int, method: str, crop: str = "disabled"
) -> torch.Tensor:
    """:func:`resize` for an IMAGE [B, H, W, C]."""
    return resize(image.movedim(-1, 1), width, height, method, crop).movedim(1, -1)


def resize_mask(
    mask: torch.Tensor, width: int, height: int, method: str, crop: str = "disabled"
) -> torch.Tensor:
    """:func:`resize` for a MASK [B, H, W] (or [H, W])."""
    batched = mask.reshape(-1, 1, mask.shape[-2], mask.shape[-1])
    return resize(batched, width, height, method, crop)[:, 0]


def size_keeping_aspect(width: int, height: int, old_width: int, old_height: int) -> tuple[int, int]:
    """ImageScale's rule: a 0 side follows the other side's scale (at least 1 pixel)."""
    if width == 0:
        width = max(1, round(old_width * height / old_height))
    elif height == 0:
        height = max(1, round(old_height * width / old_width))
    return width, height


def total_pixels_size(width: int, height: int, megapixels: float, steps: int = 1) -> tuple[int, int]:
    """The size with about ``megapixels`` * 1024² pixels and the same aspect, sides rounded to ``steps``."""
    scale = math.sqrt(megapixels * 1024 * 1024 / (width * height))
    return round(width * scale / steps) * steps, round(height * scale / steps) * steps


def gaussian_kernel(size: int, sigma: float) -> torch.Tensor:
    """A normalised [size, size] Gaussian over coordinates spanning -1..1 (ComfyUI's convention:
    sigma is relative to the kernel's half width, not in pixels)."""
    axis = torch.linspace(-1, 1, size)
    y, x = torch.meshgrid(axis, axis, indexing="ij")
    g = torch.exp(-(x * x + y * y) / (2.0 * sigma * sigma))
    return g / g.sum()


def upscale_target(width: int, height: int, latent_w: int, latent_h: int) -> tuple[int, int]:
    """LatentUpscale's target in pixels (ComfyUI's rule): 0 on one side keeps the aspect ratio of the
    ``latent_w`` x ``latent_h`` latents; each side is at least 64 pixels."""
    if width == 0:
        height = max(64, height)
        return max(64, round(latent_w * height / latent_h)), height
    if height == 0:
        width = max(64, width)
        return width, max(64, round(latent_h * width / latent_w))
    return max(64, width), max(64, height)
