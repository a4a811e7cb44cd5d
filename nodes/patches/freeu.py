"""FreeU, FreeU_V2 and PatchModelAddDownscale (Kohya Deep Shrink): patches at the UNet's output
(and input) block points, with ComfyUI's names, inputs and formulas.

- FreeU (Si et al. 2023, "FreeU: Free Lunch in Diffusion U-Net", https://arxiv.org/abs/2309.11497):
  at every output place whose incoming features ``h`` have ``4 * model_channels`` channels (``b1``,
  ``s1``) or ``2 * model_channels`` (``b2``, ``s2``), the first half of ``h``'s channels is scaled
  by ``b`` and the skip connection's lowest frequencies (the 2x2 centre of its shifted 2-D spectrum)
  by ``s``. FreeU_V2 scales by ``(b - 1) * m + 1`` instead, ``m`` the per-image channel mean of
  ``h`` normalised to [0, 1]. All-ones settings change nothing, so the node then returns its input.
  The per-place operation and filter equal diffusers' ``apply_freeu`` / ``fourier_filter``, but the
  places differ from diffusers' ``enable_freeu`` (which scales whole up blocks 0 and 1 by index):
  ComfyUI's rule by channel count also patches the first resnet of the next up block, and on SD1.x
  all three resnets of up block 1 get ``b1``; Loom follows ComfyUI.
- PatchModelAddDownscale: while sigma is within [sigma(end_percent), sigma(start_percent)], the
  features after input place ``block_number`` are resized by ``1 / downscale_factor`` (before or
  after they are kept as a skip connection); at an output place whose features and skip connection
  differ in size, the features are resized back to the skip's size.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from engine.context import NodeContext
from engine.node import Node
from engine.schema import BOOLEAN, COMBO, FLOAT, INT, MODEL, Input, NodeSchema, Output
from nodes.core.resize import resize
from nodes.core.sampling_hooks import BlockPatch, ConditioningError, SamplingHooks
from nodes.patches.unet_hooks import require_points, unet_patch

log = logging.getLogger("loom.nodes.patches")
CATEGORY = "model_patches/unet"
DOWNSCALE_METHODS = ("bicubic", "nearest-exact", "bilinear", "area", "bislerp")  # ComfyUI's order


def fourier_filter(x: torch.Tensor, threshold: int, scale: float) -> torch.Tensor:
    """Scale the ``2 * threshold`` square of lowest frequencies of ``x`` [B, C, H, W] by ``scale``."""
    spectrum = torch.fft.fftshift(torch.fft.fftn(x.float(), dim=(-2, -1)), dim=(-2, -1))
    b, c, h, w = spectrum.shape
    mask = torch.ones((b, c, h, w), device=x.device)
    mid_h, mid_w = h // 2, w // 2
    mask[..., mid_h - threshold : mid_h + threshold, mid_w - threshold : mid_w + threshold] = scale
    out = torch.fft.ifftn(torch.fft.ifftshift(spectrum * mask, dim=(-2, -1)), dim=(-2, -1)).real
    return out.to(x.dtype)


def _filtered(hsp: torch.Tensor, scale: float) -> torch.Tensor:
    try:
        return fourier_filter(hsp, 1, scale)
    except (RuntimeError, TypeError) as exc:  # a device without torch.fft: on the CPU, as ComfyUI
        log.warning("FreeU: torch.fft failed on %s (%s); filtering on the CPU", hsp.device, exc)
        return fourier_filter(hsp.cpu(), 1, scale).to(hsp.device)


def _half_scaled(h: torch.Tensor, factor: Any) -> torch.Tensor:
    half = h.shape[1] // 2
    return torch.cat([h[:, :half] * factor, h[:, half:]], dim=1)


def freeu_hooks(module: Any, b1: float, b2: float, s1: float, s2: float, v2: bool) -> SamplingHooks:
    channels = module.config.block_out_channels[0]  # ComfyUI's model_channels
    scales = {channels * 4: (b1, s1), channels * 2: (b2, s2)}

    def output_block_patch(
        h: torch.Tensor, hsp: torch.Tensor, options: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        scale = scales.get(int(h.shape[1]))
        if scale is None:
            return h, hsp
        if v2:
            mean = h.mean(1).unsqueeze(1)
            flat = mean.view(mean.shape[0], -1)
            low = flat.min(dim=-1, keepdim=True)[0][:, :, None, None]
            high = flat.max(dim=-1, keepdim=True)[0][:, :, None, None]
            h = _half_scaled(h, (scale[0] - 1) * ((mean - low) / (high - low)) + 1)
        else:
            h = _half_scaled(h, scale[0])
        return h, _filtered(hsp, scale[1])

    return SamplingHooks(block_patches=(BlockPatch("output_block_patch", output_block_patch),))


def _freeu_inputs(b1: float, b2: float) -> tuple[Input, ...]:
    return (
        Input("model", MODEL, "The UNet model to patch."),
        Input(
            "b1",
            FLOAT,
            "Backbone scale of the deepest output blocks.",
            default=b1,
            min=0.0,
            max=10.0,
            step=0.01,
        ),
        Input(
            "b2",
            FLOAT,
            "Backbone scale of the second-deepest output blocks.",
            default=b2,
            min=0.0,
            max=10.0,
            step=0.01,
        ),
        Input(
            "s1",
            FLOAT,
            "Skip low-frequency scale of the deepest output blocks.",
            default=0.9,
            min=0.0,
            max=10.0,
            step=0.01,
        ),
        Input(
            "s2",
            FLOAT,
            "Skip low-frequency scale of the second-deepest output blocks.",
            default=0.2,
            min=0.0,
            max=10.0,
            step=0.01,
        ),
    )


class FreeU(Node):
    SCHEMA = NodeSchema(
        node_id="FreeU",
        display_name="FreeU",
        category=CATEGORY,
        description="Strengthen the UNet's backbone features and damp its skip connections' low frequencies.",
        inputs=_freeu_inputs(1.1, 1.2),
        outputs=(Output("MODEL", MODEL, "The patched model."),),
    )
    V2 = False

    def run(self, ctx: NodeContext, *, model: Any, b1: float, b2: float, s1: float, s2: float) -> tuple[Any]:
        if b1 == b2 == s1 == s2 == 1.0:  # the identity: nothing to patch
            return (model,)
        return unet_patch(
            model,
            self.SCHEMA.node_id,
            ("output_block_patch",),
            freeu_hooks,
            float(b1),
            float(b2),
            float(s1),
            float(s2),
            self.V2,
        )


class FreeU_V2(FreeU):  # noqa: N801 (ComfyUI's class name)
    SCHEMA = NodeSchema(
        node_id="FreeU_V2",
        display_name="FreeU_V2",
        category=CATEGORY,
        description="FreeU with backbone scaling weighted by each image's normalised feature mean.",
        inputs=_freeu_inputs(1.3, 1.4),
        outputs=(Output("MODEL", MODEL, "The patched model."),),
    )
    V2 = True


def downscale_hooks(
    module: Any,
    block_number: int,
    factor: float,
    sigma_start: float,
    sigma_end: float,
    after_skip: bool,
    down_method: str,
    up_method: str,
) -> SamplingHooks:
    def input_patch(h: torch.Tensor, options: Any) -> torch.Tensor:
        if options["block"][1] != block_number:
            return h
        if options.get("sigmas") is None:
            raise ConditioningError(
                "PatchModelAddDownscale needs the noise level of each call; this sampler does not give it"
            )
        sigma = options["sigmas"][0].item()
        if sigma_end <= sigma <= sigma_start:
            h = resize(
                h, round(h.shape[-1] * (1.0 / factor)), round(h.shape[-2] * (1.0 / factor)), down_method
            )
        return h

    def output_patch(h: torch.Tensor, hsp: torch.Tensor, options: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if h.shape[2] != hsp.shape[2]:
            h = resize(h, hsp.shape[-1], hsp.shape[-2], up_method)
        return h, hsp

    point = "input_block_patch_after_skip" if after_skip else "input_block_patch"
    return SamplingHooks(
        block_patches=(BlockPatch(point, input_patch), BlockPatch("output_block_patch", output_patch))
    )


class PatchModelAddDownscale(Node):
    SCHEMA = NodeSchema(
        node_id="PatchModelAddDownscale",
        display_name="PatchModelAddDownscale (Kohya Deep Shrink)",
        category="model_patches/unet",
        description="Shrink the UNet's features after one input block during the early steps (Kohya Deep "
        "Shrink), so large images keep a coherent composition.",
        inputs=(
            Input("model", MODEL, "The UNet model to patch."),
            Input(
                "block_number",
                INT,
                "The input block after which the features are shrunk.",
                default=3,
                min=1,
                max=32,
                step=1,
            ),
            Input(
                "downscale_factor",
                FLOAT,
                "How much smaller the features get.",
                default=2.0,
                min=0.1,
                max=9.0,
                step=0.001,
            ),
            Input(
                "start_percent",
                FLOAT,
                "Where in the schedule shrinking starts.",
                default=0.0,
                min=0.0,
                max=1.0,
                step=0.001,
            ),
            Input(
                "end_percent",
                FLOAT,
                "Where in the schedule shrinking ends.",
                default=0.35,
                min=0.0,
                max=1.0,
                step=0.001,
            ),
            Input(
                "downscale_after_skip",
                BOOLEAN,
                "Shrink after the block's skip connection was kept (the skip keeps full size).",
                default=True,
            ),
            Input("downscale_method", COMBO, "How the features are shrunk.", options=DOWNSCALE_METHODS),
            Input(
                "upscale_method",
                COMBO,
                "How they are brought back to the skip connections' size.",
                options=DOWNSCALE_METHODS,
            ),
        ),
        outputs=(Output("MODEL", MODEL, "The patched model."),),
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        model: Any,
        block_number: int,
        downscale_factor: float,
        start_percent: float,
        end_percent: float,
        downscale_after_skip: bool,
        downscale_method: str,
        upscale_method: str,
    ) -> tuple[Any]:
        points = ("input_block_patch", "input_block_patch_after_skip", "output_block_patch")
        require_points(model, "PatchModelAddDownscale", points)
        ms = model.model_sampling
        start, end = float(ms.percent_to_sigma(start_percent)), float(ms.percent_to_sigma(end_percent))
        return unet_patch(
            model,
            "PatchModelAddDownscale",
            points,
            downscale_hooks,
            int(block_number),
            float(downscale_factor),
            start,
            end,
            bool(downscale_after_skip),
            downscale_method,
            upscale_method,
        )


NODES: list[type[Node]] = [FreeU, FreeU_V2, PatchModelAddDownscale]
