"""``KSamplerBatched`` / ``KSamplerAdvancedBatched``: KSampler (Advanced) over lists of seeds and
prompts, stacked into one sampling batch.

The ``batching.variant`` of KSampler and KSamplerAdvanced. Request coalescing
(``engine/jobs/coalesce.py``) runs queued jobs that differ only in seeds and prompt text as one merged
workflow in which this node receives one seed and one prompt pair per job. The calls go to the
same ``nodes.sample.ksampler.run_calls`` as the single nodes: jobs that agree on everything but seed and
prompts become one stacked batch (rows ``[j*B, (j+1)*B)`` are job ``j``, each with its own
conditioning, initial noise and per-step noise (``nodes.diffusion.noise.SeedGroups``: each job's
slice is drawn as its single run draws it); one model call per step for all jobs' branches), else
each call runs alone. Every job's result equals its single run up to float noise.
"""

from __future__ import annotations

from typing import Any

from engine.context import NodeContext
from engine.node import Node
from engine.schema import LATENT, NodeSchema, Output
from nodes.sample.ksampler import KSampler, KSamplerAdvanced, KSamplerCall, run_calls


def _broadcast(inputs: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """ComfyUI's list mapping: one call per index, shorter lists repeating their last item."""
    k = max((len(v) for v in inputs.values()), default=1)
    return [{name: v[min(i, len(v) - 1)] for name, v in inputs.items() if v} for i in range(k)]


class KSamplerBatched(Node):
    SCHEMA = NodeSchema(
        node_id="KSamplerBatched",
        display_name="KSampler (batched lists)",
        category="sampling",
        description="KSampler over lists of seeds/prompts: one batched model call per step, one latent per item.",
        inputs=KSampler.SCHEMA.inputs,
        outputs=(Output("LATENT", LATENT, "One denoised latent per list item.", is_list=True),),
        input_is_list=True,
    )

    def run(self, ctx: NodeContext, **inputs: Any) -> tuple[list[dict]]:
        calls = [
            KSamplerCall(
                c["model"],
                c["seed"],
                c["steps"],
                c["cfg"],
                c["sampler_name"],
                c["scheduler"],
                c["positive"],
                c["negative"],
                c["latent_image"],
                c["denoise"],
            )
            for c in _broadcast(inputs)
        ]
        return (run_calls(ctx, calls),)


class KSamplerAdvancedBatched(Node):
    SCHEMA = NodeSchema(
        node_id="KSamplerAdvancedBatched",
        display_name="KSampler (Advanced, batched lists)",
        category="sampling",
        description="KSampler (Advanced) over lists of noise seeds/prompts: one batched model call per step, "
        "one latent per item.",
        inputs=KSamplerAdvanced.SCHEMA.inputs,
        outputs=(Output("LATENT", LATENT, "One (partly) denoised latent per list item.", is_list=True),),
        input_is_list=True,
    )

    def run(self, ctx: NodeContext, **inputs: Any) -> tuple[list[dict]]:
        calls = [KSamplerAdvanced.call(**c) for c in _broadcast(inputs)]
        return (run_calls(ctx, calls),)


NODES: list[type[Node]] = [
    KSamplerBatched,
    KSamplerAdvancedBatched,
]  # the samplers' batching variants (coalesced jobs)
