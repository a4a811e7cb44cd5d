"""ComfyUI's nodes for the UNet families (SD1.x, SD2.x, SDXL; ``nodes.py``, ``comfy_extras/nodes_clip_sdxl.py``,
``nodes_model_merging_model_specific.py``; same names, inputs and semantics): ``CLIPTextEncodeSDXL`` (a
prompt per encoder with the size and crop ids), ``CLIPTextEncodeSDXLRefiner`` (the refiner's aesthetic
score) and the block-wise merges ``ModelMergeSD1`` / ``ModelMergeSD2`` / ``ModelMergeSDXL``."""

from __future__ import annotations

from typing import Any

import torch

from engine.context import NodeContext
from engine.node import Node
from engine.schema import CLIP, CONDITIONING, FLOAT, INT, STRING, Input, NodeSchema, Output
from nodes.core.cond import CondEntry, Conditioning
from nodes.encode.conditioning import encode_prompt, text_encoders
from nodes.encode.conditioning_edit import with_extras
from nodes.latent.vae import MAX_RESOLUTION
from nodes.load.model_merge import (
    MERGED_MODEL_OUT,
    MODEL_SPECIFIC,
    BlockMerge,
    block_ratio_inputs,
    merge_schema,
)


def size_input(name: str, default: int, what: str) -> Input:
    return Input(name, INT, what, default=default, min=0, max=MAX_RESOLUTION)


class CLIPTextEncodeSDXL(Node):
    SCHEMA = NodeSchema(
        node_id="CLIPTextEncodeSDXL",
        display_name="CLIPTextEncodeSDXL",
        category="advanced/conditioning",
        description="Encode separate prompts for the two text encoders (bigG and ViT-L), with size and crop conditioning.",
        inputs=(
            Input("clip", CLIP, "A CLIP with two text encoders (clip_l and clip_g)."),
            size_input("width", 1024, "Original image width the model is told about."),
            size_input("height", 1024, "Original image height the model is told about."),
            size_input("crop_w", 0, "Crop left offset the model is told about."),
            size_input("crop_h", 0, "Crop top offset the model is told about."),
            size_input("target_width", 1024, "Target width the model is told about."),
            size_input("target_height", 1024, "Target height the model is told about."),
            Input("text_g", STRING, "Prompt for the OpenCLIP bigG encoder.", multiline=True),
            Input("text_l", STRING, "Prompt for the CLIP ViT-L encoder.", multiline=True),
        ),
        outputs=(Output("CONDITIONING", CONDITIONING, "The encoded prompt with its size ids."),),
    )

    @torch.no_grad()
    def run(
        self,
        ctx: NodeContext,
        *,
        clip: Any,
        width: int,
        height: int,
        crop_w: int,
        crop_h: int,
        target_width: int,
        target_height: int,
        text_g: str,
        text_l: str,
    ) -> tuple[Conditioning]:
        names = [p.name for p in clip.parts]
        if "clip_l" not in names or len(names) < 2:
            raise ValueError(
                f"CLIPTextEncodeSDXL needs a CLIP with two text encoders (clip_l and clip_g), but this CLIP has "
                f"{names}; use CLIPTextEncode for this model"
            )
        parts, pooled = [], None
        with text_encoders(ctx, clip) as encoders:
            for enc in encoders:
                text = text_l if enc.spec.name == "clip_l" else text_g
                z, p = enc.kind.encode(
                    enc.module,
                    enc.tokenizer,
                    text,
                    enc.layer,
                    final_norm=enc.spec.final_norm,
                    pooled=enc.spec.pooled,
                )
                parts.append((enc, z))
                pooled = p if p is not None else pooled
            longest = max(z.shape[1] for _, z in parts)
            padded = []
            for enc, z in parts:  # the shorter prompt gets empty-prompt windows (ComfyUI's rule)
                if z.shape[1] < longest:
                    empty, _ = enc.kind.encode(
                        enc.module, enc.tokenizer, "", enc.layer, final_norm=enc.spec.final_norm, pooled=False
                    )
                    z = torch.cat([z, empty.repeat(1, (longest - z.shape[1]) // empty.shape[1], 1)], dim=1)
                padded.append(z)
        entry = CondEntry(
            embeds=torch.cat(padded, dim=-1).float().cpu(),
            pooled=None if pooled is None else pooled.float().cpu(),
            extras={
                "width": width,
                "height": height,
                "crop_w": crop_w,
                "crop_h": crop_h,
                "target_width": target_width,
                "target_height": target_height,
            },
        )
        return ([entry],)


class CLIPTextEncodeSDXLRefiner(Node):
    SCHEMA = NodeSchema(
        node_id="CLIPTextEncodeSDXLRefiner",
        display_name="CLIPTextEncodeSDXLRefiner",
        category="advanced/conditioning",
        description="Encode a prompt for a refiner model, with its aesthetic score and size conditioning.",
        inputs=(  # ComfyUI's order: clip last
            Input(
                "ascore",
                FLOAT,
                "Aesthetic score the refiner is told about.",
                default=6.0,
                min=0.0,
                max=1000.0,
                step=0.01,
            ),
            size_input("width", 1024, "Image width the refiner is told about."),
            size_input("height", 1024, "Image height the refiner is told about."),
            Input("text", STRING, "The prompt.", multiline=True),
            Input("clip", CLIP, "The refiner's CLIP."),
        ),
        outputs=(Output("CONDITIONING", CONDITIONING, "The encoded prompt with the refiner's ids."),),
    )

    def run(
        self, ctx: NodeContext, *, clip: Any, ascore: float, width: int, height: int, text: str
    ) -> tuple[Conditioning]:
        with text_encoders(ctx, clip) as encoders:
            entry = encode_prompt(text, clip, encoders)
        return (with_extras([entry], aesthetic_score=ascore, width=width, height=height),)


def unet_block_inputs(inputs: int, outputs: int, dot: str) -> tuple[Input, ...]:
    names = ["time_embed.", "label_emb."] + [f"input_blocks.{i}{dot}" for i in range(inputs)]
    names += [f"middle_block.{i}{dot}" for i in range(3)] + [
        f"output_blocks.{i}{dot}" for i in range(outputs)
    ]
    names.append("out.")
    return block_ratio_inputs(names)


class ModelMergeSD1(BlockMerge):
    SCHEMA = merge_schema(
        "ModelMergeSD1",
        "Merge two UNets of 12 input and 12 output blocks, one ratio per block.",
        unet_block_inputs(12, 12, "."),
        MERGED_MODEL_OUT,
        MODEL_SPECIFIC,
    )


class ModelMergeSD2(BlockMerge):
    SCHEMA = merge_schema(
        "ModelMergeSD2",
        "Merge two UNets of 12 input and 12 output blocks (v-prediction generation), one ratio per block.",
        unet_block_inputs(12, 12, "."),
        MERGED_MODEL_OUT,
        MODEL_SPECIFIC,
    )


class ModelMergeSDXL(BlockMerge):
    SCHEMA = merge_schema(
        "ModelMergeSDXL",
        "Merge two UNets of 9 input and 9 output blocks (with label_emb), one ratio per block.",
        unet_block_inputs(9, 9, ""),
        MERGED_MODEL_OUT,
        MODEL_SPECIFIC,
    )


NODES: list[type[Node]] = [
    CLIPTextEncodeSDXL,
    CLIPTextEncodeSDXLRefiner,
    ModelMergeSD1,
    ModelMergeSD2,
    ModelMergeSDXL,
]
