"""ComfyUI's conditioning editors: mix, join, place (mask, area, timestep range) and inpainting-model
conditioning (the SDXL prompt encoders with their size ids are ``nodes.family_nodes.sd_nodes``).

Each node returns new :class:`CondEntry` values (never edits its input). What the sampler reads
from an entry is documented in :mod:`nodes.sample.cond_batch` (mask, mask strength, set_area_to_bounds,
area or area_percentage, strength, start/end percent) and in the family's denoiser (SDXL's size
ids ``width``/``height``/``crop_w``/``crop_h``/``target_width``/``target_height``/``aesthetic_score``;
an inpainting UNet's ``concat_latent_image``/``concat_mask``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
import torch.nn.functional as F

from engine.context import NodeContext
from engine.node import Node
from engine.schema import (
    BOOLEAN,
    COMBO,
    CONDITIONING,
    FLOAT,
    IMAGE,
    LATENT,
    MASK,
    VAE,
    Input,
    NodeSchema,
    Output,
)
from nodes.core.cond import CondEntry, Conditioning
from nodes.latent.vae import crop_to_8, encode


def with_extras(conditioning: Conditioning, **values: Any) -> Conditioning:
    """Every entry with ``values`` added to its extras (ComfyUI's ``conditioning_set_values``)."""
    return [replace(e, extras={**e.extras, **values}) for e in conditioning]


def _first(conditioning: Conditioning, node: str) -> CondEntry:
    if not conditioning:
        raise ValueError(f"{node}: conditioning_from is empty; connect a CLIPTextEncode output")
    return conditioning[0]


class ConditioningAverage(Node):
    SCHEMA = NodeSchema(
        node_id="ConditioningAverage",
        display_name="ConditioningAverage",
        category="conditioning",
        description="Blend each entry of conditioning_to with the first entry of conditioning_from.",
        inputs=(
            Input("conditioning_to", CONDITIONING, "The conditioning to blend into (its extras are kept)."),
            Input(
                "conditioning_from", CONDITIONING, "Its first entry is blended in; later entries are ignored."
            ),
            Input(
                "conditioning_to_strength",
                FLOAT,
                "Weight of conditioning_to (1 = only it, 0 = only from).",
                default=1.0,
                min=0.0,
                max=1.0,
                step=0.01,
            ),
        ),
        outputs=(Output("CONDITIONING", CONDITIONING, "The blended conditioning."),),
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        conditioning_to: Conditioning,
        conditioning_from: Conditioning,
        conditioning_to_strength: float,
    ) -> tuple[Conditioning]:
        src = _first(conditioning_from, "ConditioningAverage")
        w = conditioning_to_strength
        out = []
        for e in conditioning_to:
            tokens = e.embeds.shape[1]
            other = src.embeds[:, :tokens]
            if other.shape[1] < tokens:  # the shorter prompt is padded with zeros
                pad = torch.zeros(1, tokens - other.shape[1], other.shape[2], dtype=other.dtype)
                other = torch.cat([other, pad], dim=1)
            pooled = e.pooled
            if src.pooled is not None:
                pooled = src.pooled if e.pooled is None else e.pooled * w + src.pooled * (1.0 - w)
            out.append(replace(e, embeds=e.embeds * w + other * (1.0 - w), pooled=pooled))
        return (out,)


class ConditioningConcat(Node):
    SCHEMA = NodeSchema(
        node_id="ConditioningConcat",
        display_name="Conditioning (Concat)",
        category="conditioning",
        description="Append the tokens of conditioning_from's first entry to each entry of conditioning_to.",
        inputs=(
            Input("conditioning_to", CONDITIONING, "The conditioning to extend (its extras are kept)."),
            Input("conditioning_from", CONDITIONING, "Its first entry's tokens are appended."),
        ),
        outputs=(Output("CONDITIONING", CONDITIONING, "The longer conditioning."),),
    )

    def run(
        self, ctx: NodeContext, *, conditioning_to: Conditioning, conditioning_from: Conditioning
    ) -> tuple[Conditioning]:
        src = _first(conditioning_from, "ConditioningConcat")
        out = []
        for e in conditioning_to:
            if e.embeds.shape[-1] != src.embeds.shape[-1]:
                raise ValueError(
                    f"ConditioningConcat: conditioning_to is {e.embeds.shape[-1]} wide but "
                    f"conditioning_from is {src.embeds.shape[-1]}; encode both with the same CLIP"
                )
            out.append(replace(e, embeds=torch.cat([e.embeds, src.embeds.to(e.embeds)], dim=1)))
        return (out,)


_STRENGTH = Input(
    "strength",
    FLOAT,
    "Weight of this conditioning's prediction where it applies.",
    default=1.0,
    min=0.0,
    max=10.0,
    step=0.01,
)


class ConditioningSetMask(Node):
    SCHEMA = NodeSchema(
        node_id="ConditioningSetMask",
        display_name="Conditioning (Set Mask)",
        category="conditioning",
        description="Apply a conditioning only where the mask is (weighted by the mask's values).",
        inputs=(
            Input("conditioning", CONDITIONING, "The conditioning to place."),
            Input("mask", MASK, "Where it applies, [B, H, W] or [H, W]; resized to the latent."),
            _STRENGTH,
            Input(
                "set_cond_area",
                COMBO,
                "'mask bounds': run the model only on the mask's bounding box.",
                default="default",
                options=("default", "mask bounds"),
            ),
        ),
        outputs=(Output("CONDITIONING", CONDITIONING, "The masked conditioning."),),
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        conditioning: Conditioning,
        mask: torch.Tensor,
        strength: float,
        set_cond_area: str,
    ) -> tuple[Conditioning]:
        m = mask if mask.dim() >= 3 else mask.unsqueeze(0)
        return (
            with_extras(
                conditioning, mask=m, set_area_to_bounds=set_cond_area != "default", mask_strength=strength
            ),
        )


def _fraction(name: str, default: float, what: str) -> Input:
    return Input(name, FLOAT, what, default=default, min=0.0, max=1.0, step=0.01)


class ConditioningSetAreaPercentage(Node):
    SCHEMA = NodeSchema(
        node_id="ConditioningSetAreaPercentage",
        display_name="Conditioning (Set Area with Percentage)",
        category="conditioning",
        description="Limit a conditioning to a rectangle given as fractions of the image size.",
        inputs=(
            Input("conditioning", CONDITIONING, "The conditioning to place."),
            _fraction("width", 1.0, "Area width as a fraction of the image width."),
            _fraction("height", 1.0, "Area height as a fraction of the image height."),
            _fraction("x", 0.0, "Left edge as a fraction of the image width."),
            _fraction("y", 0.0, "Top edge as a fraction of the image height."),
            _STRENGTH,
        ),
        outputs=(Output("CONDITIONING", CONDITIONING, "The conditioning with its area set."),),
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        conditioning: Conditioning,
        width: float,
        height: float,
        x: float,
        y: float,
        strength: float,
    ) -> tuple[Conditioning]:
        placed = with_extras(conditioning, area_percentage=(height, width, y, x), set_area_to_bounds=False)
        return ([replace(e, area=None, strength=strength) for e in placed],)


class ConditioningSetAreaStrength(Node):
    SCHEMA = NodeSchema(
        node_id="ConditioningSetAreaStrength",
        display_name="ConditioningSetAreaStrength",
        category="conditioning",
        description="Set the weight of a conditioning's prediction (over its area, if it has one).",
        inputs=(Input("conditioning", CONDITIONING, "The conditioning to weight."), _STRENGTH),
        outputs=(Output("CONDITIONING", CONDITIONING, "The weighted conditioning."),),
    )

    def run(self, ctx: NodeContext, *, conditioning: Conditioning, strength: float) -> tuple[Conditioning]:
        return ([replace(e, strength=strength) for e in conditioning],)


class ConditioningSetTimestepRange(Node):
    SCHEMA = NodeSchema(
        node_id="ConditioningSetTimestepRange",
        display_name="ConditioningSetTimestepRange",
        category="advanced/conditioning",
        description="Use a conditioning only between two points of the schedule (0 = first step, 1 = end).",
        inputs=(
            Input("conditioning", CONDITIONING, "The conditioning to limit."),
            Input(
                "start",
                FLOAT,
                "Where it starts applying (fraction of the schedule).",
                default=0.0,
                min=0.0,
                max=1.0,
                step=0.001,
            ),
            Input(
                "end",
                FLOAT,
                "Where it stops applying (fraction of the schedule).",
                default=1.0,
                min=0.0,
                max=1.0,
                step=0.001,
            ),
        ),
        outputs=(Output("CONDITIONING", CONDITIONING, "The conditioning with its range."),),
    )

    def run(
        self, ctx: NodeContext, *, conditioning: Conditioning, start: float, end: float
    ) -> tuple[Conditioning]:
        return (with_extras(conditioning, start_percent=start, end_percent=end),)


class InpaintModelConditioning(Node):
    SCHEMA = NodeSchema(
        node_id="InpaintModelConditioning",
        display_name="InpaintModelConditioning",
        category="conditioning/inpaint",
        description="Give an inpainting model the masked image and the mask (and the image as the latent).",
        inputs=(
            Input("positive", CONDITIONING, "Positive conditioning."),
            Input("negative", CONDITIONING, "Negative conditioning."),
            Input("vae", VAE, "The VAE to encode the image with."),
            Input("pixels", IMAGE, "The image to inpaint."),
            Input("mask", MASK, "Where to repaint (1), [B, H, W]."),
            Input(
                "noise_mask",
                BOOLEAN,
                "Add a noise mask to the latent so sampling only changes the masked "
                "area. Might improve results or break them, depending on the model.",
                default=True,
            ),
        ),
        outputs=(
            Output("positive", CONDITIONING, "Positive conditioning with the inpainting inputs."),
            Output("negative", CONDITIONING, "Negative conditioning with the inpainting inputs."),
            Output("latent", LATENT, "The encoded (unmasked) image."),
        ),
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        positive: Conditioning,
        negative: Conditioning,
        vae: Any,
        pixels: torch.Tensor,
        mask: torch.Tensor,
        noise_mask: bool,
    ) -> tuple[Conditioning, Conditioning, dict]:
        m = mask.reshape(-1, 1, mask.shape[-2], mask.shape[-1]).float()
        m = F.interpolate(m, size=tuple(pixels.shape[1:3]), mode="bilinear")
        image = crop_to_8(pixels)[..., :3]
        if image.shape[1:3] != pixels.shape[1:3]:  # the same centred crop as the image
            top, left = (pixels.shape[1] % 8) // 2, (pixels.shape[2] % 8) // 2
            m = m[:, :, top : top + image.shape[1], left : left + image.shape[2]]
        keep = (1.0 - m.round()).permute(0, 2, 3, 1)
        masked = (image - 0.5) * keep + 0.5
        with ctx.models.use(vae) as module:
            concat = encode(module, masked)
            latent = encode(module, image)
        out: dict[str, Any] = {"samples": latent}
        if noise_mask:
            out["noise_mask"] = m
        values = {"concat_latent_image": concat, "concat_mask": m}
        return (with_extras(positive, **values), with_extras(negative, **values), out)


class ReferenceLatent(Node):
    SCHEMA = NodeSchema(
        node_id="ReferenceLatent",
        display_name="ReferenceLatent",
        category="advanced/conditioning/edit_models",
        description="This node sets the guiding latent for an edit model. If the model supports it you can "
        "chain multiple to set multiple reference images.",
        inputs=(
            Input("conditioning", CONDITIONING, "The conditioning to add the reference to."),
            Input(
                "latent",
                LATENT,
                "The reference image, encoded with the model's VAE (VAEEncode).",
                optional=True,
            ),
        ),
        outputs=(Output("CONDITIONING", CONDITIONING, "The conditioning with the reference appended."),),
    )

    def run(
        self, ctx: NodeContext, *, conditioning: Conditioning, latent: dict | None = None
    ) -> tuple[Conditioning]:
        if latent is None:
            return (conditioning,)
        samples = latent["samples"]
        return (
            [
                replace(
                    e,
                    extras={
                        **e.extras,
                        "reference_latents": [*(e.extras.get("reference_latents") or ()), samples],
                    },
                )
                for e in conditioning
            ],
        )


NODES: list[type[Node]] = [
    ConditioningAverage,
    ConditioningConcat,
    ConditioningSetMask,
    ConditioningSetAreaPercentage,
    ConditioningSetAreaStrength,
    ConditioningSetTimestepRange,
    InpaintModelConditioning,
    ReferenceLatent,
]
