"""Saving MODEL / CLIP / VAE as single safetensors files in ComfyUI's layouts, and ComfyUI's
CheckpointLoader (the one with a config list).

Layouts (what ComfyUI's ``ModelSave`` / ``CLIPSave`` / ``VAESave`` write, so the files load in
either program): the MODEL as ``model.diffusion_model.`` + the original (LDM) UNet names, with a
``v_pred`` marker for v-prediction; each text encoder in its own file
(``{prefix}_{name}_NNNNN_.safetensors``) with transformers' names (``text_model.*``,
``text_projection.weight``); the VAE with the original names and no prefix. The tensors are
those of the resident module (patches such as merges and LoRAs included), converted by the
family's key tables (``to_original``), so the same tables read them back.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from engine.context import NodeContext
from engine.node import Node, NodeOutput
from engine.schema import (
    CLIP,
    COMBO,
    HIDDEN_EXTRA_PNGINFO,
    HIDDEN_PROMPT,
    MODEL,
    STRING,
    VAE,
    DynamicOptions,
    Input,
    NodeSchema,
    Output,
)
from nodes.core.model_files import file_fingerprint, pickle_allowed, require_model_files
from nodes.core.tensors import ModelLoadError
from nodes.families.build import original_state_dict
from nodes.load.checkpoint_loaders import next_checkpoint_path
from nodes.load.handles import open_checkpoint

UNET_SAVE_PREFIX = "model.diffusion_model."


def _metadata(prompt: Any, extra_pnginfo: Any) -> dict[str, str]:
    """ComfyUI's save metadata: the API prompt and the editor's extra info, as JSON strings."""
    meta = {"prompt": json.dumps(prompt) if prompt is not None else ""}
    for key, value in (extra_pnginfo or {}).items():
        meta[key] = json.dumps(value)
    return meta


def write_model_file(
    ctx: NodeContext, tensors: dict[str, Any], prefix: str, meta: dict[str, str]
) -> dict[str, str]:
    path = next_checkpoint_path(ctx.folders.output_dir, prefix)
    save_file({k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}, str(path), metadata=meta)
    return {
        "filename": path.name,
        "subfolder": path.parent.relative_to(ctx.folders.output_dir).as_posix(),
        "type": "output",
    }


def model_tensors(ctx: NodeContext, model: Any) -> dict[str, Any]:
    """The MODEL's weights as ComfyUI saves them (LDM names under ``model.diffusion_model.``)."""
    with ctx.models.use(model) as module:
        (part,) = model.parts
        sd = original_state_dict(part, module, prefix=UNET_SAVE_PREFIX)
    if model.prediction == "v_prediction":
        sd["v_pred"] = torch.zeros(0)
    return sd


def clip_tensors(ctx: NodeContext, clip: Any) -> dict[str, dict[str, Any]]:
    """Each text encoder's weights in transformers' names (ComfyUI's CLIPSave layout), by name."""

    def name(key: str) -> str:  # a CLIPTextModel's state dict lacks the text_model. level
        return key if key.startswith(("text_model.", "text_projection.")) else f"text_model.{key}"

    with ctx.models.use(clip) as module:
        return {
            part.name: {
                name(k): v.detach().to("cpu")
                for k, v in module[part.name].state_dict().items()
                if not k.endswith("position_ids")
            }
            for part in clip.parts
        }


def vae_tensors(ctx: NodeContext, vae: Any) -> dict[str, Any]:
    """The VAE's weights in the original names, no prefix (ComfyUI's VAESave layout)."""
    with ctx.models.use(vae) as module:
        (part,) = vae.parts
        return original_state_dict(part, module, prefix="")


def _prefix_input(default: str) -> Input:
    return Input(
        "filename_prefix",
        STRING,
        "File name prefix; may start with a subfolder of the output folder.",
        default=default,
    )


_HIDDEN = (HIDDEN_PROMPT, HIDDEN_EXTRA_PNGINFO)


class ModelSave(Node):
    SCHEMA = NodeSchema(
        node_id="ModelSave",
        display_name="ModelSave",
        category="advanced/model_merging",
        description="Save the diffusion model (patches and merges applied) as one .safetensors file.",
        inputs=(Input("model", MODEL, "The model to save."), _prefix_input("diffusion_models/ComfyUI")),
        outputs=(),
        output_node=True,
        hidden=_HIDDEN,
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        model: Any,
        filename_prefix: str,
        prompt: Any = None,
        extra_pnginfo: Any = None,
    ) -> NodeOutput:
        saved = write_model_file(
            ctx, model_tensors(ctx, model), filename_prefix, _metadata(prompt, extra_pnginfo)
        )
        return NodeOutput(ui={"models": [saved]})


class CLIPSave(Node):
    SCHEMA = NodeSchema(
        node_id="CLIPSave",
        display_name="CLIPSave",
        category="advanced/model_merging",
        description="Save each text encoder of a CLIP as its own .safetensors file (name suffixed _clip_l, ...).",
        inputs=(Input("clip", CLIP, "The text encoder(s) to save."), _prefix_input("clip/ComfyUI")),
        outputs=(),
        output_node=True,
        hidden=_HIDDEN,
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        clip: Any,
        filename_prefix: str,
        prompt: Any = None,
        extra_pnginfo: Any = None,
    ) -> NodeOutput:
        meta = _metadata(prompt, extra_pnginfo)
        saved = [
            write_model_file(ctx, tensors, f"{filename_prefix}_{name}", meta)
            for name, tensors in clip_tensors(ctx, clip).items()
        ]
        return NodeOutput(ui={"models": saved})


class VAESave(Node):
    SCHEMA = NodeSchema(
        node_id="VAESave",
        display_name="VAESave",
        category="advanced/model_merging",
        description="Save the VAE as one .safetensors file in the original layout.",
        inputs=(Input("vae", VAE, "The VAE to save."), _prefix_input("vae/ComfyUI_vae")),
        outputs=(),
        output_node=True,
        hidden=_HIDDEN,
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        vae: Any,
        filename_prefix: str,
        prompt: Any = None,
        extra_pnginfo: Any = None,
    ) -> NodeOutput:
        saved = write_model_file(
            ctx, vae_tensors(ctx, vae), filename_prefix, _metadata(prompt, extra_pnginfo)
        )
        return NodeOutput(ui={"models": [saved]})


def read_config(path: Path) -> dict[str, Any]:
    """What ComfyUI takes from an LDM ``.yaml`` model config: ``parameterization`` ("v" means
    v-prediction) and the text encoder's ``layer_idx``; the rest comes from the tensors."""
    import yaml  # lazy: PyYAML (~50 ms); only a config save needs it

    try:
        config = yaml.safe_load(path.read_text())
        params = config["model"]["params"]
        clip_params = params.get("cond_stage_config", {}).get("params", {}) or {}
    except (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError) as exc:
        raise ModelLoadError(
            f"{path.name}: not an LDM model config (model.params missing or unreadable: {exc}); "
            "pick one of the .yaml files in models/configs, or use CheckpointLoaderSimple"
        ) from exc
    return {"parameterization": params.get("parameterization"), "layer_idx": clip_params.get("layer_idx")}


class CheckpointLoader(Node):
    SCHEMA = NodeSchema(
        node_id="CheckpointLoader",
        display_name="Load Checkpoint With Config (DEPRECATED)",
        category="advanced/loaders",
        description="Load a checkpoint with an LDM .yaml config (only its v-prediction and CLIP layer settings "
        "are used; the architecture is read from the tensors).",
        inputs=(
            Input(
                "config_name", COMBO, "The model config in models/configs.", options=DynamicOptions("configs")
            ),
            Input(
                "ckpt_name",
                COMBO,
                "The checkpoint file in models/checkpoints.",
                options=DynamicOptions("checkpoints"),
            ),
        ),
        outputs=(
            Output("MODEL", MODEL, "The denoising model (UNet) and its family."),
            Output("CLIP", CLIP, "The text encoder(s) that turn prompts into conditioning."),
            Output("VAE", VAE, "The autoencoder between images and latents."),
        ),
    )

    def run(self, ctx: NodeContext, *, config_name: str, ckpt_name: str) -> tuple[Any, Any, Any]:
        config = read_config(require_model_files(ctx).resolve("configs", config_name))
        ck = open_checkpoint(
            require_model_files(ctx).resolve("checkpoints", ckpt_name), allow_pickle=pickle_allowed(ctx)
        )
        model, clip = ck.unet, ck.clip
        if config["parameterization"] == "v":
            model = model.with_model_sampling(model.family.model_sampling("v_prediction"))
        if config["layer_idx"] is not None:
            clip = replace(clip, layer=int(config["layer_idx"]))
        return model, clip, ck.vae

    @classmethod
    def fingerprint(cls, folders: Any, **inputs: Any) -> Any:
        return (
            file_fingerprint(folders, "configs", inputs.get("config_name")),
            file_fingerprint(folders, "checkpoints", inputs.get("ckpt_name")),
        )


NODES: list[type[Node]] = [ModelSave, CLIPSave, VAESave, CheckpointLoader]
