"""The other ControlNet apply nodes of ComfyUI: ``ControlNetInpaintingAliMamaApply``,
``ControlNetApplySD3`` ("Apply Controlnet with VAE") and ``CLIPTextEncodeControlnet``.

In ComfyUI the first two are ``ControlNetApplyAdvanced`` with a VAE; the AliMama node, for a
ControlNet that takes the inpainting mask (``concat_mask``: AliMama's Flux and SD3 inpainting
ControlNets), first inverts the mask (1 keeps), blacks out the part to repaint (the inverted mask
resized bilinear to the image, centre-cropped, rounded, multiplied in) and hands the inverted mask
along, which the sampler resizes to the latent and appends to the encoded image
(``nodes.control.controlnet.encode_hint``); for any other ControlNet it is the plain apply. Both pass the
VAE on: the SD3 and InstantX/Shakker/AliMama Flux ControlNets take the control image VAE-encoded
(``nodes.families.components.dit_control``); the others (SD1.x/SD2.x/SDXL, union, T2I-Adapter,
XLabs Flux) take pixels. An inpainting ControlNet under a plain apply node gets a mask of ones.

``CLIPTextEncodeControlnet`` gives the ControlNets of a conditioning their own prompt: the
ControlNet's cross-attention reads these embeddings instead of the conditioning's (ComfyUI's
``cross_attn_controlnet``; ``pooled_output_controlnet`` is kept for the families that read it).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from engine.context import NodeContext
from engine.node import Node
from engine.schema import CLIP, CONDITIONING, FLOAT, IMAGE, MASK, STRING, VAE, Input, NodeSchema, Output
from nodes.control.controlnet import ControlNetApplyAdvanced, attach
from nodes.core.control_base import CONTROL_NET
from nodes.core.resize import resize
from nodes.encode.conditioning import encode_prompt, text_encoders

_RANGE = (
    Input(
        "strength", FLOAT, "Scale of the ControlNet's residuals.", default=1.0, min=0.0, max=10.0, step=0.01
    ),
    Input(
        "start_percent", FLOAT, "Where in the schedule it starts.", default=0.0, min=0.0, max=1.0, step=0.001
    ),
    Input("end_percent", FLOAT, "Where in the schedule it stops.", default=1.0, min=0.0, max=1.0, step=0.001),
)
_BRANCHES = (
    Output("positive", CONDITIONING, "Positive conditioning with the control."),
    Output("negative", CONDITIONING, "Negative conditioning with the control."),
)


def _apply(
    ctx: NodeContext,
    positive: Any,
    negative: Any,
    control_net: Any,
    image: Any,
    strength: float,
    start: float,
    end: float,
    vae: Any,
) -> tuple[Any, Any]:
    return ControlNetApplyAdvanced().run(
        ctx,
        positive=positive,
        negative=negative,
        control_net=control_net,
        image=image,
        strength=strength,
        start_percent=start,
        end_percent=end,
        vae=vae,
    )


def masked_hint(image: torch.Tensor, mask: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """ComfyUI's AliMama preparation: (the image with the part to repaint black, the kept part
    (B, 1, H, W): ``1 - mask``). ``mask``: MASK, 1 where to repaint."""
    if not isinstance(mask, torch.Tensor) or mask.ndim not in (2, 3):
        found = "nothing" if mask is None else f"{type(mask).__name__} {tuple(getattr(mask, 'shape', ()))}"
        raise ValueError(
            f"ControlNetInpaintingAliMamaApply needs a MASK (H, W or B, H, W; 1 where to repaint) for its "
            f"mask input, found {found}; connect a mask (e.g. from Load Image's MASK output or SolidMask)"
        )
    keep = 1.0 - mask.reshape(-1, 1, mask.shape[-2], mask.shape[-1]).float()
    if keep.shape[0] not in (1, image.shape[0]) and image.shape[0] != 1:
        raise ValueError(
            f"ControlNetInpaintingAliMamaApply got {image.shape[0]} images but {keep.shape[0]} masks; give one mask "
            "for all images or one per image"
        )
    apply = resize(keep, image.shape[2], image.shape[1], "bilinear", "center").round()
    return image * apply.movedim(1, -1).to(image), keep


class ControlNetInpaintingAliMamaApply(Node):
    SCHEMA = NodeSchema(
        node_id="ControlNetInpaintingAliMamaApply",
        display_name="ControlNetInpaintingAliMamaApply",
        category="conditioning/controlnet",
        description="Applies an inpainting ControlNet with the image and the mask of the area to repaint.",
        inputs=(
            Input("positive", CONDITIONING, "Positive conditioning."),
            Input("negative", CONDITIONING, "Negative conditioning."),
            Input("control_net", CONTROL_NET, "The ControlNet."),
            Input("vae", VAE, "The VAE (for ControlNets working in latent space)."),
            Input("image", IMAGE, "The image to inpaint."),
            Input("mask", MASK, "Where to repaint (1) and keep (0)."),
            *_RANGE,
        ),
        outputs=_BRANCHES,
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        positive: Any,
        negative: Any,
        control_net: Any,
        vae: Any,
        image: Any,
        mask: Any,
        strength: float,
        start_percent: float,
        end_percent: float,
    ) -> tuple[Any, Any]:
        if not getattr(control_net, "concat_mask", False):  # as ComfyUI: the plain apply, the mask unused
            return _apply(
                ctx, positive, negative, control_net, image, strength, start_percent, end_percent, vae
            )
        if strength == 0:
            return (positive, negative)
        hint, keep = masked_hint(image, mask)
        cache: dict[int, Any] = {}
        return (
            attach(
                positive, control_net, hint, strength, start_percent, end_percent, cache, vae=vae, mask=keep
            ),
            attach(
                negative, control_net, hint, strength, start_percent, end_percent, cache, vae=vae, mask=keep
            ),
        )


class ControlNetApplySD3(Node):
    SCHEMA = NodeSchema(
        node_id="ControlNetApplySD3",
        display_name="Apply Controlnet with VAE",
        category="conditioning/controlnet",
        description="Apply ControlNet with a VAE (deprecated in ComfyUI; the same as Apply ControlNet).",
        inputs=(
            Input("positive", CONDITIONING, "Positive conditioning."),
            Input("negative", CONDITIONING, "Negative conditioning."),
            Input("control_net", CONTROL_NET, "The ControlNet."),
            Input("vae", VAE, "The VAE (for ControlNets working in latent space)."),
            Input("image", IMAGE, "The control image."),
            *_RANGE,
        ),
        outputs=_BRANCHES,
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        positive: Any,
        negative: Any,
        control_net: Any,
        vae: Any,
        image: Any,
        strength: float,
        start_percent: float,
        end_percent: float,
    ) -> tuple[Any, Any]:
        return _apply(ctx, positive, negative, control_net, image, strength, start_percent, end_percent, vae)


class CLIPTextEncodeControlnet(Node):
    SCHEMA = NodeSchema(
        node_id="CLIPTextEncodeControlnet",
        display_name="CLIP Text Encode (Controlnet)",
        category="model/conditioning",
        description="Gives the ControlNets of a conditioning their own prompt (the model keeps the conditioning's).",
        inputs=(
            Input("clip", CLIP, "The text encoder(s)."),
            Input("conditioning", CONDITIONING, "The conditioning whose ControlNets get the prompt."),
            Input("text", STRING, "The ControlNets' prompt.", multiline=True),
        ),
        outputs=(Output("CONDITIONING", CONDITIONING, "The conditioning with the ControlNets' prompt."),),
    )

    def run(self, ctx: NodeContext, *, clip: Any, conditioning: Any, text: str) -> tuple[Any]:
        with text_encoders(ctx, clip) as encoders:
            encoded = encode_prompt(text, clip, encoders)
        extra = {"cross_attn_controlnet": encoded.embeds, "pooled_output_controlnet": encoded.pooled}
        return ([replace(e, extras={**e.extras, **extra}) for e in conditioning],)


NODES: list[type[Node]] = [ControlNetInpaintingAliMamaApply, ControlNetApplySD3, CLIPTextEncodeControlnet]
