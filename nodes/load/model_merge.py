"""ComfyUI's model and text-encoder merging nodes, as lazy patches on handles.

A merge returns ``model1.with_patch(MergePatch(...))``: nothing is computed until the model is
made resident. Then, part by part, the other model's tensors are read from its file (through the
family's key table, into the module's names; one tensor at a time where the table only renames,
so two full models are never in memory together) and every weight becomes
``w1 * a + w2 * b`` (ComfyUI's ``add_patches(patch, strength_patch=b, strength_model=a)``):

- Simple / Blocks and the family-specific block merges (``nodes.family_nodes``): ``a = ratio``, ``b = 1 - ratio`` (ratio 1 keeps model1);
- Add: ``a = b = 1``; Subtract: ``a = multiplier``, ``b = -multiplier``.

Block-wise ratios name ComfyUI's (LDM) keys: ``input_blocks.4.``, ``middle_block``, ``out``; each
weight's LDM name comes from the denoiser kind's key table (``to_original``) and takes the ratio of
the longest matching name (the first ratio where none matches). The other model's own patches
(a LoRA on model2) are honoured by building it instead of reading its file. The patch key holds
the other handle's key and the strengths, so a merged handle caches apart from both inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from safetensors import safe_open

from engine.context import NodeContext
from engine.node import Node
from engine.schema import CLIP, FLOAT, MODEL, Input, NodeSchema, Output
from nodes.core.tensors import ModelLoadError
from nodes.core.weights import read_index
from nodes.quant.files import read_packed
from nodes.quant.gguf import is_gguf
from nodes.quant.layers import store_weight

CLIP_SKIP = (".position_ids", ".logit_scale")  # ComfyUI's CLIP merges leave these alone

Strengths = tuple[float, float]  # (a: model1's weight, b: model2's weight)


def part_module(module: Any, handle: Any, name: str) -> Any:
    """The module of part ``name`` inside a handle's built module (text encoders hold several)."""
    return module[name] if len(handle.parts) > 1 or hasattr(module, "tokenizers") else module


def part_state(handle: Any, name: str) -> dict[str, torch.Tensor]:
    """Part ``name`` of ``handle`` in its module's key names: read from the single file (tensors
    of that part only), or built when the handle has patches or is a diffusers folder."""
    part = handle.part(name)
    if handle.patches or handle.source.format != "single_file":
        return dict(part_module(handle.load(), handle, name).state_dict())
    index = read_index(handle.source.path, allow_pickle=handle.source.allow_pickle)
    tensors = read_packed(index, part.prefix)  # scaled fp8: scales applied
    return dict(part.kind.module_keys(part.kind.to_diffusers(tensors, part.config)))


def file_names(handle: Any, name: str) -> dict[str, str] | None:
    """Module key -> file key of part ``name`` when the kind's key table only renames (UNet, CLIP
    in transformers' layout) and the handle is a plain safetensors file; None otherwise (a table
    that splits or reshapes tensors, a patched handle, a diffusers folder, a pickle)."""
    if handle.patches or handle.source.format != "single_file":
        return None
    index = read_index(handle.source.path, allow_pickle=handle.source.allow_pickle)
    if index.pickled or is_gguf(index.path) or any(t.dtype.startswith("F8_") for t in index.tensors.values()):
        return None  # stored precision (GGUF, fp8 with scales): read through the dequantising path
    part = handle.part(name)
    inner = [k[len(part.prefix) :] for k in index.tensors if k.startswith(part.prefix)]
    try:  # strings for tensors: a table that only renames keeps them; one that splits them fails
        mapped = part.kind.module_keys(
            part.kind.to_diffusers(dict(zip(inner, inner, strict=True)), part.config)
        )
    except (AttributeError, TypeError, ValueError, KeyError, IndexError, RuntimeError):
        return None
    values = list(mapped.values())
    if not all(isinstance(v, str) for v in values) or len(set(values)) != len(values):
        return None
    return {k: part.prefix + v for k, v in mapped.items()}


@contextmanager
def other_weights(handle: Any, name: str) -> Iterator[Callable[[str], torch.Tensor | None]]:
    """A reader of part ``name``'s tensors by module key: one tensor at a time from the file when
    the key table allows (see :func:`file_names`), else from the whole part read or built once."""
    names = file_names(handle, name)
    if names is None:
        theirs = part_state(handle, name)
        yield lambda key: theirs.pop(key, None)
        return

    with safe_open(str(handle.source.path), framework="pt", device="cpu") as f:
        yield lambda key: f.get_tensor(names[key]) if key in names else None


def ldm_names(part: Any, names: list[str]) -> dict[str, str]:
    """Module key -> original (LDM) key through the kind's key table (or the kind's own
    ``original_names`` where its table fuses tensors, e.g. SD3's q/k/v)."""
    if hasattr(part.kind, "original_names"):
        return dict(part.kind.original_names(names, part.config))
    original = list(part.kind.to_original(dict.fromkeys(names), part.config))
    if len(original) != len(names):
        raise ModelLoadError(
            f"the {part.name} key table does not map its weights one to one; "
            "block-wise merging needs the LDM names"
        )
    return dict(zip(names, original, strict=True))


@dataclass(frozen=True)
class MergePatch:
    """``w = w1 * a + w2 * b`` per weight; ``blocks``: (LDM name prefix, a, b), longest prefix
    wins, ``default`` elsewhere; ``skip``: key suffixes left as model1's."""

    other: Any  # the handle whose weights are merged in
    default: Strengths
    blocks: tuple[tuple[str, float, float], ...] = ()
    skip: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return f"merge:{self.other.key}:{self.default}:{self.blocks}:{self.skip}"

    def strengths(self, ldm_name: str) -> Strengths:
        best, found = -1, self.default
        for prefix, a, b in self.blocks:
            if ldm_name.startswith(prefix) and len(prefix) > best:
                best, found = len(prefix), (a, b)
        return found

    @torch.no_grad()
    def apply(self, module: Any, handle: Any) -> None:
        merged = 0
        theirs_names = {p.name for p in self.other.parts}
        for part in handle.parts:
            if part.name not in theirs_names:
                continue
            target = part_module(module, handle, part.name)
            mine = target.state_dict()
            names = ldm_names(part, list(mine)) if self.blocks else {}
            with other_weights(self.other, part.name) as read:
                for k, w in mine.items():
                    if not w.is_floating_point() or k.endswith(self.skip):
                        continue
                    a, b = self.strengths(names.get(k, k))
                    o = read(k)
                    if o is None or o.shape != w.shape:
                        continue
                    merged += 1
                    if (a, b) != (1.0, 0.0):
                        value = w.float() * a + o.to(w.device).float() * b
                        if not store_weight(target, k, value):  # a stored-precision layer re-stores it
                            w.copy_(value.to(w.dtype))
        if merged == 0:
            raise ModelLoadError(
                f"nothing to merge: {self.other.source.name} has no weight of the same name and "
                f"shape as {handle.source.name}; merge models of the same family"
            )


def ratio_input(name: str, what: str) -> Input:
    return Input(name, FLOAT, what, default=1.0, min=0.0, max=1.0, step=0.01)


_MULT = Input("multiplier", FLOAT, "Scale of the difference.", default=1.0, min=-10.0, max=10.0, step=0.01)
_M1, _M2 = (
    Input("model1", MODEL, "The base model (ratio 1 keeps it)."),
    Input("model2", MODEL, "The other model."),
)
MODEL_MERGE_PAIR = (_M1, _M2)  # the first two inputs of every block-wise merge (family merges reuse them)
_C1, _C2 = (
    Input("clip1", CLIP, "The base text encoder(s)."),
    Input("clip2", CLIP, "The other text encoder(s)."),
)
MERGED_MODEL_OUT = (Output("MODEL", MODEL, "The merged model (computed when it is loaded)."),)
_CLIP_OUT = (Output("CLIP", CLIP, "The merged text encoder(s) (computed when loaded)."),)


def merge_schema(
    node_id: str,
    description: str,
    inputs: tuple[Input, ...],
    outputs: tuple[Output, ...],
    category: str = "advanced/model_merging",
) -> NodeSchema:
    return NodeSchema(
        node_id=node_id,
        display_name=node_id,
        category=category,
        description=description,
        inputs=inputs,
        outputs=outputs,
    )


class ModelMergeSimple(Node):
    SCHEMA = merge_schema(
        "ModelMergeSimple",
        "model1 * ratio + model2 * (1 - ratio), weight by weight.",
        (_M1, _M2, ratio_input("ratio", "Share of model1.")),
        MERGED_MODEL_OUT,
    )

    def run(self, ctx: NodeContext, *, model1: Any, model2: Any, ratio: float) -> tuple[Any]:
        return (model1.with_patch(MergePatch(model2, (ratio, 1.0 - ratio))),)


class ModelMergeAdd(Node):
    SCHEMA = merge_schema("ModelMergeAdd", "model1 + model2, weight by weight.", (_M1, _M2), MERGED_MODEL_OUT)

    def run(self, ctx: NodeContext, *, model1: Any, model2: Any) -> tuple[Any]:
        return (model1.with_patch(MergePatch(model2, (1.0, 1.0))),)


class ModelMergeSubtract(Node):
    SCHEMA = merge_schema(
        "ModelMergeSubtract",
        "(model1 - model2) * multiplier, weight by weight.",
        (_M1, _M2, _MULT),
        MERGED_MODEL_OUT,
    )

    def run(self, ctx: NodeContext, *, model1: Any, model2: Any, multiplier: float) -> tuple[Any]:
        return (model1.with_patch(MergePatch(model2, (multiplier, -multiplier))),)


class CLIPMergeSimple(Node):
    SCHEMA = merge_schema(
        "CLIPMergeSimple",
        "clip1 * ratio + clip2 * (1 - ratio), weight by weight.",
        (_C1, _C2, ratio_input("ratio", "Share of clip1.")),
        _CLIP_OUT,
    )

    def run(self, ctx: NodeContext, *, clip1: Any, clip2: Any, ratio: float) -> tuple[Any]:
        return (clip1.with_patch(MergePatch(clip2, (ratio, 1.0 - ratio), skip=CLIP_SKIP)),)


class CLIPMergeAdd(Node):
    SCHEMA = merge_schema("CLIPMergeAdd", "clip1 + clip2, weight by weight.", (_C1, _C2), _CLIP_OUT)

    def run(self, ctx: NodeContext, *, clip1: Any, clip2: Any) -> tuple[Any]:
        return (clip1.with_patch(MergePatch(clip2, (1.0, 1.0), skip=CLIP_SKIP)),)


class CLIPMergeSubtract(Node):
    SCHEMA = merge_schema(
        "CLIPMergeSubtract", "(clip1 - clip2) * multiplier, weight by weight.", (_C1, _C2, _MULT), _CLIP_OUT
    )

    def run(self, ctx: NodeContext, *, clip1: Any, clip2: Any, multiplier: float) -> tuple[Any]:
        return (clip1.with_patch(MergePatch(clip2, (multiplier, -multiplier), skip=CLIP_SKIP)),)


class BlockMerge(Node):
    """Block-wise ratios: every input after model1/model2 is an LDM key prefix; the first one is
    also the ratio of weights no prefix names (ComfyUI's ModelMergeBlocks rule)."""

    def run(self, ctx: NodeContext, **inputs: Any) -> tuple[Any]:
        model1, model2 = inputs.pop("model1"), inputs.pop("model2")
        names = [i.name for i in self.SCHEMA.inputs[2:]]
        ratios = [float(inputs[n]) for n in names]
        blocks = tuple((n, r, 1.0 - r) for n, r in zip(names, ratios, strict=True))
        return (model1.with_patch(MergePatch(model2, (ratios[0], 1.0 - ratios[0]), blocks)),)


class ModelMergeBlocks(BlockMerge):
    SCHEMA = merge_schema(
        "ModelMergeBlocks",
        "Merge with one ratio per UNet part (input, middle and output blocks).",
        (
            _M1,
            _M2,
            ratio_input("input", "Share of model1 in the input blocks (and unnamed weights)."),
            ratio_input("middle", "Share of model1 in the middle block."),
            ratio_input("out", "Share of model1 in the output blocks and the final layers."),
        ),
        MERGED_MODEL_OUT,
    )


MODEL_SPECIFIC = "advanced/model_merging/model_specific"  # the family-specific merges' category


def block_ratio_inputs(names: list[str] | tuple[str, ...]) -> tuple[Input, ...]:
    """model1, model2 and one ratio per weight-name prefix (the family-specific merges' inputs)."""
    return (
        *MODEL_MERGE_PAIR,
        *(ratio_input(n, f"Share of model1 in the weights named {n}*.") for n in names),
    )


NODES: list[type[Node]] = [
    ModelMergeSimple,
    ModelMergeBlocks,
    ModelMergeAdd,
    ModelMergeSubtract,
    CLIPMergeSimple,
    CLIPMergeAdd,
    CLIPMergeSubtract,
]
