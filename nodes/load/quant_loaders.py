"""Loader nodes for stored-precision files: ComfyUI-GGUF's ``UnetLoaderGGUF``, ``CLIPLoaderGGUF`` and
``DualCLIPLoaderGGUF`` (same names, inputs and outputs as that plugin; they load ``.gguf`` files and,
like the plugin's CLIP loaders, ordinary text-encoder files too), and Loom's ``ModelWeightStorage``,
which stores a MODEL's linear weights as fp8 or int8 (weight-only, computed in the compute dtype)."""

from __future__ import annotations

from engine.context import NodeContext
from engine.node import Node
from engine.schema import COMBO, MODEL, DynamicOptions, Input, NodeSchema, Output
from nodes.load.component_loaders import (
    CLIP_NAME,
    CLIP_NAMES,
    CLIP_OUT,
    CLIP_TYPE,
    DUAL_CLIP_OUT,
    DUAL_CLIP_TYPE,
    MODEL_OUT,
    CLIPLoader,
    DualCLIPLoader,
    UNETLoader,
)
from nodes.load.handles import DenoiserHandle
from nodes.quant.storage import STORAGE_FORMATS, StoragePatch, with_storage


class UnetLoaderGGUF(UNETLoader):
    """UNETLoader's run on a .gguf file (no weight_dtype: the file's quantization is kept)."""

    SCHEMA = NodeSchema(
        node_id="UnetLoaderGGUF",
        display_name="Unet Loader (GGUF)",
        category="bootleg",
        description="Loads a GGUF-quantized diffusion model (Q8_0, Q5_K, Q4_K, Q4_0, ... or F16/BF16); its weights "
        "stay quantized and are dequantised layer by layer while sampling.",
        inputs=(
            Input(
                "unet_name",
                COMBO,
                "The .gguf file in models/diffusion_models (or models/unet).",
                options=DynamicOptions("unet_gguf"),
            ),
        ),
        outputs=(MODEL_OUT,),
    )


class CLIPLoaderGGUF(CLIPLoader):
    """CLIPLoader without the device input."""

    SCHEMA = NodeSchema(
        node_id="CLIPLoaderGGUF",
        display_name="CLIPLoader (GGUF)",
        category="bootleg",
        description="Loads one text encoder (a .gguf file, e.g. a quantized T5-XXL, or an ordinary file) as the "
        "CLIP of the model family named by type.",
        inputs=(CLIP_NAME, CLIP_TYPE),
        outputs=(CLIP_OUT,),
    )


class DualCLIPLoaderGGUF(DualCLIPLoader):
    """DualCLIPLoader without the device input."""

    SCHEMA = NodeSchema(
        node_id="DualCLIPLoaderGGUF",
        display_name="DualCLIPLoader (GGUF)",
        category="bootleg",
        description="Loads two text encoders (.gguf or ordinary files, in any order) as one CLIP for the model "
        "family named by type, e.g. clip_l.safetensors with a quantized t5xxl .gguf.",
        inputs=(*CLIP_NAMES, DUAL_CLIP_TYPE),
        outputs=(DUAL_CLIP_OUT,),
    )


class ModelWeightStorage(Node):
    SCHEMA = NodeSchema(
        node_id="ModelWeightStorage",
        display_name="Model Weight Storage (Loom)",
        category="advanced/loaders",
        description="Stores the model's linear weights in fewer bytes and computes in the device's precision: "
        "int8 (weight-only, one scale per output row; about 1 byte per weight, fused int8 matmul on "
        "CPU) or fp8. Layers already quantized (GGUF, fp8 files) are left as they are.",
        inputs=(
            Input("model", MODEL, "The model whose weights to store."),
            Input("storage", COMBO, "The stored format.", options=STORAGE_FORMATS, default="int8"),
        ),
        outputs=(Output("MODEL", MODEL, "The model with its weights stored as chosen."),),
    )

    def run(self, ctx: NodeContext, *, model: DenoiserHandle, storage: str) -> tuple[DenoiserHandle]:
        return (with_storage(model, StoragePatch(storage)),)


NODES: list[type[Node]] = [UnetLoaderGGUF, CLIPLoaderGGUF, DualCLIPLoaderGGUF, ModelWeightStorage]
