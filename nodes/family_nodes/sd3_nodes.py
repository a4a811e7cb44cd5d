"""ComfyUI's SD3 nodes (``comfy_extras/nodes_sd3.py``, ``nodes_slg.py``, ``nodes_model_advanced.py``,
``nodes_model_merging_model_specific.py``; same names, inputs and semantics): ``TripleCLIPLoader``
(CLIP-L, CLIP-G and T5-XXL files, recognised by their tensors), ``CLIPTextEncodeSD3`` (a prompt per
encoder; empty prompts left out with empty_padding "none"), ``ModelSamplingSD3`` (the flow shift),
the skip-layer guidance nodes and the SD3 block-wise merges. ``EmptySD3LatentImage`` lives with the
Flux nodes (both families use it)."""

from __future__ import annotations

import logging
import re
from typing import Any

import torch

from engine.context import Folders, NodeContext
from engine.node import Node
from engine.schema import (
    CLIP,
    COMBO,
    CONDITIONING,
    FLOAT,
    MODEL,
    STRING,
    DynamicOptions,
    Input,
    NodeSchema,
    Output,
)
from nodes.core.cond import CondEntry, Conditioning
from nodes.core.model_files import file_fingerprint, pickle_allowed, require_model_files
from nodes.core.sampling_hooks import BlockSkip, SamplingHooks, declared_skip_lists
from nodes.diffusion.model_sampling import flow
from nodes.encode.conditioning import text_encoders
from nodes.load.handles import open_text_encoders
from nodes.load.model_merge import MODEL_SPECIFIC, BlockMerge, block_ratio_inputs, merge_schema
from nodes.patches.guidance import GuidancePatch

_MODEL_IN = Input("model", MODEL, "The model.")
_MODEL_OUT = (Output("MODEL", MODEL, "The model with the change (weights untouched)."),)
log = logging.getLogger("loom.slg")
_LAYERS_HELP = "Indices of the {} blocks to skip, comma separated (any non-digits separate)."


class SD3EncodeError(ValueError):
    """A CLIP that cannot encode SD3 prompts; the message says which loader to use."""


class TripleCLIPLoader(Node):
    SCHEMA = NodeSchema(
        node_id="TripleCLIPLoader",
        display_name="TripleCLIPLoader",
        category="advanced/loaders",
        description="[Recipes]\n\nsd3: clip-l, clip-g, t5. Loads three text-encoder files as the SD3 CLIP; each "
        "file's encoder is recognised from its tensors, so the order does not matter.",
        inputs=tuple(
            Input(
                f"clip_name{i}",
                COMBO,
                f"Text encoder {i} in models/text_encoders (or models/clip).",
                options=DynamicOptions("text_encoders"),
            )
            for i in (1, 2, 3)
        ),
        outputs=(Output("CLIP", CLIP, "The text encoders that turn prompts into conditioning."),),
    )

    def run(self, ctx: NodeContext, *, clip_name1: str, clip_name2: str, clip_name3: str) -> tuple[Any]:
        files = require_model_files(ctx)
        paths = [files.resolve("text_encoders", n) for n in (clip_name1, clip_name2, clip_name3)]
        return (open_text_encoders(paths, "sd3", allow_pickle=pickle_allowed(ctx)),)

    @classmethod
    def fingerprint(cls, folders: Folders, **inputs: Any) -> Any:
        return [file_fingerprint(folders, "text_encoders", inputs.get(f"clip_name{i}")) for i in (1, 2, 3)]


class CLIPTextEncodeSD3(Node):
    SCHEMA = NodeSchema(
        node_id="CLIPTextEncodeSD3",
        display_name="CLIPTextEncodeSD3",
        category="advanced/conditioning",
        description="Encode an SD3 prompt with a text per encoder (CLIP-L, CLIP-G, T5-XXL).",
        inputs=(
            Input("clip", CLIP, "The SD3 text encoders (TripleCLIPLoader or an SD3 checkpoint)."),
            Input("clip_l", STRING, "The prompt for CLIP-L.", multiline=True),
            Input("clip_g", STRING, "The prompt for CLIP-G.", multiline=True),
            Input("t5xxl", STRING, "The prompt for T5-XXL.", multiline=True),
            Input(
                "empty_padding",
                COMBO,
                "none: an empty prompt is left out (its encoder adds nothing); "
                "empty_prompt: an empty prompt is encoded like any other.",
                options=("none", "empty_prompt"),
            ),
        ),
        outputs=(Output("CONDITIONING", CONDITIONING, "The conditioning, for a sampler or guider."),),
    )

    def run(
        self, ctx: NodeContext, *, clip: Any, clip_l: str, clip_g: str, t5xxl: str, empty_padding: str
    ) -> tuple[Conditioning]:
        encode_triple = getattr(clip.family.prompt, "encode_triple", None)
        if encode_triple is None:
            raise SD3EncodeError(
                f"CLIPTextEncodeSD3 needs SD3 text encoders, got the {clip.family.title} CLIP; "
                "load clip_l, clip_g and t5xxl with TripleCLIPLoader or use CLIPTextEncode"
            )
        with text_encoders(ctx, clip) as encoders:
            embeds, pooled = encode_triple(
                clip_l, clip_g, t5xxl, encoders, drop_empty=empty_padding == "none"
            )
        return (
            [CondEntry(embeds=embeds.float().cpu(), pooled=None if pooled is None else pooled.float().cpu())],
        )


class ModelSamplingSD3(Node):
    SCHEMA = NodeSchema(
        node_id="ModelSamplingSD3",
        display_name="ModelSamplingSD3",
        category="advanced/model",
        description="Sample with rectified flow (SD3) and the given time shift; the model is called at 1000·sigma.",
        inputs=(
            _MODEL_IN,
            Input(
                "shift",
                FLOAT,
                "The time shift (higher spends more steps at high noise).",
                default=3.0,
                min=0.0,
                max=100.0,
                step=0.01,
            ),
        ),
        outputs=(Output("MODEL", MODEL, "The model with the new sampling."),),
    )

    def run(self, ctx: NodeContext, *, model: Any, shift: float) -> tuple[Any]:
        return (model.with_model_sampling(flow(shift=shift, multiplier=1000.0)),)


def parse_layers(text: str) -> tuple[int, ...]:
    """ComfyUI's reading of a layer list: every run of digits is an index."""
    return tuple(int(n) for n in re.findall(r"\d+", text))


def slg_hooks(
    skip: BlockSkip, scale: float, sigma_start: float, sigma_end: float, rescaling_scale: float
) -> SamplingHooks:
    """SkipLayerGuidanceDiT: after CFG, add ``scale·(cond − cond with the blocks skipped)`` while
    sigma is within [sigma_end, sigma_start]; optionally rescale towards the cond's spread."""

    def post(args: dict[str, Any]) -> torch.Tensor:
        result, cond_pred, sigma = args["denoised"], args["cond_denoised"], args["sigma"]
        cond_name = args["branches"][0]
        s = float(sigma.reshape(-1)[0])
        if scale > 0 and sigma_end <= s <= sigma_start and cond_name is not None:
            (slg,) = args["model"].calc_batch([cond_name], args["input"], sigma, block_skip=skip)
            result = result + (cond_pred - slg) * scale
            if rescaling_scale != 0:
                factor = cond_pred.std() / result.std()
                result = result * (rescaling_scale * factor + (1 - rescaling_scale))
        return result

    return SamplingHooks(post_cfg=(post,))


def slg_simple_hooks(skip: BlockSkip, sigma_start: float, sigma_end: float) -> SamplingHooks:
    """SkipLayerGuidanceDiTSimple: within [sigma_end, sigma_start] the negative branch is computed
    with the blocks skipped (the positive as usual)."""

    def calc(args: dict[str, Any]) -> list[torch.Tensor]:
        run, names, x, sigma = args["model"], args["conds"], args["input"], args["sigma"]
        s = float(sigma.reshape(-1)[0])
        if len(names) == 2 and names[1] is not None and sigma_end <= s <= sigma_start:
            cond = run.calc_batch([names[0], None], x, sigma)[0]
            uncond = run.calc_batch([None, names[1]], x, sigma, block_skip=skip)[1]
            return [cond, uncond]
        return list(run.calc_batch(names, x, sigma))

    return SamplingHooks(calc_cond_batch=calc)


def _layers_input(name: str, what: str) -> Input:
    return Input(name, STRING, _LAYERS_HELP.format(what), default="7, 8, 9")


def _percent(name: str, default: float, what: str) -> Input:
    return Input(name, FLOAT, what, default=default, min=0.0, max=1.0, step=0.001)


_SCALE = Input(
    "scale", FLOAT, "Strength of the skip-layer guidance.", default=3.0, min=0.0, max=10.0, step=0.1
)
_START = _percent("start_percent", 0.01, "Where in the sampling (0 = start) the guidance begins.")
_END = _percent("end_percent", 0.15, "Where in the sampling it ends.")


def _block_skip(node: str, model: Any, double: str, single: str, inputs: tuple[str, str]) -> BlockSkip:
    """The blocks to skip; a list the model's transformer has no blocks for is logged as ignored
    (ComfyUI's model ignores it too: SD3 and Qwen-Image have no single-stream list, Z-Image none)."""
    skip = BlockSkip(parse_layers(double), parse_layers(single))
    lists = declared_skip_lists(model.denoiser)
    usable = [i for n, i in zip(("double", "single"), inputs, strict=True) if n in lists]
    for name, indices, what in zip(("double", "single"), (skip.double, skip.single), inputs, strict=True):
        if indices and name not in lists:
            log.warning(
                "%s: the %s transformer has no %s-stream block list to skip, so %s changes nothing "
                "(ComfyUI ignores it too); %s",
                node,
                model.family.title,
                name,
                what,
                f"use {' or '.join(usable)}" if usable else "no block of this model can be skipped",
            )
    return skip


_DIT_INPUTS = ("double_layers", "single_layers")


def _skip_guidance(
    node: tuple[str, tuple[str, str]],
    model: Any,
    double: str,
    single: str,
    scale: float,
    start: float,
    end: float,
    rescaling: float,
) -> Any:
    """``node``: the node's name and its two layer inputs' names, for the log."""
    skip = _block_skip(node[0], model, double, single, node[1])
    if not skip.double and not skip.single:
        return model
    ms = model.model_sampling
    params = (
        skip.double,
        skip.single,
        scale,
        ms.percent_to_sigma(start),
        ms.percent_to_sigma(end),
        rescaling,
    )
    return model.with_patch(GuidancePatch("SkipLayerGuidanceDiT", params, _make_slg))


def _make_slg(
    double: tuple[int, ...],
    single: tuple[int, ...],
    scale: float,
    sigma_start: float,
    sigma_end: float,
    rescaling: float,
) -> SamplingHooks:
    return slg_hooks(BlockSkip(double, single), scale, sigma_start, sigma_end, rescaling)


def _make_slg_simple(
    double: tuple[int, ...], single: tuple[int, ...], sigma_start: float, sigma_end: float
) -> SamplingHooks:
    return slg_simple_hooks(BlockSkip(double, single), sigma_start, sigma_end)


class SkipLayerGuidanceDiT(Node):
    SCHEMA = NodeSchema(
        node_id="SkipLayerGuidanceDiT",
        display_name="SkipLayerGuidanceDiT",
        category="advanced/guidance",
        description="Generic version of SkipLayerGuidance node that can be used on every DiT model.",
        inputs=(
            _MODEL_IN,
            _layers_input("double_layers", "double-stream (joint)"),
            _layers_input("single_layers", "single-stream"),
            _SCALE,
            _START,
            _END,
            Input(
                "rescaling_scale",
                FLOAT,
                "Pull the result's spread towards the positive prediction's.",
                default=0.0,
                min=0.0,
                max=10.0,
                step=0.01,
            ),
        ),
        outputs=_MODEL_OUT,
        experimental=True,
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        model: Any,
        double_layers: str,
        single_layers: str,
        scale: float,
        start_percent: float,
        end_percent: float,
        rescaling_scale: float,
    ) -> tuple[Any]:
        return (
            _skip_guidance(
                ("SkipLayerGuidanceDiT", _DIT_INPUTS),
                model,
                double_layers,
                single_layers,
                scale,
                start_percent,
                end_percent,
                rescaling_scale,
            ),
        )


class SkipLayerGuidanceDiTSimple(Node):
    SCHEMA = NodeSchema(
        node_id="SkipLayerGuidanceDiTSimple",
        display_name="SkipLayerGuidanceDiTSimple",
        category="advanced/guidance",
        description="Simple version of the SkipLayerGuidanceDiT node that only modifies the uncond pass.",
        inputs=(
            _MODEL_IN,
            _layers_input("double_layers", "double-stream (joint)"),
            _layers_input("single_layers", "single-stream"),
            _percent("start_percent", 0.0, "Where in the sampling (0 = start) the skipping begins."),
            _percent("end_percent", 1.0, "Where in the sampling it ends."),
        ),
        outputs=_MODEL_OUT,
        experimental=True,
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        model: Any,
        double_layers: str,
        single_layers: str,
        start_percent: float,
        end_percent: float,
    ) -> tuple[Any]:
        skip = _block_skip("SkipLayerGuidanceDiTSimple", model, double_layers, single_layers, _DIT_INPUTS)
        if not skip.double and not skip.single:
            return (model,)
        ms = model.model_sampling
        params = (
            skip.double,
            skip.single,
            ms.percent_to_sigma(start_percent),
            ms.percent_to_sigma(end_percent),
        )
        return (model.with_patch(GuidancePatch("SkipLayerGuidanceDiTSimple", params, _make_slg_simple)),)


class SkipLayerGuidanceSD3(Node):
    SCHEMA = NodeSchema(
        node_id="SkipLayerGuidanceSD3",
        display_name="SkipLayerGuidanceSD3",
        category="advanced/guidance",
        description="Generic version of SkipLayerGuidance node that can be used on every DiT model.",
        inputs=(
            _MODEL_IN,
            Input("layers", STRING, _LAYERS_HELP.format("joint"), default="7, 8, 9"),
            _SCALE,
            _START,
            _END,
        ),
        outputs=_MODEL_OUT,
        experimental=True,
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        model: Any,
        layers: str,
        scale: float,
        start_percent: float,
        end_percent: float,
    ) -> tuple[Any]:
        node = ("SkipLayerGuidanceSD3", ("layers", "single_layers"))
        return (_skip_guidance(node, model, layers, "", scale, start_percent, end_percent, 0.0),)


def sd3_merge_inputs(blocks: int) -> tuple[Input, ...]:
    names = ["pos_embed.", "x_embedder.", "context_embedder.", "y_embedder.", "t_embedder."]
    names += [f"joint_blocks.{i}." for i in range(blocks)] + ["final_layer."]
    return block_ratio_inputs(names)


class ModelMergeSD3_2B(BlockMerge):  # noqa: N801 (ComfyUI's name)
    SCHEMA = merge_schema(
        "ModelMergeSD3_2B",
        "Merge two SD3 medium (2B) transformers, one ratio per joint block.",
        sd3_merge_inputs(24),
        (Output("MODEL", MODEL, "The merged model (computed when loaded)."),),
        MODEL_SPECIFIC,
    )


class ModelMergeSD35_Large(BlockMerge):  # noqa: N801 (ComfyUI's name)
    SCHEMA = merge_schema(
        "ModelMergeSD35_Large",
        "Merge two SD3.5 large transformers, one ratio per joint block.",
        sd3_merge_inputs(38),
        (Output("MODEL", MODEL, "The merged model (computed when loaded)."),),
        MODEL_SPECIFIC,
    )


NODES: list[type[Node]] = [
    TripleCLIPLoader,
    CLIPTextEncodeSD3,
    ModelSamplingSD3,
    SkipLayerGuidanceDiT,
    SkipLayerGuidanceDiTSimple,
    SkipLayerGuidanceSD3,
    ModelMergeSD3_2B,
    ModelMergeSD35_Large,
]
