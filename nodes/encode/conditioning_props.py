"""ComfyUI's conditioning property nodes (``comfy_extras/nodes_hooks``, ``nodes_cond``): mask, hooks
and timestep range set on a conditioning (or a positive/negative pair), combined, or set as the
default that fills what the other entries leave; ConditioningTimestepsRange and ConditioningMultiply.

What each extra means at sampling time is in :mod:`nodes.sample.cond_batch`; hooks are
:class:`nodes.load.lora_hooks.HookGroup` values, applied only while their entries run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch

from engine.context import NodeContext
from engine.node import Node
from engine.schema import COMBO, CONDITIONING, FLOAT, MASK, Input, NodeSchema, Output
from nodes.core.cond import Conditioning
from nodes.load.hook_nodes import HOOKS
from nodes.load.lora_hooks import HookGroup

TIMESTEPS_RANGE = "TIMESTEPS_RANGE"

_PROPS = (
    Input("strength", FLOAT, "The mask's strength.", default=1.0, min=0.0, max=10.0, step=0.01),
    Input(
        "set_cond_area",
        COMBO,
        "'mask bounds': run the model only on the mask's bounding box.",
        default="default",
        options=("default", "mask bounds"),
    ),
    Input("mask", MASK, "Where the new conditioning applies.", optional=True),
    Input("hooks", HOOKS, "Hooks (Create Hook LoRA) in force while it runs.", optional=True),
    Input("timesteps", TIMESTEPS_RANGE, "The part of the sampling where it applies.", optional=True),
)
_DEFAULT_HOOKS = Input("hooks", HOOKS, "Hooks in force while the default runs.", optional=True)


def _with(conditioning: Conditioning, values: dict[str, Any], hooks: HookGroup | None) -> Conditioning:
    """Each entry with ``values`` set and ``hooks`` added to its own (ComfyUI's
    ``conditioning_set_values_with_hooks``); every entry with the same earlier hooks gets one value."""
    made: dict[int, HookGroup] = {}
    out = []
    for e in conditioning:
        extras = {**e.extras, **values}
        if hooks is not None:
            before = e.extras.get("hooks")
            if before is None:
                extras["hooks"] = hooks
            else:
                extras["hooks"] = made.setdefault(id(before), before.combined(hooks))
        out.append(replace(e, extras=extras))
    return out


def _props(
    conditioning: Conditioning,
    strength: float,
    set_cond_area: str,
    mask: torch.Tensor | None,
    hooks: HookGroup | None,
    timesteps: tuple[float, float] | None,
) -> Conditioning:
    """ComfyUI's ``set_conds_props`` for one conditioning: hooks, then mask, then timestep range."""
    values: dict[str, Any] = {}
    if mask is not None:
        values.update(
            mask=mask if mask.dim() >= 3 else mask.unsqueeze(0),
            set_area_to_bounds=set_cond_area != "default",
            mask_strength=strength,
        )
    if timesteps is not None:
        values.update(start_percent=timesteps[0], end_percent=timesteps[1])
    return _with(conditioning, values, hooks)


def _defaulted(conditioning: Conditioning, hooks: HookGroup | None) -> Conditioning:
    return _with(conditioning, {"default": True}, hooks)


def _pair_outputs() -> tuple[Output, Output]:
    return (
        Output("positive", CONDITIONING, "The positive conditioning."),
        Output("negative", CONDITIONING, "The negative conditioning."),
    )


def _cond(name: str, what: str) -> Input:
    return Input(name, CONDITIONING, what)


class ConditioningSetProperties(Node):
    SCHEMA = NodeSchema(
        node_id="ConditioningSetProperties",
        display_name="Cond Set Props",
        category="advanced/hooks/cond single",
        description="Set a mask, hooks and a timestep range on a conditioning.",
        inputs=(_cond("cond_NEW", "The conditioning to set."), *_PROPS),
        outputs=(Output("CONDITIONING", CONDITIONING, "The conditioning with its properties."),),
        experimental=True,
    )

    def run(self, ctx: NodeContext, *, cond_NEW: Conditioning, strength: float, set_cond_area: str,
            mask: torch.Tensor | None = None, hooks: HookGroup | None = None,
            timesteps: tuple[float, float] | None = None) -> tuple[Conditioning]:  # fmt: skip
        return (_props(cond_NEW, strength, set_cond_area, mask, hooks, timesteps),)


class ConditioningSetPropertiesAndCombine(Node):
    SCHEMA = NodeSchema(
        node_id="ConditioningSetPropertiesAndCombine",
        display_name="Cond Set Props Combine",
        category="advanced/hooks/cond single",
        description="Set a mask, hooks and a timestep range on cond_NEW and combine it with cond.",
        inputs=(
            _cond("cond", "The conditioning kept as it is."),
            _cond("cond_NEW", "The conditioning to set."),
            *_PROPS,
        ),
        outputs=(Output("CONDITIONING", CONDITIONING, "cond's entries, then cond_NEW's."),),
        experimental=True,
    )

    def run(self, ctx: NodeContext, *, cond: Conditioning, cond_NEW: Conditioning, strength: float,
            set_cond_area: str, mask: torch.Tensor | None = None, hooks: HookGroup | None = None,
            timesteps: tuple[float, float] | None = None) -> tuple[Conditioning]:  # fmt: skip
        return (list(cond) + _props(cond_NEW, strength, set_cond_area, mask, hooks, timesteps),)


class PairConditioningSetProperties(Node):
    SCHEMA = NodeSchema(
        node_id="PairConditioningSetProperties",
        display_name="Cond Pair Set Props",
        category="advanced/hooks/cond pair",
        description="Set a mask, hooks and a timestep range on a positive/negative pair.",
        inputs=(
            _cond("positive_NEW", "The positive to set."),
            _cond("negative_NEW", "The negative to set."),
            *_PROPS,
        ),
        outputs=_pair_outputs(),
        experimental=True,
    )

    def run(self, ctx: NodeContext, *, positive_NEW: Conditioning, negative_NEW: Conditioning,
            strength: float, set_cond_area: str, mask: torch.Tensor | None = None,
            hooks: HookGroup | None = None,
            timesteps: tuple[float, float] | None = None) -> tuple[Conditioning, Conditioning]:  # fmt: skip
        return (
            _props(positive_NEW, strength, set_cond_area, mask, hooks, timesteps),
            _props(negative_NEW, strength, set_cond_area, mask, hooks, timesteps),
        )


class PairConditioningSetPropertiesAndCombine(Node):
    SCHEMA = NodeSchema(
        node_id="PairConditioningSetPropertiesAndCombine",
        display_name="Cond Pair Set Props Combine",
        category="advanced/hooks/cond pair",
        description="Set a mask, hooks and a timestep range on the _NEW pair and combine it with the pair.",
        inputs=(
            _cond("positive", "The positive kept as it is."),
            _cond("negative", "The negative kept as it is."),
            _cond("positive_NEW", "The positive to set."),
            _cond("negative_NEW", "The negative to set."),
            *_PROPS,
        ),
        outputs=_pair_outputs(),
        experimental=True,
    )

    def run(self, ctx: NodeContext, *, positive: Conditioning, negative: Conditioning,
            positive_NEW: Conditioning, negative_NEW: Conditioning, strength: float, set_cond_area: str,
            mask: torch.Tensor | None = None, hooks: HookGroup | None = None,
            timesteps: tuple[float, float] | None = None) -> tuple[Conditioning, Conditioning]:  # fmt: skip
        return (
            list(positive) + _props(positive_NEW, strength, set_cond_area, mask, hooks, timesteps),
            list(negative) + _props(negative_NEW, strength, set_cond_area, mask, hooks, timesteps),
        )


class PairConditioningCombine(Node):
    SCHEMA = NodeSchema(
        node_id="PairConditioningCombine",
        display_name="Cond Pair Combine",
        category="advanced/hooks/cond pair",
        description="Combine two positive/negative pairs: A's entries, then B's.",
        inputs=(
            _cond("positive_A", "First positive."),
            _cond("negative_A", "First negative."),
            _cond("positive_B", "Second positive."),
            _cond("negative_B", "Second negative."),
        ),
        outputs=_pair_outputs(),
        experimental=True,
    )

    def run(self, ctx: NodeContext, *, positive_A: Conditioning, negative_A: Conditioning,
            positive_B: Conditioning, negative_B: Conditioning) -> tuple[Conditioning, Conditioning]:  # fmt: skip
        return (list(positive_A) + list(positive_B), list(negative_A) + list(negative_B))


class PairConditioningSetDefaultCombine(Node):
    SCHEMA = NodeSchema(
        node_id="PairConditioningSetDefaultCombine",
        display_name="Cond Pair Set Default Combine",
        category="advanced/hooks/cond pair",
        description="Add a default pair: it applies only where the pair's other entries leave weight uncovered.",
        inputs=(
            _cond("positive", "The positive kept as it is."),
            _cond("negative", "The negative kept as it is."),
            _cond("positive_DEFAULT", "The default positive."),
            _cond("negative_DEFAULT", "The default negative."),
            _DEFAULT_HOOKS,
        ),
        outputs=_pair_outputs(),
        experimental=True,
    )

    def run(self, ctx: NodeContext, *, positive: Conditioning, negative: Conditioning,
            positive_DEFAULT: Conditioning, negative_DEFAULT: Conditioning,
            hooks: HookGroup | None = None) -> tuple[Conditioning, Conditioning]:  # fmt: skip
        return (
            list(positive) + _defaulted(positive_DEFAULT, hooks),
            list(negative) + _defaulted(negative_DEFAULT, hooks),
        )


class ConditioningSetDefaultCombine(Node):
    SCHEMA = NodeSchema(
        node_id="ConditioningSetDefaultCombine",
        display_name="Cond Set Default Combine",
        category="advanced/hooks/cond single",
        description="Add a default: it applies only where cond's entries leave weight uncovered.",
        inputs=(
            _cond("cond", "The conditioning kept as it is."),
            _cond("cond_DEFAULT", "The default."),
            _DEFAULT_HOOKS,
        ),
        outputs=(Output("CONDITIONING", CONDITIONING, "cond's entries, then the default's."),),
        experimental=True,
    )

    def run(self, ctx: NodeContext, *, cond: Conditioning, cond_DEFAULT: Conditioning,
            hooks: HookGroup | None = None) -> tuple[Conditioning]:  # fmt: skip
        return (list(cond) + _defaulted(cond_DEFAULT, hooks),)


def _percent(name: str, default: float, what: str) -> Input:
    return Input(name, FLOAT, what, default=default, min=0.0, max=1.0, step=0.001)


class ConditioningTimestepsRange(Node):
    SCHEMA = NodeSchema(
        node_id="ConditioningTimestepsRange",
        display_name="Timesteps Range",
        category="advanced/hooks",
        description="A part of the sampling (0 = start, 1 = end), and the parts before and after it.",
        inputs=(
            _percent("start_percent", 0.0, "Where the range starts."),
            _percent("end_percent", 1.0, "Where it ends."),
        ),
        outputs=(
            Output("TIMESTEPS_RANGE", TIMESTEPS_RANGE, "(start_percent, end_percent)."),
            Output("BEFORE_RANGE", TIMESTEPS_RANGE, "(0, start_percent)."),
            Output("AFTER_RANGE", TIMESTEPS_RANGE, "(end_percent, 1)."),
        ),
        experimental=True,
    )

    def run(
        self, ctx: NodeContext, *, start_percent: float, end_percent: float
    ) -> tuple[Sequence[float], ...]:
        return ((start_percent, end_percent), (0.0, start_percent), (end_percent, 1.0))


class ConditioningMultiply(Node):
    SCHEMA = NodeSchema(
        node_id="ConditioningMultiply",
        display_name="Conditioning (Multiply)",
        category="conditioning",
        description="Scale the conditioning's embeddings (and pooled output) by a factor.",
        inputs=(
            Input("conditioning", CONDITIONING, "The conditioning to scale."),
            Input("multiplier", FLOAT, "The factor.", default=1.0, min=-100.0, max=100.0, step=0.01),
        ),
        outputs=(Output("CONDITIONING", CONDITIONING, "The scaled conditioning."),),
    )

    def run(self, ctx: NodeContext, *, conditioning: Conditioning, multiplier: float) -> tuple[Conditioning]:
        return (
            [
                replace(
                    e,
                    embeds=e.embeds * multiplier,
                    pooled=None if e.pooled is None else e.pooled * multiplier,
                )
                for e in conditioning
            ],
        )


NODES: list[type[Node]] = [
    ConditioningSetProperties,
    ConditioningSetPropertiesAndCombine,
    PairConditioningSetProperties,
    PairConditioningSetPropertiesAndCombine,
    ConditioningSetDefaultCombine,
    PairConditioningSetDefaultCombine,
    PairConditioningCombine,
    ConditioningTimestepsRange,
    ConditioningMultiply,
]
