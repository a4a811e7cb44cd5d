"""``InstructPixToPixConditioning``: the source image for an InstructPix2Pix model.

The image (centre-cropped to multiples of 8) is VAE-encoded and put under both conditionings'
``concat_latent_image`` with an ``ip2p`` marker; the UNet (8 input channels for a 4-channel latent,
recognised from its first convolution in ``nodes.families.components.unet_inputs``) gets that
latent appended to its input at every step. The LATENT output is zeros of the image's latent size,
as in ComfyUI. A model that is not InstructPix2Pix refuses the conditioning when sampled.
"""

from __future__ import annotations

from typing import Any

import torch

from engine.context import NodeContext
from engine.node import Node
from engine.schema import CONDITIONING, IMAGE, LATENT, VAE, Input, NodeSchema, Output
from nodes.core.cond import Conditioning
from nodes.encode.conditioning_edit import with_extras
from nodes.latent.vae import crop_to_8, encode


class InstructPixToPixConditioning(Node):
    SCHEMA = NodeSchema(
        node_id="InstructPixToPixConditioning",
        display_name="InstructPixToPixConditioning",
        category="conditioning/instructpix2pix",
        description="Gives an InstructPix2Pix model the image to edit: encoded with the VAE and added to both "
        "conditionings; the prompt says what to change.",
        inputs=(
            Input("positive", CONDITIONING, "The edit instruction's conditioning."),
            Input("negative", CONDITIONING, "The negative conditioning."),
            Input("vae", VAE, "The VAE of the InstructPix2Pix checkpoint."),
            Input("pixels", IMAGE, "The image to edit (cropped to multiples of 8)."),
        ),
        outputs=(
            Output("positive", CONDITIONING, "Positive conditioning with the image."),
            Output("negative", CONDITIONING, "Negative conditioning with the image."),
            Output("latent", LATENT, "An empty latent of the image's size to sample."),
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
    ) -> tuple[Conditioning, Conditioning, dict]:
        if not isinstance(pixels, torch.Tensor) or pixels.ndim != 4:
            raise TypeError(
                "input 'pixels' must be an IMAGE ([batch, height, width, channels]); connect LoadImage "
                "or VAEDecode"
            )
        with ctx.models.use(vae) as module:
            concat = encode(module, crop_to_8(pixels))
        values = {"concat_latent_image": concat, "ip2p": True}
        return (
            with_extras(positive, **values),
            with_extras(negative, **values),
            {"samples": torch.zeros_like(concat)},
        )


NODES = (InstructPixToPixConditioning,)
