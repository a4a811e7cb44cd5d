"""Loader nodes for models kept as separate files (ComfyUI's ``UNETLoader``, ``CLIPLoader`` and ``DualCLIPLoader``,
same names, inputs and outputs): the denoiser alone from ``models/diffusion_models`` (or
``models/unet``) and the text encoders from ``models/text_encoders`` (or ``models/clip``). Like
the other loaders they read file headers only; the family is recognised from the tensors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.context import Folders, NodeContext
from engine.node import Node
from engine.schema import CLIP, COMBO, MODEL, DynamicOptions, Input, NodeSchema, Output
from nodes.core.model_files import file_fingerprint, pickle_allowed, require_model_files
from nodes.core.weights import read_index
from nodes.families.catalog import DUAL_CLIP_TYPES, SINGLE_CLIP_TYPES
from nodes.load.handles import DenoiserHandle, TextEncodersHandle, open_diffusion_model, open_text_encoders
from nodes.quant.gguf import is_gguf, require_gguf_role
from nodes.quant.storage import weight_dtype_patch, with_storage

WEIGHT_DTYPES = ("default", "fp8_e4m3fn", "fp8_e4m3fn_fast", "fp8_e5m2")
DEVICES = ("default", "cpu")


def load_diffusion_model(
    path: Path, node: str, *, allow_pickle: bool, weight_dtype: str = "default"
) -> DenoiserHandle:
    """The MODEL handle of a diffusion-model file (safetensors, fp8/scaled fp8, GGUF), its linear
    weights stored as ``weight_dtype`` asks (UNETLoader's choices)."""
    if is_gguf(path):
        require_gguf_role(read_index(path), "diffusion", node)
    handle = open_diffusion_model(path, allow_pickle=allow_pickle)
    patch = weight_dtype_patch(weight_dtype)
    return handle if patch is None else with_storage(handle, patch)


def load_text_encoders(
    paths: list[Path], clip_type: str, node: str, *, allow_pickle: bool
) -> TextEncodersHandle:
    """The CLIP handle of text-encoder files (safetensors, fp8/scaled fp8, GGUF)."""
    for path in paths:
        if is_gguf(path):
            require_gguf_role(read_index(path), "text", node)
    return open_text_encoders(paths, clip_type, allow_pickle=allow_pickle)


# Schema pieces the loaders of other file formats (nodes.quant's GGUF loaders) share.
MODEL_OUT = Output("MODEL", MODEL, "The denoising model and its family.")
CLIP_NAME = Input(
    "clip_name",
    COMBO,
    "The text encoder in models/text_encoders (or models/clip).",
    options=DynamicOptions("text_encoders"),
)
CLIP_TYPE = Input("type", COMBO, "The model family the encoder is for.", options=SINGLE_CLIP_TYPES)
CLIP_OUT = Output("CLIP", CLIP, "The text encoder that turns prompts into conditioning.")
CLIP_NAMES = (
    Input(
        "clip_name1",
        COMBO,
        "A text encoder in models/text_encoders (or models/clip).",
        options=DynamicOptions("text_encoders"),
    ),
    Input("clip_name2", COMBO, "The other text encoder.", options=DynamicOptions("text_encoders")),
)
DUAL_CLIP_TYPE = Input("type", COMBO, "The model family the encoders are for.", options=DUAL_CLIP_TYPES)
DUAL_CLIP_OUT = Output("CLIP", CLIP, "The text encoders that turn prompts into conditioning.")


class UNETLoader(Node):
    """Subclasses for other file formats (``UnetLoaderGGUF``) keep ``run`` and ``fingerprint``
    and declare their own SCHEMA (errors name the node by its ``node_id``)."""

    SCHEMA = NodeSchema(
        node_id="UNETLoader",
        display_name="Load Diffusion Model",
        category="advanced/loaders",
        description="Loads a diffusion model file on its own (a transformer or UNet without text encoders "
        "and VAE); the family is read from its tensors. Combine with DualCLIPLoader and VAELoader.",
        inputs=(
            Input(
                "unet_name",
                COMBO,
                "The model file in models/diffusion_models (or models/unet).",
                options=DynamicOptions("diffusion_models"),
            ),
            Input(
                "weight_dtype",
                COMBO,
                "Precision to store the linear weights in (computed in the device's "
                "precision): fp8 halves bf16 memory; _fast also multiplies in fp8 on GPUs that can; default "
                "keeps the file's precision.",
                options=WEIGHT_DTYPES,
                default="default",
            ),
        ),
        outputs=(MODEL_OUT,),
    )

    def run(
        self, ctx: NodeContext, *, unet_name: str, weight_dtype: str = "default"
    ) -> tuple[DenoiserHandle]:
        path = require_model_files(ctx).resolve("diffusion_models", unet_name)
        return (
            load_diffusion_model(
                path, self.SCHEMA.node_id, allow_pickle=pickle_allowed(ctx), weight_dtype=weight_dtype
            ),
        )

    @classmethod
    def fingerprint(cls, folders: Folders, **inputs: Any) -> Any:
        return file_fingerprint(folders, "diffusion_models", inputs.get("unet_name"))


class CLIPLoader(Node):
    SCHEMA = NodeSchema(
        node_id="CLIPLoader",
        display_name="Load CLIP",
        category="advanced/loaders",
        description="Loads one text-encoder file as the CLIP of the model family named by type.",
        inputs=(
            CLIP_NAME,
            CLIP_TYPE,
            Input(
                "device",
                COMBO,
                "Where to run the encoder.",
                options=DEVICES,
                default="default",
                optional=True,
            ),
        ),
        outputs=(CLIP_OUT,),
    )

    def run(
        self, ctx: NodeContext, *, clip_name: str, type: str, device: str = "default"
    ) -> tuple[TextEncodersHandle]:
        path = require_model_files(ctx).resolve("text_encoders", clip_name)
        return (load_text_encoders([path], type, self.SCHEMA.node_id, allow_pickle=pickle_allowed(ctx)),)

    @classmethod
    def fingerprint(cls, folders: Folders, **inputs: Any) -> Any:
        return file_fingerprint(folders, "text_encoders", inputs.get("clip_name"))


class DualCLIPLoader(Node):
    SCHEMA = NodeSchema(
        node_id="DualCLIPLoader",
        display_name="DualCLIPLoader",
        category="advanced/loaders",
        description="Loads two text-encoder files as one CLIP for the model family named by type; "
        "each file's encoder is recognised from its tensors, so the order does not matter.",
        inputs=(
            *CLIP_NAMES,
            DUAL_CLIP_TYPE,
            Input(
                "device",
                COMBO,
                "Where to run the encoders.",
                options=DEVICES,
                default="default",
                optional=True,
            ),
        ),
        outputs=(DUAL_CLIP_OUT,),
    )

    def run(
        self, ctx: NodeContext, *, clip_name1: str, clip_name2: str, type: str, device: str = "default"
    ) -> tuple[TextEncodersHandle]:
        files = require_model_files(ctx)
        paths = [files.resolve("text_encoders", clip_name1), files.resolve("text_encoders", clip_name2)]
        return (load_text_encoders(paths, type, self.SCHEMA.node_id, allow_pickle=pickle_allowed(ctx)),)

    @classmethod
    def fingerprint(cls, folders: Folders, **inputs: Any) -> Any:
        return [
            file_fingerprint(folders, "text_encoders", inputs.get(k)) for k in ("clip_name1", "clip_name2")
        ]


NODES: list[type[Node]] = [UNETLoader, CLIPLoader, DualCLIPLoader]
