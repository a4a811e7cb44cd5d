"""A Loom-only node for the prompt LoRA syntax of A1111 and stable-diffusion.cpp users:
``<lora:name:weight>`` tags in the prompt apply models/loras/name to the model and the text encoder
and are removed from the text, which goes on to a text-encode node.

``<lora:name>`` means weight 1; ``<lora:name:w_model:w_clip>`` sets the two weights apart; ``name``
may leave out the extension and may hold sub-folders. ComfyUI has no such syntax (its prompts keep
the tags as words), so this is a node of its own, never a change to CLIPTextEncode.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from engine.context import Folders, ModelFiles, NodeContext
from engine.node import Node
from engine.schema import CLIP, MODEL, STRING, Input, NodeSchema, Output
from nodes.core.model_files import file_fingerprint, require_model_files
from nodes.load.checkpoint_loaders import lora_patch
from nodes.load.handles import DenoiserHandle, TextEncodersHandle

TAG = re.compile(r"<lora:([^:>]+)(?::([^:>]*))?(?::([^:>]*))?>", re.IGNORECASE)
LORA_EXTENSIONS = (".safetensors", ".pt", ".ckpt", ".bin", ".pth")


class PromptLoraError(ValueError):
    """A ``<lora:...>`` tag that cannot be applied; the message names the tag and how to fix it."""


@dataclass(frozen=True)
class LoraTag:
    name: str
    strength_model: float
    strength_clip: float


def _weight(tag: str, text: str | None, default: float) -> float:
    if text is None or not text.strip():
        return default
    try:
        return float(text)
    except ValueError:
        raise PromptLoraError(
            f"{tag}: the weight {text!r} is not a number; write e.g. <lora:name:0.8>"
        ) from None


def parse_lora_tags(prompt: str) -> tuple[str, list[LoraTag]]:
    """The prompt without its ``<lora:...>`` tags (spaces around them tidied) and the tags in order."""
    tags = []
    for match in TAG.finditer(prompt):
        model = _weight(match.group(0), match.group(2), 1.0)
        tags.append(LoraTag(match.group(1).strip(), model, _weight(match.group(0), match.group(3), model)))
    text = TAG.sub(" ", prompt)
    text = re.sub(r"[ \t]{2,}", " ", text)
    text = re.sub(r"\s+([,.])", r"\1", text).strip()
    return text, tags


def lora_file(files: ModelFiles, name: str) -> str:
    """The models/loras entry a tag's ``name`` means (the extension may be left out)."""
    known = files.list("loras")
    for candidate in (name, *(name + ext for ext in LORA_EXTENSIONS)):
        if candidate in known:
            return candidate
    shown = ", ".join(sorted(known)[:20]) or "none"
    raise PromptLoraError(
        f"<lora:{name}>: models/loras has no {name} (files there: {shown}); put the LoRA there or fix the name"
    )


class LoomPromptLoras(Node):
    SCHEMA = NodeSchema(
        node_id="LoomPromptLoras",
        display_name="Prompt LoRAs (<lora:name:weight>)",
        category="loaders",
        description="Apply the <lora:name:weight> tags of a prompt (A1111 / stable-diffusion.cpp syntax) and "
        "give the prompt without them.",
        inputs=(
            Input("model", MODEL, "The model the LoRAs apply to."),
            Input("clip", CLIP, "The text encoder the LoRAs apply to."),
            Input(
                "text",
                STRING,
                "The prompt with <lora:name>, <lora:name:weight> or <lora:name:model_weight:clip_weight> tags.",
                multiline=True,
            ),
        ),
        outputs=(
            Output("MODEL", MODEL, "The model with the LoRAs."),
            Output("CLIP", CLIP, "The text encoder with the LoRAs."),
            Output("text", STRING, "The prompt without the tags, for a text-encode node."),
        ),
    )

    def run(
        self, ctx: NodeContext, *, model: DenoiserHandle, clip: TextEncodersHandle, text: str
    ) -> tuple[DenoiserHandle, TextEncodersHandle, str]:
        cleaned, tags = parse_lora_tags(text)
        files = require_model_files(ctx)
        for tag in tags:
            name = lora_file(files, tag.name)
            if tag.strength_model != 0:
                model = model.with_patch(lora_patch(ctx, name, tag.strength_model, "unet"))
            if tag.strength_clip != 0:
                clip = clip.with_patch(lora_patch(ctx, name, tag.strength_clip, "clip"))
        return model, clip, cleaned

    @classmethod
    def fingerprint(cls, folders: Folders, **inputs: Any) -> Any:
        """The named files' identities, so a changed LoRA file is not served from the cache."""
        files = folders.model_files
        text = inputs.get("text")
        if files is None or not isinstance(text, str):
            return None
        found = []
        for tag in parse_lora_tags(text)[1]:
            try:
                found.append(file_fingerprint(folders, "loras", lora_file(files, tag.name)))
            except PromptLoraError:
                found.append(None)
        return tuple(found)


NODES = (LoomPromptLoras,)
