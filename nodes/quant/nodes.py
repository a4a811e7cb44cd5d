"""Loader nodes for stored-precision files: ComfyUI-GGUF's ``UnetLoaderGGUF``, ``CLIPLoaderGGUF`` and
``DualCLIPLoaderGGUF`` (same names, inputs and outputs as that plugin; they load ``.gguf`` files and,
like the plugin's CLIP loaders, ordinary text-encoder files too), and Loom's ``ModelWeightStorage``,
which stores a MODEL's linear weights as fp8 or int8 (weight-only, computed in the compute dtype)."""

from __future__ import annotations

from typing import Any

from engine.context import Folders, NodeContext
from engine.node import Node
from engine.schema import CLIP, COMBO, MODEL, DynamicOptions, Input, NodeSchema, Output
from nodes.families import DUAL_CLIP_TYPES, SINGLE_CLIP_TYPES
from nodes.handles import DenoiserHandle, TextEncodersHandle
from nodes.loaders import _allow_pickle, _file_fingerprint, _models
from nodes.loaders_components import load_diffusion_model, load_text_encoders
from nodes.quant.storage import STORAGE_FORMATS, StoragePatch, with_storage


class UnetLoaderGGUF(Node):
    SCHEMA = NodeSchema(
        node_id="UnetLoaderGGUF", display_name="Unet Loader (GGUF)", category="bootleg",
        description="Loads a GGUF-quantized diffusion model (Q8_0, Q5_K, Q4_K, Q4_0, ... or F16/BF16); its weights "
                    "stay quantized and are dequantised layer by layer while sampling.",
        inputs=(Input("unet_name", COMBO, "The .gguf file in models/diffusion_models (or models/unet).",
                      options=DynamicOptions("unet_gguf")),),
        outputs=(Output("MODEL", MODEL, "The denoising model and its family."),),
    )

    def run(self, ctx: NodeContext, *, unet_name: str) -> tuple[DenoiserHandle]:
        path = _models(ctx).resolve("diffusion_models", unet_name)
        return (load_diffusion_model(path, "UnetLoaderGGUF", allow_pickle=_allow_pickle(ctx)),)

    @classmethod
    def fingerprint(cls, folders: Folders, **inputs: Any) -> Any:
        return _file_fingerprint(folders, "diffusion_models", inputs.get("unet_name"))


class CLIPLoaderGGUF(Node):
    SCHEMA = NodeSchema(
        node_id="CLIPLoaderGGUF", display_name="CLIPLoader (GGUF)", category="bootleg",
        description="Loads one text encoder (a .gguf file, e.g. a quantized T5-XXL, or an ordinary file) as the "
                    "CLIP of the model family named by type.",
        inputs=(Input("clip_name", COMBO, "The text encoder in models/text_encoders (or models/clip).",
                      options=DynamicOptions("text_encoders")),
                Input("type", COMBO, "The model family the encoder is for.", options=SINGLE_CLIP_TYPES)),
        outputs=(Output("CLIP", CLIP, "The text encoder that turns prompts into conditioning."),),
    )

    def run(self, ctx: NodeContext, *, clip_name: str, type: str) -> tuple[TextEncodersHandle]:
        path = _models(ctx).resolve("text_encoders", clip_name)
        return (load_text_encoders([path], type, "CLIPLoaderGGUF", allow_pickle=_allow_pickle(ctx)),)

    @classmethod
    def fingerprint(cls, folders: Folders, **inputs: Any) -> Any:
        return _file_fingerprint(folders, "text_encoders", inputs.get("clip_name"))


class DualCLIPLoaderGGUF(Node):
    SCHEMA = NodeSchema(
        node_id="DualCLIPLoaderGGUF", display_name="DualCLIPLoader (GGUF)", category="bootleg",
        description="Loads two text encoders (.gguf or ordinary files, in any order) as one CLIP for the model "
                    "family named by type, e.g. clip_l.safetensors with a quantized t5xxl .gguf.",
        inputs=(Input("clip_name1", COMBO, "A text encoder in models/text_encoders (or models/clip).",
                      options=DynamicOptions("text_encoders")),
                Input("clip_name2", COMBO, "The other text encoder.", options=DynamicOptions("text_encoders")),
                Input("type", COMBO, "The model family the encoders are for.", options=DUAL_CLIP_TYPES)),
        outputs=(Output("CLIP", CLIP, "The text encoders that turn prompts into conditioning."),),
    )

    def run(self, ctx: NodeContext, *, clip_name1: str, clip_name2: str, type: str) -> tuple[TextEncodersHandle]:
        models = _models(ctx)
        paths = [models.resolve("text_encoders", clip_name1), models.resolve("text_encoders", clip_name2)]
        return (load_text_encoders(paths, type, "DualCLIPLoaderGGUF", allow_pickle=_allow_pickle(ctx)),)

    @classmethod
    def fingerprint(cls, folders: Folders, **inputs: Any) -> Any:
        return [_file_fingerprint(folders, "text_encoders", inputs.get(k)) for k in ("clip_name1", "clip_name2")]


class ModelWeightStorage(Node):
    SCHEMA = NodeSchema(
        node_id="ModelWeightStorage", display_name="Model Weight Storage (Loom)", category="advanced/loaders",
        description="Stores the model's linear weights in fewer bytes and computes in the device's precision: "
                    "int8 (weight-only, one scale per output row; about 1 byte per weight, fused int8 matmul on "
                    "CPU) or fp8. Layers already quantized (GGUF, fp8 files) are left as they are.",
        inputs=(Input("model", MODEL, "The model whose weights to store."),
                Input("storage", COMBO, "The stored format.", options=STORAGE_FORMATS, default="int8")),
        outputs=(Output("MODEL", MODEL, "The model with its weights stored as chosen."),),
    )

    def run(self, ctx: NodeContext, *, model: DenoiserHandle, storage: str) -> tuple[DenoiserHandle]:
        return (with_storage(model, StoragePatch(storage)),)


QUANT_NODES: list[type[Node]] = [UnetLoaderGGUF, CLIPLoaderGGUF, DualCLIPLoaderGGUF, ModelWeightStorage]
