"""``ModelPatchLoader`` (ComfyUI's schema: ``name`` from ``models/model_patches`` → ``MODEL_PATCH``).

ComfyUI loads several kinds of add-on networks from that folder, recognised from their tensors:
DiffSynth's block-wise Qwen-Image ControlNets (``controlnet_blocks.0.y_rms.weight``), the USO style
projector (``feature_embedder.mid_layer_norm.bias``), alibaba-pai's Z-Image Fun ControlNets
(``control_all_x_embedder.2-1.weight``) and MultiTalk audio patches (``audio_proj.proj1.weight``).
Loom has no node that applies them yet (``QwenImageDiffsynthControlnet``, ``ZImageFunControlnet``,
``USOStyleReference``), so the loader recognises the file and says so, naming the kind, rather
than returning a patch nothing could use; a file of no known kind gets its own message.
"""

from __future__ import annotations

from typing import Any

from engine.context import Folders, NodeContext
from engine.node import Node
from engine.schema import COMBO, DynamicOptions, Input, NodeSchema, Output
from nodes.weights import ModelLoadError, read_index

MODEL_PATCH = "MODEL_PATCH"
KINDS = (
    ("controlnet_blocks.0.y_rms.weight", "a DiffSynth Qwen-Image block-wise ControlNet", "QwenImageDiffsynthControlnet"),
    ("feature_embedder.mid_layer_norm.bias", "a USO style projector", "USOStyleReference"),
    ("control_all_x_embedder.2-1.weight", "a Z-Image Fun ControlNet", "ZImageFunControlnet"),
    ("audio_proj.proj1.weight", "a MultiTalk audio patch (Wan)", "the MultiTalk nodes"),
)


def model_patch_kind(keys: Any) -> tuple[str, str] | None:
    """(what the file is, the node that would apply it) for a model patch's tensor names, or None."""
    return next(((what, node) for key, what, node in KINDS if key in keys), None)


class ModelPatchLoader(Node):
    SCHEMA = NodeSchema(
        node_id="ModelPatchLoader", display_name="ModelPatchLoader", category="advanced/loaders",
        description="Loads a model patch (block-wise ControlNets, style projectors) from models/model_patches.",
        inputs=(Input("name", COMBO, "The model patch file in models/model_patches.",
                      options=DynamicOptions("model_patches")),),
        outputs=(Output("MODEL_PATCH", MODEL_PATCH, "The model patch, for the node that applies it."),),
    )

    def run(self, ctx: NodeContext, *, name: str) -> tuple[Any]:
        from nodes.loaders import _models

        path = _models(ctx).resolve("model_patches", name)
        index = read_index(path, allow_pickle=ctx.settings.allow_pickle)
        kind = model_patch_kind(index.tensors)
        if kind is None:
            raise ModelLoadError(
                f"{path}: not a model patch Loom or ComfyUI knows (none of "
                f"{', '.join(k for k, _, _ in KINDS)} is in the file); ControlNets go in models/controlnet "
                "(ControlNetLoader), LoRAs in models/loras, style models in models/style_models")
        what, node = kind
        raise ModelLoadError(
            f"{path}: this is {what}, applied in ComfyUI by {node}, which Loom does not have yet; remove "
            "ModelPatchLoader and its apply node from the workflow (or run the workflow in ComfyUI) until it lands")

    @classmethod
    def fingerprint(cls, folders: Folders, **inputs: Any) -> Any:
        from nodes.loaders import _file_fingerprint

        return _file_fingerprint(folders, "model_patches", inputs.get("name"))


MODEL_PATCH_NODES: list[type[Node]] = [ModelPatchLoader]
