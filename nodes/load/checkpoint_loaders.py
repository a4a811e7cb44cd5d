"""Loader nodes with ComfyUI's class names, inputs and outputs. They return handles only (cheap:
they read file headers, never weights); weights are built inside ``ctx.models.use(handle)``.

Wiring (main.py): ``registry.register_all(NODES)`` and
``register_model_options(registry, model_files)`` for the file-list combos.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from engine.context import Folders, ModelFiles, NodeContext
from engine.node import Node, NodeOutput
from engine.registry import NodeRegistry
from engine.schema import (
    CLIP,
    COMBO,
    FLOAT,
    INT,
    MODEL,
    STRING,
    VAE,
    DynamicOptions,
    Input,
    NodeSchema,
    Output,
)
from nodes.core.model_files import file_fingerprint, pickle_allowed, require_model_files
from nodes.core.options import OptionSources
from nodes.core.save_prefix import split_prefix
from nodes.core.weights import fingerprint
from nodes.families.build import original_state_dict
from nodes.load.handles import (
    DenoiserHandle,
    TextEncodersHandle,
    VaeHandle,
    open_checkpoint,
    open_diffusers,
    open_vae,
)
from nodes.load.lora import LoraPatch, inspect_lora

OPTION_KINDS = (
    "checkpoints",
    "diffusers",
    "vae",
    "loras",
    "clip_vision",
    "ipadapter",
    "safety",
    "vae_approx",
    "embeddings",
    "upscale_models",
    "configs",
    "diffusion_models",
    "text_encoders",
    "controlnet",
    "style_models",
    "hypernetworks",
    "gligen",
    "model_patches",
)

_MODEL_OUT = Output("MODEL", MODEL, "The denoising model (UNet) and its family.")
_CLIP_OUT = Output("CLIP", CLIP, "The text encoder(s) that turn prompts into conditioning.")
_VAE_OUT = Output("VAE", VAE, "The autoencoder between images and latents.")


def register_model_options(registry: NodeRegistry, model_files: ModelFiles) -> None:
    """Combo options for each model kind: the files (or diffusers folders) found for it."""
    for kind in OPTION_KINDS:
        registry.add_options_source(kind, lambda kind=kind: model_files.list(kind))  # type: ignore[misc]
    # ComfyUI-GGUF's unet_gguf list: the .gguf files among the diffusion models
    registry.add_options_source(
        "unet_gguf", lambda: [n for n in model_files.list("diffusion_models") if n.lower().endswith(".gguf")]
    )


def _strength(name: str) -> Input:
    return Input(
        name,
        FLOAT,
        f"How strongly the LoRA changes the {'UNet' if 'model' in name else 'text encoder'}; "
        "0 leaves it unchanged, negative values invert it.",
        default=1.0,
        min=-100.0,
        max=100.0,
        step=0.01,
    )


class CheckpointLoaderSimple(Node):
    SCHEMA = NodeSchema(
        node_id="CheckpointLoaderSimple",
        display_name="Load Checkpoint",
        category="loaders",
        description="Loads a single-file checkpoint (.safetensors; the model family is read from its tensors) "
        "as MODEL, CLIP and VAE.",
        inputs=(
            Input(
                "ckpt_name",
                COMBO,
                "The checkpoint file in models/checkpoints.",
                options=DynamicOptions("checkpoints"),
            ),
        ),
        outputs=(_MODEL_OUT, _CLIP_OUT, _VAE_OUT),
    )

    def run(
        self, ctx: NodeContext, *, ckpt_name: str
    ) -> tuple[DenoiserHandle, TextEncodersHandle, VaeHandle]:
        ck = open_checkpoint(
            require_model_files(ctx).resolve("checkpoints", ckpt_name), allow_pickle=pickle_allowed(ctx)
        )
        return ck.unet, ck.clip, ck.vae

    @classmethod
    def fingerprint(cls, folders: Folders, **inputs: Any) -> Any:
        return file_fingerprint(folders, "checkpoints", inputs.get("ckpt_name"))


class DiffusersLoader(Node):
    SCHEMA = NodeSchema(
        node_id="DiffusersLoader",
        display_name="Diffusers Loader",
        category="advanced/loaders/deprecated",
        description="Loads a diffusers-format model folder (model_index.json + unet/, vae/, text_encoder/).",
        inputs=(
            Input(
                "model_path",
                COMBO,
                "The model folder in models/diffusers.",
                options=DynamicOptions("diffusers"),
            ),
        ),
        outputs=(_MODEL_OUT, _CLIP_OUT, _VAE_OUT),
    )

    def run(
        self, ctx: NodeContext, *, model_path: str
    ) -> tuple[DenoiserHandle, TextEncodersHandle, VaeHandle]:
        ck = open_diffusers(
            require_model_files(ctx).resolve("diffusers", model_path), allow_pickle=pickle_allowed(ctx)
        )
        return ck.unet, ck.clip, ck.vae

    @classmethod
    def fingerprint(cls, folders: Folders, **inputs: Any) -> Any:
        return file_fingerprint(folders, "diffusers", inputs.get("model_path"))


class VAELoader(Node):
    SCHEMA = NodeSchema(
        node_id="VAELoader",
        display_name="Load VAE",
        category="loaders",
        description="Loads a standalone VAE file (original or diffusers key layout).",
        inputs=(Input("vae_name", COMBO, "The VAE file in models/vae.", options=DynamicOptions("vae")),),
        outputs=(_VAE_OUT,),
    )

    def run(self, ctx: NodeContext, *, vae_name: str) -> tuple[VaeHandle]:
        return (
            open_vae(require_model_files(ctx).resolve("vae", vae_name), allow_pickle=pickle_allowed(ctx)),
        )

    @classmethod
    def fingerprint(cls, folders: Folders, **inputs: Any) -> Any:
        return file_fingerprint(folders, "vae", inputs.get("vae_name"))


def lora_patch(ctx: NodeContext, lora_name: str, strength: float, target: str) -> LoraPatch:
    """The patch applying models/loras/``lora_name`` at ``strength`` to ``target`` (unet | clip)."""
    path = require_model_files(ctx).resolve("loras", lora_name)
    inspect_lora(path, allow_pickle=pickle_allowed(ctx))
    return LoraPatch(path, fingerprint(path), float(strength), target, pickle_allowed(ctx))


class LoraLoader(Node):
    SCHEMA = NodeSchema(
        node_id="LoraLoader",
        display_name="Load LoRA",
        category="loaders",
        description="Applies a LoRA (kohya or diffusers/PEFT file) to the model and the text encoder.",
        inputs=(
            Input("model", MODEL, "The model the LoRA applies to."),
            Input("clip", CLIP, "The text encoder the LoRA applies to."),
            Input("lora_name", COMBO, "The LoRA file in models/loras.", options=DynamicOptions("loras")),
            _strength("strength_model"),
            _strength("strength_clip"),
        ),
        outputs=(
            Output("MODEL", MODEL, "The model with the LoRA."),
            Output("CLIP", CLIP, "The text encoder with the LoRA."),
        ),
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        model: DenoiserHandle,
        clip: TextEncodersHandle,
        lora_name: str,
        strength_model: float,
        strength_clip: float,
    ) -> tuple[DenoiserHandle, TextEncodersHandle]:
        if strength_model != 0:
            model = model.with_patch(lora_patch(ctx, lora_name, strength_model, "unet"))
        if strength_clip != 0:
            clip = clip.with_patch(lora_patch(ctx, lora_name, strength_clip, "clip"))
        return model, clip

    @classmethod
    def fingerprint(cls, folders: Folders, **inputs: Any) -> Any:
        return file_fingerprint(folders, "loras", inputs.get("lora_name"))


class LoraLoaderModelOnly(Node):
    SCHEMA = NodeSchema(
        node_id="LoraLoaderModelOnly",
        display_name="LoraLoaderModelOnly",
        category="loaders",
        description="Applies a LoRA to the model (UNet) only.",
        inputs=(
            Input("model", MODEL, "The model the LoRA applies to."),
            Input("lora_name", COMBO, "The LoRA file in models/loras.", options=DynamicOptions("loras")),
            _strength("strength_model"),
        ),
        outputs=(Output("MODEL", MODEL, "The model with the LoRA."),),
    )

    def run(
        self, ctx: NodeContext, *, model: DenoiserHandle, lora_name: str, strength_model: float
    ) -> tuple[DenoiserHandle]:
        if strength_model != 0:
            model = model.with_patch(lora_patch(ctx, lora_name, strength_model, "unet"))
        return (model,)

    @classmethod
    def fingerprint(cls, folders: Folders, **inputs: Any) -> Any:
        return file_fingerprint(folders, "loras", inputs.get("lora_name"))


class CLIPSetLastLayer(Node):
    SCHEMA = NodeSchema(
        node_id="CLIPSetLastLayer",
        display_name="CLIP Set Last Layer",
        category="conditioning",
        description="Chooses which text encoder layer's output conditions the model (-1 last, -2 penultimate).",
        inputs=(
            Input("clip", CLIP, "The text encoder."),
            Input(
                "stop_at_clip_layer",
                INT,
                "The layer whose output is used, counted from the end.",
                default=-1,
                min=-24,
                max=-1,
                step=1,
            ),
        ),
        outputs=(_CLIP_OUT,),
    )

    def run(
        self, ctx: NodeContext, *, clip: TextEncodersHandle, stop_at_clip_layer: int
    ) -> tuple[TextEncodersHandle]:
        return (replace(clip, layer=int(stop_at_clip_layer)),)


class T5TokenizerOptions(Node):
    SCHEMA = NodeSchema(
        node_id="T5TokenizerOptions",
        display_name="T5TokenizerOptions",
        category="_for_testing/conditioning",
        description="Set how T5 prompts are padded: min_padding pad tokens after the end token, then pads up to "
        "min_length tokens (0 and 0: no padding at all, replacing the model's own length).",
        inputs=(
            Input("clip", CLIP, "The text encoders whose T5 tokenizer to set."),
            Input(
                "min_padding",
                INT,
                "Pad tokens always added after the end token.",
                default=0,
                min=0,
                max=10000,
                step=1,
            ),
            Input(
                "min_length", INT, "Pad up to at least this many tokens.", default=0, min=0, max=10000, step=1
            ),
        ),
        outputs=(_CLIP_OUT,),
    )

    def run(
        self, ctx: NodeContext, *, clip: TextEncodersHandle, min_padding: int, min_length: int
    ) -> tuple[TextEncodersHandle]:
        options = {
            f"{t5}_{name}": int(value)
            for t5 in T5_TOKENIZER_KEYS
            for name, value in (("min_padding", min_padding), ("min_length", min_length))
        }
        return (clip.with_tokenizer_options(options),)


class CheckpointSave(Node):
    SCHEMA = NodeSchema(
        node_id="CheckpointSave",
        display_name="Save Checkpoint",
        category="advanced/model_merging",
        description="Writes MODEL, CLIP and VAE (patches merged) as one single-file checkpoint in the original layout.",
        inputs=(
            Input("model", MODEL, "The model to save."),
            Input("clip", CLIP, "The text encoder(s) to save."),
            Input("vae", VAE, "The VAE to save."),
            Input(
                "filename_prefix",
                STRING,
                "File name prefix, may start with a subfolder of the output folder.",
                default="checkpoints/ComfyUI",
            ),
        ),
        outputs=(),
        output_node=True,
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        model: DenoiserHandle,
        clip: TextEncodersHandle,
        vae: VaeHandle,
        filename_prefix: str,
    ) -> NodeOutput:
        family = model.family
        sd: dict[str, Any] = {}
        for handle, prefixes in (
            (model, {"unet": family.denoiser_prefix}),
            (vae, {"vae": family.vae_prefix}),
            (clip, {s.name: s.prefix for s in family.text_encoders}),
        ):
            with ctx.models.use(handle) as module:
                for part in handle.parts:
                    sub = module[part.name] if isinstance(handle, TextEncodersHandle) else module
                    tensors = original_state_dict(part, sub, prefix=prefixes.get(part.name, part.prefix))
                    sd.update({k: v.to("cpu") for k, v in tensors.items()})
        if model.prediction == "v_prediction":
            sd["v_pred"] = torch.zeros(0)
        path = next_checkpoint_path(ctx.folders.output_dir, filename_prefix)
        meta = {"format": "pt", "loom.family": family.name, "modelspec.prediction_type": model.prediction}
        save_file(sd, str(path), metadata=meta)
        sub = path.parent.relative_to(ctx.folders.output_dir).as_posix()
        return NodeOutput(ui={"checkpoints": [{"filename": path.name, "subfolder": sub, "type": "output"}]})


def next_checkpoint_path(output_dir: Path, prefix: str) -> Path:
    """``<output>/<subfolder>/<name>_<counter:05>_.safetensors`` (ComfyUI's naming; an empty
    prefix is ComfyUI's default name)."""
    sub, name = split_prefix(prefix)
    if Path(prefix).is_absolute() or ".." in Path(prefix).parts:
        raise ValueError(
            f"filename_prefix {prefix!r} must be a relative name inside the output folder, without '..', "
            "e.g. 'checkpoints/mine'"
        )
    folder = (output_dir / sub).resolve()
    if not folder.is_relative_to(output_dir.resolve()):
        raise ValueError(f"filename_prefix {prefix!r} leaves the output folder")
    folder.mkdir(parents=True, exist_ok=True)
    pattern = re.compile(rf"^{re.escape(name)}_(\d+)_\.safetensors$")
    used = [int(m.group(1)) for p in folder.iterdir() if (m := pattern.match(p.name))]
    return folder / f"{name}_{max(used, default=0) + 1:05d}_.safetensors"


# the T5 encoders whose options ComfyUI's T5TokenizerOptions sets (Loom's Flux/Chroma/SD3 one is t5xxl)
T5_TOKENIZER_KEYS = ("t5xxl", "pile_t5xl", "t5base", "mt5xl", "umt5xxl")

NODES: list[type[Node]] = [
    CheckpointLoaderSimple,
    DiffusersLoader,
    VAELoader,
    LoraLoader,
    LoraLoaderModelOnly,
    CLIPSetLastLayer,
    T5TokenizerOptions,
    CheckpointSave,
]


def register_options(registry: NodeRegistry, sources: OptionSources) -> None:
    """The model-file combos, when the run has model folders."""
    if sources.model_files is not None:
        register_model_options(registry, sources.model_files)
