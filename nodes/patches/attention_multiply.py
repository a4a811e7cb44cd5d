"""UNetSelfAttentionMultiply, UNetCrossAttentionMultiply, UNetTemporalAttentionMultiply and
CLIPAttentionMultiply: scale the weights and biases of attention projections, with ComfyUI's
names, inputs and key rules (experimental knobs; all-ones settings change nothing, so the nodes
then return their input).

A weight patch: the patched module is built with the scaled weights (a new weights key, so the
unpatched model in the same workflow keeps its own). Parameters are chosen by name suffix, as
ComfyUI does on its state dict: ``{attn}.to_q/to_k/to_v/to_out.0`` (``attn1`` self-attention,
``attn2`` cross-attention) in a UNet, ``self_attn.q_proj/k_proj/v_proj/out_proj`` in CLIP text
encoders. The temporal node scales the attention outputs, ``self_temporal`` / ``cross_temporal``
for parameters inside a ``.time_stack.`` (video UNets) and the ``*_structural`` values for all
others; a UNet without temporal layers gets only the structural ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from engine.context import NodeContext
from engine.node import Node
from engine.schema import CLIP, FLOAT, MODEL, Input, NodeSchema, Output
from nodes.patches.unet_hooks import require_points

CATEGORY = "_for_testing/attention_experiments"


@dataclass(frozen=True)
class ScaleWeights:
    """A :class:`nodes.core.handles.Patch` multiplying parameters whose name ends with a suffix."""

    name: str
    rules: tuple[tuple[str, str, float], ...]  # (suffix, required substring or "", factor); first match wins
    exclude: str = ""  # parameters containing this substring skip rules whose substring is ""

    @property
    def key(self) -> str:
        return f"{self.name}:{list(self.rules)!r}"

    def factor(self, param: str) -> float | None:
        for suffix, inside, value in self.rules:
            if not param.endswith(suffix):
                continue
            if (inside and inside in param) or (not inside and not (self.exclude and self.exclude in param)):
                return value
        return None

    def apply(self, module: Any, handle: Any) -> None:
        with torch.no_grad():
            for name, param in module.named_parameters():
                value = self.factor(name)
                if value is not None and value != 1.0:
                    param.copy_((param.to(torch.float32) * value).to(param.dtype))


def _rules(
    prefix: str,
    names: tuple[str, str, str, str],
    q: float,
    k: float,
    v: float,
    out: float,
) -> tuple[tuple[str, str, float], ...]:
    return tuple(
        (f"{prefix}{n}.{kind}", "", float(f))
        for n, f in zip(names, (q, k, v, out), strict=True)
        for kind in ("weight", "bias")
    )


def _inputs(first: Input) -> tuple[Input, ...]:
    return (
        first,
        *(
            Input(
                n,
                FLOAT,
                f"Multiplier of the {n} projection's weights.",
                default=1.0,
                min=0.0,
                max=10.0,
                step=0.01,
            )
            for n in ("q", "k", "v", "out")
        ),
    )


UNET_PROJECTIONS = ("to_q", "to_k", "to_v", "to_out.0")


class UNetSelfAttentionMultiply(Node):
    SCHEMA = NodeSchema(
        node_id="UNetSelfAttentionMultiply",
        display_name="UNetSelfAttentionMultiply",
        category=CATEGORY,
        description="Scale the UNet's self-attention projections.",
        inputs=_inputs(Input("model", MODEL, "The UNet model to patch.")),
        outputs=(Output("MODEL", MODEL, "The patched model."),),
    )
    ATTN = "attn1"

    def run(self, ctx: NodeContext, *, model: Any, q: float, k: float, v: float, out: float) -> tuple[Any]:
        require_points(model, self.SCHEMA.node_id, (self.ATTN,))
        if q == k == v == out == 1.0:
            return (model,)
        rules = _rules(f"{self.ATTN}.", UNET_PROJECTIONS, q, k, v, out)
        return (model.with_patch(ScaleWeights(self.SCHEMA.node_id, rules)),)


class UNetCrossAttentionMultiply(UNetSelfAttentionMultiply):
    SCHEMA = NodeSchema(
        node_id="UNetCrossAttentionMultiply",
        display_name="UNetCrossAttentionMultiply",
        category=CATEGORY,
        description="Scale the UNet's cross-attention (text) projections.",
        inputs=_inputs(Input("model", MODEL, "The UNet model to patch.")),
        outputs=(Output("MODEL", MODEL, "The patched model."),),
    )
    ATTN = "attn2"


class CLIPAttentionMultiply(Node):
    SCHEMA = NodeSchema(
        node_id="CLIPAttentionMultiply",
        display_name="CLIPAttentionMultiply",
        category=CATEGORY,
        description="Scale the self-attention projections of the CLIP text encoders.",
        inputs=_inputs(Input("clip", CLIP, "The text encoders to patch.")),
        outputs=(Output("CLIP", CLIP, "The patched text encoders."),),
    )

    def run(self, ctx: NodeContext, *, clip: Any, q: float, k: float, v: float, out: float) -> tuple[Any]:
        if q == k == v == out == 1.0:
            return (clip,)
        rules = _rules("self_attn.", ("q_proj", "k_proj", "v_proj", "out_proj"), q, k, v, out)
        return (clip.with_patch(ScaleWeights("CLIPAttentionMultiply", rules)),)


class UNetTemporalAttentionMultiply(Node):
    SCHEMA = NodeSchema(
        node_id="UNetTemporalAttentionMultiply",
        display_name="UNetTemporalAttentionMultiply",
        category=CATEGORY,
        description="Scale the attention outputs of a UNet, spatial (structural) and temporal layers apart.",
        inputs=(
            Input("model", MODEL, "The UNet model to patch."),
            *(
                Input(
                    n,
                    FLOAT,
                    f"Multiplier of the {n.replace('_', ' ')} attention output.",
                    default=1.0,
                    min=0.0,
                    max=10.0,
                    step=0.01,
                )
                for n in ("self_structural", "self_temporal", "cross_structural", "cross_temporal")
            ),
        ),
        outputs=(Output("MODEL", MODEL, "The patched model."),),
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        model: Any,
        self_structural: float,
        self_temporal: float,
        cross_structural: float,
        cross_temporal: float,
    ) -> tuple[Any]:
        require_points(model, "UNetTemporalAttentionMultiply", ("attn1", "attn2"))
        if self_structural == self_temporal == cross_structural == cross_temporal == 1.0:
            return (model,)
        rules = tuple(
            (f"{attn}.to_out.0.{kind}", inside, float(value))
            for attn, temporal, structural in (
                ("attn1", self_temporal, self_structural),
                ("attn2", cross_temporal, cross_structural),
            )
            for kind in ("weight", "bias")
            for inside, value in ((".time_stack.", temporal), ("", structural))
        )
        return (
            model.with_patch(ScaleWeights("UNetTemporalAttentionMultiply", rules, exclude=".time_stack.")),
        )


NODES: list[type[Node]] = [
    UNetSelfAttentionMultiply,
    UNetCrossAttentionMultiply,
    UNetTemporalAttentionMultiply,
    CLIPAttentionMultiply,
]
