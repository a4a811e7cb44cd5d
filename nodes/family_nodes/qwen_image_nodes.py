"""ComfyUI's Qwen-Image nodes (``comfy_extras/nodes_qwen.py``,
``nodes_model_merging_model_specific.py``; same names, inputs and semantics):

- ``TextEncodeQwenImageEdit`` / ``TextEncodeQwenImageEditPlus``: the edit models' prompt encoding.
  Input pictures go through Qwen2.5-VL's vision tower into the prompt at the template's
  ``<|vision_start|><|image_pad|><|vision_end|>`` placeholders, and with a VAE they are also encoded
  as the model's reference latents (the scaling and templates are ComfyUI's; see
  :mod:`nodes.family_nodes.qwen_image_edit`). Without pictures they encode the text as ComfyUI does
  (Edit: Qwen-Image's template; Edit Plus: the edit template).
- ``ModelMergeQwenImage``: block-wise merging with one ratio per named part of the transformer.
"""

from __future__ import annotations

from typing import Any

from engine.context import NodeContext
from engine.node import Node
from engine.schema import CLIP, CONDITIONING, IMAGE, STRING, VAE, Input, NodeSchema, Output
from nodes.core.cond import Conditioning
from nodes.family_nodes.qwen_image_edit import (
    EDIT_TEMPLATE,
    IMAGE_TEMPLATE,
    PICTURE,
    PLUS_VISION_PIXELS,
    REFERENCE_PIXELS,
    QwenEditError,
    encode_edit,
    reference_latent,
    scale_to_pixels,
    with_references,
)
from nodes.load.model_merge import (
    MERGED_MODEL_OUT,
    MODEL_SPECIFIC,
    BlockMerge,
    block_ratio_inputs,
    merge_schema,
)

__all__ = ["EDIT_TEMPLATE", "QwenEditError", "TextEncodeQwenImageEdit", "TextEncodeQwenImageEditPlus"]

_COND_OUT = Output(
    "CONDITIONING", CONDITIONING, "The encoded instruction, for a sampler's positive/negative."
)
_CLIP = Input(
    "clip",
    CLIP,
    "The Qwen-Image text encoder (CLIPLoader, type qwen_image); with images its file must hold the "
    "Qwen2.5-VL vision tower (visual.*), as ComfyUI's qwen_2.5_vl_7b files do.",
)
_PROMPT = Input("prompt", STRING, "The edit instruction.", multiline=True)
_VAE = Input("vae", VAE, "The Qwen-Image VAE, to add the input images as reference latents.", optional=True)


class TextEncodeQwenImageEdit(Node):
    SCHEMA = NodeSchema(
        node_id="TextEncodeQwenImageEdit",
        display_name="TextEncodeQwenImageEdit",
        category="advanced/conditioning",
        description="Encode a Qwen-Image-Edit instruction. An image is scaled to about 1024×1024 pixels, read "
        "into the prompt by Qwen2.5-VL's vision tower and, with a VAE, added as the model's reference latent; "
        "without an image the text is encoded with Qwen-Image's template.",
        inputs=(
            _CLIP,
            _PROMPT,
            _VAE,
            Input(
                "image",
                IMAGE,
                "The image to edit (its first picture is read into the prompt).",
                optional=True,
            ),
        ),
        outputs=(_COND_OUT,),
    )

    def run(
        self, ctx: NodeContext, *, clip: Any, prompt: str, vae: Any = None, image: Any = None
    ) -> tuple[Conditioning]:
        node = "TextEncodeQwenImageEdit"
        if image is None:
            return (encode_edit(ctx, clip, prompt, None, (), node),)
        scaled = scale_to_pixels(image, REFERENCE_PIXELS)[..., :3]
        conditioning = encode_edit(ctx, clip, prompt, IMAGE_TEMPLATE, [scaled], node)
        references = [] if vae is None else [reference_latent(ctx, vae, scaled)]
        return (with_references(conditioning, references),)


class TextEncodeQwenImageEditPlus(Node):
    SCHEMA = NodeSchema(
        node_id="TextEncodeQwenImageEditPlus",
        display_name="TextEncodeQwenImageEditPlus",
        category="advanced/conditioning",
        description="Encode a Qwen-Image-Edit-2509 instruction with up to three pictures: each is named "
        '"Picture N:" in the prompt and read by Qwen2.5-VL\'s vision tower at about 384×384 pixels, and with '
        "a VAE added as a reference latent at about 1024×1024 pixels.",
        inputs=(
            _CLIP,
            _PROMPT,
            _VAE,
            *(
                Input(
                    f"image{i}",
                    IMAGE,
                    f"Picture {i} (its first image is read into the prompt).",
                    optional=True,
                )
                for i in (1, 2, 3)
            ),
        ),
        outputs=(_COND_OUT,),
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        clip: Any,
        prompt: str,
        vae: Any = None,
        image1: Any = None,
        image2: Any = None,
        image3: Any = None,
    ) -> tuple[Conditioning]:
        pictures, references, names = [], [], ""
        for number, image in enumerate((image1, image2, image3), start=1):
            if image is None:
                continue
            pictures.append(scale_to_pixels(image, PLUS_VISION_PIXELS)[..., :3])
            if vae is not None:
                references.append(reference_latent(ctx, vae, scale_to_pixels(image, REFERENCE_PIXELS, 8)))
            names += f"Picture {number}: {PICTURE}"
        conditioning = encode_edit(
            ctx, clip, names + prompt, EDIT_TEMPLATE, pictures, "TextEncodeQwenImageEditPlus"
        )
        return (with_references(conditioning, references),)


MERGE_PARTS = (
    "pos_embeds.",
    "img_in.",
    "txt_norm.",
    "txt_in.",
    "time_text_embed.",
    *(f"transformer_blocks.{i}." for i in range(60)),
    "proj_out.",
)


class ModelMergeQwenImage(BlockMerge):
    SCHEMA = merge_schema(
        "ModelMergeQwenImage",
        "Merge two Qwen-Image transformers with one ratio per part (embedders, each of the 60 blocks, "
        "the output projection); weights no input names take the first ratio.",
        block_ratio_inputs(MERGE_PARTS),
        MERGED_MODEL_OUT,
        MODEL_SPECIFIC,
    )


NODES: list[type[Node]] = [
    TextEncodeQwenImageEdit,
    TextEncodeQwenImageEditPlus,
    ModelMergeQwenImage,
]
