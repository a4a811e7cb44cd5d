"""ComfyUI's Flux nodes (``comfy_extras/nodes_flux.py``, ``nodes_sd3.py``, ``nodes_model_advanced.py``;
same names, inputs and semantics): ``CLIPTextEncodeFlux`` (separate CLIP-L and T5-XXL prompts plus the
guidance value), ``FluxGuidance`` (sets the distilled guidance on a conditioning),
``FluxDisableGuidance`` (no guidance embedding at all), ``EmptySD3LatentImage`` (16-channel empty
latents), ``ModelSamplingFlux`` (the time shift from the image size), and for Flux Kontext editing
``FluxKontextImageScale`` (the nearest Kontext training size) and
``FluxKontextMultiReferenceLatentMethod`` (how several reference latents are placed)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from engine.context import NodeContext
from engine.node import Node, OutputSizes
from engine.schema import (
    CLIP,
    COMBO,
    CONDITIONING,
    FLOAT,
    IMAGE,
    INT,
    LATENT,
    MODEL,
    STRING,
    Input,
    NodeSchema,
    Output,
)
from nodes.core.cond import CondEntry, Conditioning
from nodes.core.resize import resize_image
from nodes.core.tensor_sizes import latent_size
from nodes.diffusion.model_sampling import flux, flux_mu
from nodes.encode.conditioning import text_encoders
from nodes.latent.vae import MAX_RESOLUTION
from nodes.load.model_merge import MODEL_SPECIFIC, BlockMerge, block_ratio_inputs

_GUIDANCE = Input(
    "guidance",
    FLOAT,
    "The distilled guidance strength of Flux dev (ignored by schnell).",
    default=3.5,
    min=0.0,
    max=100.0,
    step=0.1,
)
_COND_OUT = Output("CONDITIONING", CONDITIONING, "The conditioning, for a sampler or guider.")


class FluxEncodeError(ValueError):
    """A CLIP that cannot encode Flux prompts; the message says which loader to use."""


class CLIPTextEncodeFlux(Node):
    SCHEMA = NodeSchema(
        node_id="CLIPTextEncodeFlux",
        display_name="CLIPTextEncodeFlux",
        category="advanced/conditioning/flux",
        description="Encode a Flux prompt: clip_l text for the pooled CLIP-L vector, t5xxl text for the T5 tokens, "
        "with the distilled guidance value.",
        inputs=(
            Input("clip", CLIP, "The Flux text encoders (DualCLIPLoader, type flux)."),
            Input("clip_l", STRING, "The prompt for CLIP-L.", multiline=True),
            Input("t5xxl", STRING, "The prompt for T5-XXL.", multiline=True),
            _GUIDANCE,
        ),
        outputs=(_COND_OUT,),
    )

    def run(
        self, ctx: NodeContext, *, clip: Any, clip_l: str, t5xxl: str, guidance: float
    ) -> tuple[Conditioning]:
        encode_pair = getattr(clip.family.prompt, "encode_pair", None)
        if encode_pair is None:
            raise FluxEncodeError(
                f"CLIPTextEncodeFlux needs Flux text encoders, got the {clip.family.title} CLIP; "
                "load clip_l and t5xxl with DualCLIPLoader (type flux) or use CLIPTextEncode"
            )
        with text_encoders(ctx, clip) as encoders:
            embeds, pooled = encode_pair(clip_l, t5xxl, encoders)
        entry = CondEntry(
            embeds=embeds.float().cpu(),
            pooled=None if pooled is None else pooled.float().cpu(),
            extras={"guidance": guidance},
        )
        return ([entry],)


class FluxGuidance(Node):
    SCHEMA = NodeSchema(
        node_id="FluxGuidance",
        display_name="FluxGuidance",
        category="advanced/conditioning/flux",
        description="Set the distilled guidance value of Flux dev on every entry of a conditioning.",
        inputs=(Input("conditioning", CONDITIONING, "The conditioning to change."), _GUIDANCE),
        outputs=(_COND_OUT,),
    )

    def run(self, ctx: NodeContext, *, conditioning: Conditioning, guidance: float) -> tuple[Conditioning]:
        return ([replace(e, extras={**e.extras, "guidance": guidance}) for e in conditioning],)


class FluxDisableGuidance(Node):
    SCHEMA = NodeSchema(
        node_id="FluxDisableGuidance",
        display_name="FluxDisableGuidance",
        category="advanced/conditioning/flux",
        description="This node completely disables the guidance embed on Flux and Flux like models",
        inputs=(Input("conditioning", CONDITIONING, "The conditioning to change."),),
        outputs=(_COND_OUT,),
    )

    def run(self, ctx: NodeContext, *, conditioning: Conditioning) -> tuple[Conditioning]:
        return ([replace(e, extras={**e.extras, "guidance": None}) for e in conditioning],)


# (width, height) Flux Kontext was trained at (ComfyUI's PREFERED_KONTEXT_RESOLUTIONS)
KONTEXT_RESOLUTIONS = (
    (672, 1568),
    (688, 1504),
    (720, 1456),
    (752, 1392),
    (800, 1328),
    (832, 1248),
    (880, 1184),
    (944, 1104),
    (1024, 1024),
    (1104, 944),
    (1184, 880),
    (1248, 832),
    (1328, 800),
    (1392, 752),
    (1456, 720),
    (1504, 688),
    (1568, 672),
)


def kontext_size(width: int, height: int) -> tuple[int, int]:
    """The Kontext resolution whose aspect ratio is closest to ``width / height`` (first on ties)."""
    aspect = width / height
    return min(KONTEXT_RESOLUTIONS, key=lambda wh: abs(aspect - wh[0] / wh[1]))


class FluxKontextImageScale(Node):
    SCHEMA = NodeSchema(
        node_id="FluxKontextImageScale",
        display_name="FluxKontextImageScale",
        category="advanced/conditioning/flux",
        description="This node resizes the image to one that is more optimal for flux kontext.",
        inputs=(
            Input("image", IMAGE, "The image to resize (cropped to the new aspect ratio around its centre)."),
        ),
        outputs=(Output("IMAGE", IMAGE, "The image at the nearest Kontext resolution (lanczos)."),),
    )

    def run(self, ctx: NodeContext, *, image: torch.Tensor) -> tuple[torch.Tensor]:
        width, height = kontext_size(image.shape[2], image.shape[1])
        return (resize_image(image, width, height, "lanczos", "center"),)


class FluxKontextMultiReferenceLatentMethod(Node):
    SCHEMA = NodeSchema(
        node_id="FluxKontextMultiReferenceLatentMethod",
        display_name="FluxKontextMultiReferenceLatentMethod",
        category="advanced/conditioning/flux",
        description="Choose how several reference latents are placed for the transformer: offset (side by side), "
        "index (one position index per reference), uxo/uno (diagonally past the image) or index_timestep_zero "
        "(as index, the references modulated at timestep 0: Qwen-Image-Edit-2511).",
        inputs=(
            Input("conditioning", CONDITIONING, "The conditioning with reference latents."),
            Input(
                "reference_latents_method",
                COMBO,
                "How the references' position ids are laid out.",
                options=("offset", "index", "uxo/uno", "index_timestep_zero"),
            ),
        ),
        outputs=(_COND_OUT,),
    )

    def run(
        self, ctx: NodeContext, *, conditioning: Conditioning, reference_latents_method: str
    ) -> tuple[Conditioning]:
        method = (
            "uxo"
            if "uxo" in reference_latents_method or "uso" in reference_latents_method
            else reference_latents_method
        )
        return ([replace(e, extras={**e.extras, "reference_latents_method": method}) for e in conditioning],)


class EmptySD3LatentImage(Node):
    SCHEMA = NodeSchema(
        node_id="EmptySD3LatentImage",
        display_name="EmptySD3LatentImage",
        category="latent/sd3",
        description="A batch of empty 16-channel latents (Flux, SD3) of a given image size, for txt2img.",
        inputs=(
            Input("width", INT, "Image width in pixels.", default=1024, min=16, max=MAX_RESOLUTION, step=16),
            Input(
                "height", INT, "Image height in pixels.", default=1024, min=16, max=MAX_RESOLUTION, step=16
            ),
            Input("batch_size", INT, "Number of images.", default=1, min=1, max=4096),
        ),
        outputs=(Output("LATENT", LATENT, "Zero latents [batch, 16, height/8, width/8]."),),
    )

    def run(self, ctx: NodeContext, *, width: int, height: int, batch_size: int) -> tuple[dict]:
        return ({"samples": torch.zeros(batch_size, 16, height // 8, width // 8)},)

    @classmethod
    def estimate_outputs(
        cls, *, width: Any = None, height: Any = None, batch_size: Any = None, **_: Any
    ) -> OutputSizes:
        return (latent_size(batch_size, 16, height, width),)


class ModelSamplingFlux(Node):
    SCHEMA = NodeSchema(
        node_id="ModelSamplingFlux",
        display_name="ModelSamplingFlux",
        category="advanced/model",
        description="Sample with Flux's time shift, its mu interpolated from base_shift (256 tokens) to max_shift "
        "(4096 tokens) by the image size.",
        inputs=(
            Input("model", MODEL, "The model."),
            Input(
                "max_shift",
                FLOAT,
                "Shift at 4096 image tokens (1024×1024).",
                default=1.15,
                min=0.0,
                max=100.0,
                step=0.01,
            ),
            Input(
                "base_shift",
                FLOAT,
                "Shift at 256 image tokens (256×256).",
                default=0.5,
                min=0.0,
                max=100.0,
                step=0.01,
            ),
            Input("width", INT, "Image width in pixels.", default=1024, min=16, max=MAX_RESOLUTION, step=8),
            Input("height", INT, "Image height in pixels.", default=1024, min=16, max=MAX_RESOLUTION, step=8),
        ),
        outputs=(Output("MODEL", MODEL, "The model with the new sampling."),),
    )

    def run(
        self, ctx: NodeContext, *, model: Any, max_shift: float, base_shift: float, width: int, height: int
    ) -> tuple[Any]:
        return (model.with_model_sampling(flux(shift=flux_mu(width, height, base_shift, max_shift))),)


def flux1_merge_inputs() -> tuple[Input, ...]:
    names = ["img_in.", "time_in.", "guidance_in", "vector_in.", "txt_in."]
    names += [f"double_blocks.{i}." for i in range(19)] + [f"single_blocks.{i}." for i in range(38)]
    names.append("final_layer.")
    return block_ratio_inputs(names)


class ModelMergeFlux1(BlockMerge):
    SCHEMA = NodeSchema(
        node_id="ModelMergeFlux1",
        display_name="ModelMergeFlux1",
        category=MODEL_SPECIFIC,
        description="Merge two Flux.1 transformers (19 double and 38 single blocks), one ratio per block; weights are "
        "named as in Black Forest Labs' files.",
        inputs=flux1_merge_inputs(),
        outputs=(Output("MODEL", MODEL, "The merged model (computed when it is loaded)."),),
    )


NODES: list[type[Node]] = [
    CLIPTextEncodeFlux,
    FluxGuidance,
    FluxDisableGuidance,
    EmptySD3LatentImage,
    ModelSamplingFlux,
    FluxKontextImageScale,
    FluxKontextMultiReferenceLatentMethod,
    ModelMergeFlux1,
]
