"""unCLIP: ``unCLIPCheckpointLoader`` (an SD2.1 unCLIP checkpoint as MODEL, CLIP, VAE and the
CLIP_VISION stored in it) and ``unCLIPConditioning`` (an image's CLIP vision embeds added to a
conditioning, with a strength and a noise augmentation).

The conditioning value carries the embeds under ``extras["unclip_conditioning"]`` (a tuple of
``UnclipInput``, appended to by each node as ComfyUI appends to its list); the model's denoiser kind
turns them into its input when sampling (``nodes.families.components.unclip_adm``): an SD2.1 unCLIP
UNet's class labels, SDXL's pooled input ("revision" workflows). A model that takes no image
embeddings refuses such a conditioning with a teaching error when sampled.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from engine.context import Folders, NodeContext
from engine.node import Node
from engine.schema import (
    CLIP,
    COMBO,
    CONDITIONING,
    FLOAT,
    MODEL,
    VAE,
    DynamicOptions,
    Input,
    NodeSchema,
    Output,
)
from nodes.core.cond import Conditioning
from nodes.core.model_files import file_fingerprint, require_model_files
from nodes.core.tensors import ModelLoadError
from nodes.core.weights import read_index
from nodes.encode.clip_vision import CLIP_VISION, CLIP_VISION_OUTPUT, ClipVisionHandle, ClipVisionOutput
from nodes.families.components.unclip_adm import UnclipInput
from nodes.load.handles import DenoiserHandle, TextEncodersHandle, VaeHandle, open_checkpoint


def open_unclip_checkpoint(path: Any, *, allow_pickle: bool = False) -> tuple[Any, ...]:
    """MODEL, CLIP, VAE and CLIP_VISION handles of a single-file checkpoint that holds an image
    tower (SD2.1 unCLIP: ``embedder.model.visual.``); a teaching error for one without."""
    ck = open_checkpoint(path, allow_pickle=allow_pickle)
    prefix = getattr(ck.unet.family, "clip_vision_prefix", None)
    index = read_index(path, allow_pickle=allow_pickle)
    if prefix is None or not index.any_with(prefix):
        raise ModelLoadError(
            f"{path}: this {ck.unet.family.title} checkpoint holds no CLIP vision model, so it is not an unCLIP "
            "checkpoint; load it with CheckpointLoaderSimple and a CLIP vision model with CLIPVisionLoader"
        )
    vision = ClipVisionHandle.from_file(path, allow_pickle=allow_pickle, prefix=prefix)
    return ck.unet, ck.clip, ck.vae, vision


class unCLIPCheckpointLoader(Node):  # noqa: N801 - ComfyUI's class name
    SCHEMA = NodeSchema(
        node_id="unCLIPCheckpointLoader",
        display_name="unCLIPCheckpointLoader",
        category="loaders",
        description="Loads an unCLIP checkpoint as MODEL, CLIP, VAE and the CLIP vision model stored in it.",
        inputs=(
            Input(
                "ckpt_name",
                COMBO,
                "The unCLIP checkpoint file in models/checkpoints.",
                options=DynamicOptions("checkpoints"),
            ),
        ),
        outputs=(
            Output("MODEL", MODEL, "The unCLIP denoising model (its UNet takes image embeddings)."),
            Output("CLIP", CLIP, "The text encoder."),
            Output("VAE", VAE, "The autoencoder."),
            Output(
                "CLIP_VISION",
                CLIP_VISION,
                "The image encoder stored in the checkpoint, for CLIPVisionEncode.",
            ),
        ),
    )

    def run(
        self, ctx: NodeContext, *, ckpt_name: str
    ) -> tuple[DenoiserHandle, TextEncodersHandle, VaeHandle, ClipVisionHandle]:
        path = require_model_files(ctx).resolve("checkpoints", ckpt_name)
        unet, clip, vae, vision = open_unclip_checkpoint(path, allow_pickle=ctx.settings.allow_pickle)
        return unet, clip, vae, vision

    @classmethod
    def fingerprint(cls, folders: Folders, **inputs: Any) -> Any:
        return file_fingerprint(folders, "checkpoints", inputs.get("ckpt_name"))


def add_unclip(conditioning: Conditioning, item: UnclipInput) -> Conditioning:
    """Every entry with ``item`` appended to its unCLIP conditionings (ComfyUI's append=True)."""
    out = []
    for e in conditioning:
        previous = tuple(e.extras.get("unclip_conditioning") or ())
        out.append(replace(e, extras={**e.extras, "unclip_conditioning": (*previous, item)}))
    return out


class unCLIPConditioning(Node):  # noqa: N801 - ComfyUI's class name
    SCHEMA = NodeSchema(
        node_id="unCLIPConditioning",
        display_name="unCLIPConditioning",
        category="conditioning",
        description="Adds an image's CLIP vision embedding to a conditioning, for unCLIP models (and revision "
        "workflows); several stack (they are summed).",
        inputs=(
            Input("conditioning", CONDITIONING, "The conditioning to add the image to."),
            Input("clip_vision_output", CLIP_VISION_OUTPUT, "CLIPVisionEncode's output for the image."),
            Input(
                "strength",
                FLOAT,
                "How strongly the image guides; 0 leaves the conditioning unchanged.",
                default=1.0,
                min=-10.0,
                max=10.0,
                step=0.01,
            ),
            Input(
                "noise_augmentation",
                FLOAT,
                "Noise added to the image embedding: higher values keep less of the "
                "image and let the prompt and model vary more.",
                default=0.0,
                min=0.0,
                max=1.0,
                step=0.01,
            ),
        ),
        outputs=(Output("CONDITIONING", CONDITIONING, "The conditioning with the image embedding added."),),
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        conditioning: Conditioning,
        clip_vision_output: ClipVisionOutput,
        strength: float,
        noise_augmentation: float,
    ) -> tuple[Conditioning]:
        if strength == 0:
            return (conditioning,)
        embeds = getattr(clip_vision_output, "image_embeds", None)
        if embeds is None or embeds.ndim != 2:
            raise TypeError(
                "input 'clip_vision_output' must come from CLIPVisionEncode (image embeddings of shape "
                f"[images, width]); got {type(clip_vision_output).__name__}"
            )
        return (
            add_unclip(conditioning, UnclipInput(embeds.float(), float(strength), float(noise_augmentation))),
        )


NODES = (unCLIPCheckpointLoader, unCLIPConditioning)
