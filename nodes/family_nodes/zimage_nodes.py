"""ComfyUI's node for the flow families sampled with AuraFlow-style shifted schedules
(``comfy_extras/nodes_model_advanced.py``; same name, input and semantics): ``ModelSamplingAuraFlow``
sets discrete flow matching with ``shift`` and multiplier 1 (the model's timestep is sigma). ComfyUI's
Z-Image Turbo and Qwen-Image templates use it (Z-Image with shift 3)."""

from __future__ import annotations

from typing import Any

from engine.context import NodeContext
from engine.node import Node
from engine.schema import FLOAT, MODEL, Input, NodeSchema, Output
from nodes.diffusion.model_sampling import flow


class ModelSamplingAuraFlow(Node):
    SCHEMA = NodeSchema(
        node_id="ModelSamplingAuraFlow",
        display_name="ModelSamplingAuraFlow",
        category="advanced/model",
        description="Sample a flow model with discrete flow matching shifted by shift (timestep = sigma, "
        "multiplier 1): AuraFlow 1.73, Z-Image 3.",
        inputs=(
            Input("model", MODEL, "The model."),
            Input(
                "shift",
                FLOAT,
                "The schedule shift: larger spends more steps at high noise.",
                default=1.73,
                min=0.0,
                max=100.0,
                step=0.01,
            ),
        ),
        outputs=(Output("MODEL", MODEL, "The model with the new sampling."),),
    )

    def run(self, ctx: NodeContext, *, model: Any, shift: float) -> tuple[Any]:
        return (model.with_model_sampling(flow(shift=shift, multiplier=1.0)),)


NODES: list[type[Node]] = [ModelSamplingAuraFlow]
