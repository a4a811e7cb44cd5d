"""ComfyUI's Qwen-Image nodes (``comfy_extras/nodes_qwen.py``,
``nodes_model_merging_model_specific.py``; same names, inputs and semantics):

- ``TextEncodeQwenImageEdit`` / ``TextEncodeQwenImageEditPlus``: the edit models' prompt encoding. With
  input images ComfyUI feeds them through Qwen2.5-VL's vision tower into the prompt; Loom loads only
  the language model, so an image input is refused with an error that says so (no image is silently
  dropped). Without images they encode the text as ComfyUI does (Edit: Qwen-Image's template; Edit
  Plus: the edit template).
- ``ModelMergeQwenImage``: block-wise merging with one ratio per named part of the transformer.
"""

from __future__ import annotations

from typing import Any

from engine.context import NodeContext
from engine.node import Node
from engine.schema import CLIP, CONDITIONING, IMAGE, STRING, VAE, Input, NodeSchema, Output
from nodes.conditioning import CondEntry, Conditioning, text_encoders
from nodes.families.qwen_image import QwenImagePrompt
from nodes.model_merge import _M1, _M2, _MODEL_OUT, _SPECIFIC, BlockMerge, _ratio, _schema

EDIT_TEMPLATE = (
    "<|im_start|>system\nDescribe the key features of the input image (color, shape, size, texture, "
    "objects, background), then explain how the user's text instruction should alter or modify the "
    "image. Generate a new image that meets the user's requirements while maintaining consistency "
    "with the original input where appropriate.<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n"
    "<|im_start|>assistant\n"
)
_COND_OUT = Output(
    "CONDITIONING", CONDITIONING, "The encoded instruction, for a sampler's positive/negative."
)
_CLIP = Input("clip", CLIP, "The Qwen-Image text encoder (CLIPLoader, type qwen_image).")
_PROMPT = Input("prompt", STRING, "The edit instruction.", multiline=True)
_VAE = Input("vae", VAE, "The Qwen-Image VAE, to add the input images as reference latents.", optional=True)


class QwenEditError(ValueError):
    """An edit-encoding request Loom cannot serve; the message says why and what to do."""


def _needs_vision(node: str, count: int) -> QwenEditError:
    return QwenEditError(
        f"{node} got {count} input image(s): Qwen-Image-Edit reads them with Qwen2.5-VL's vision tower, and Loom "
        "loads only Qwen2.5-VL's language model (the text path), so it cannot encode images into the prompt yet. "
        "Disconnect the image input(s) to encode the instruction alone, or add the image as a reference latent "
        "with VAEEncode + ReferenceLatent (the model then sees the image, the text encoder does not)"
    )


def _encode(ctx: NodeContext, clip: Any, prompt: str, template: str | None, node: str) -> Conditioning:
    if not isinstance(clip.family.prompt, QwenImagePrompt):
        raise QwenEditError(
            f"{node} needs the Qwen-Image text encoder, got the {clip.family.title} CLIP; load "
            "qwen_2.5_vl_7b.safetensors with CLIPLoader (type qwen_image)"
        )
    with text_encoders(ctx, clip) as encoders:
        embeds, _ = clip.family.prompt.encode(prompt, encoders, template)
    return [CondEntry(embeds=embeds.float().cpu())]


class TextEncodeQwenImageEdit(Node):
    SCHEMA = NodeSchema(
        node_id="TextEncodeQwenImageEdit",
        display_name="TextEncodeQwenImageEdit",
        category="advanced/conditioning",
        description="Encode a Qwen-Image-Edit instruction. Image inputs need Qwen2.5-VL's vision tower, which Loom "
        "does not load: without an image it encodes the text with Qwen-Image's template.",
        inputs=(
            _CLIP,
            _PROMPT,
            _VAE,
            Input(
                "image",
                IMAGE,
                "The image to edit (needs the vision tower; see the description).",
                optional=True,
            ),
        ),
        outputs=(_COND_OUT,),
    )

    def run(
        self, ctx: NodeContext, *, clip: Any, prompt: str, vae: Any = None, image: Any = None
    ) -> tuple[Conditioning]:
        if image is not None:
            raise _needs_vision("TextEncodeQwenImageEdit", 1)
        return (_encode(ctx, clip, prompt, None, "TextEncodeQwenImageEdit"),)


class TextEncodeQwenImageEditPlus(Node):
    SCHEMA = NodeSchema(
        node_id="TextEncodeQwenImageEditPlus",
        display_name="TextEncodeQwenImageEditPlus",
        category="advanced/conditioning",
        description="Encode a Qwen-Image-Edit-2509 instruction with up to three pictures. Image inputs need "
        "Qwen2.5-VL's vision tower, which Loom does not load: without images it encodes the text "
        "with the edit template.",
        inputs=(
            _CLIP,
            _PROMPT,
            _VAE,
            *(
                Input(
                    f"image{i}",
                    IMAGE,
                    f"Picture {i} (needs the vision tower; see the description).",
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
        count = sum(i is not None for i in (image1, image2, image3))
        if count:
            raise _needs_vision("TextEncodeQwenImageEditPlus", count)
        return (_encode(ctx, clip, prompt, EDIT_TEMPLATE, "TextEncodeQwenImageEditPlus"),)


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
    SCHEMA = _schema(
        "ModelMergeQwenImage",
        "Merge two Qwen-Image transformers with one ratio per part (embedders, each of the 60 blocks, "
        "the output projection); weights no input names take the first ratio.",
        (_M1, _M2, *(_ratio(n, f"Share of model1 in the weights named {n}*.") for n in MERGE_PARTS)),
        _MODEL_OUT,
        _SPECIFIC,
    )


QWEN_IMAGE_NODES: list[type[Node]] = [
    TextEncodeQwenImageEdit,
    TextEncodeQwenImageEditPlus,
    ModelMergeQwenImage,
]
