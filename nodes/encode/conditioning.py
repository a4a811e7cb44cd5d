"""Prompt encoding and the basic conditioning nodes.

``CONDITIONING`` in Loom is a ``list[CondEntry]`` (:mod:`nodes.core.cond`): each entry is one
encoded prompt, with an optional area and strength (ConditioningSetArea) and ``extras`` for what
other nodes add. A sampler averages the predictions of all entries of one side, weighted by
strength over their area, as ComfyUI does.

Encoding (``encode_prompt``) follows ComfyUI's ``CLIPTextEncode`` through the family's prompt
recipe (``family.prompt``, ``nodes.families.prompt``): each text encoder kind parses the weights,
chunks the tokens (:mod:`nodes.core.prompt_weights`), takes hidden state ``layer`` (the family
default, or CLIPSetLastLayer's choice), applies the final layer norm if the family says so and
the per-token weighting; the recipe combines the encoders' outputs.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import torch

from engine.context import NodeContext
from engine.node import Node
from engine.schema import CLIP, CONDITIONING, FLOAT, INT, STRING, Batching, Input, NodeSchema, Output
from nodes.core.cond import CondEntry, Conditioning
from nodes.core.embeddings import EmbeddingLookup
from nodes.families.prompt import ReadyEncoder


@contextmanager
def text_encoders(ctx: NodeContext, clip: Any) -> Iterator[list[ReadyEncoder]]:
    """The CLIP handle's encoders, resident for the duration of the ``with`` block."""
    files = ctx.folders.model_files
    embeddings = EmbeddingLookup(files) if files is not None else None
    with ctx.models.use(clip) as modules:
        yield [
            ReadyEncoder(
                clip.family.spec(part.name),
                part.kind,
                modules.tokenizers[part.name],
                modules[part.name],
                clip.hidden_state_index(part.name),
                clip.tokenizer_options_for(part.name),
                embeddings,
            )
            for part in clip.parts
        ]


@torch.no_grad()
def encode_prompt(text: str, clip: Any, encoders: Sequence[ReadyEncoder]) -> CondEntry:
    """Encode ``text`` through the family's prompt recipe into one :class:`CondEntry`."""
    embeds, pooled = clip.family.prompt.encode(text, encoders)
    hooks = getattr(clip, "cond_hooks", None)  # SetClipHooks' apply_to_conds
    return CondEntry(
        embeds=embeds.float().cpu(),
        pooled=None if pooled is None else pooled.float().cpu(),
        extras={} if hooks is None else {"hooks": hooks},
    )


class CLIPTextEncode(Node):
    SCHEMA = NodeSchema(
        node_id="CLIPTextEncode",
        display_name="CLIP Text Encode (Prompt)",
        category="conditioning",
        description="Encode a text prompt (with (word:1.2) weighting; long prompts chunked) for a sampler.",
        inputs=(
            Input(
                "text", STRING, "The prompt; (word:1.2), (word), [word] and \\( escapes work.", multiline=True
            ),
            Input("clip", CLIP, "The text encoder(s) from a checkpoint loader or CLIPSetLastLayer."),
        ),
        outputs=(
            Output("CONDITIONING", CONDITIONING, "The encoded prompt, for a sampler's positive/negative."),
        ),
        batching=Batching(inputs=("text",)),  # queued jobs differing only in prompt text coalesce
    )

    def run(self, ctx: NodeContext, *, text: str, clip: Any) -> tuple[Conditioning]:
        with text_encoders(ctx, clip) as encoders:
            return ([encode_prompt(text, clip, encoders)],)


class ConditioningCombine(Node):
    SCHEMA = NodeSchema(
        node_id="ConditioningCombine",
        display_name="Conditioning (Combine)",
        category="conditioning",
        description="Put two conditionings side by side; the sampler averages their predictions.",
        inputs=(
            Input("conditioning_1", CONDITIONING, "First conditioning."),
            Input("conditioning_2", CONDITIONING, "Second conditioning."),
        ),
        outputs=(Output("CONDITIONING", CONDITIONING, "Both conditionings' entries."),),
    )

    def run(
        self, ctx: NodeContext, *, conditioning_1: Conditioning, conditioning_2: Conditioning
    ) -> tuple[Conditioning]:
        return (list(conditioning_1) + list(conditioning_2),)


class ConditioningSetArea(Node):
    SCHEMA = NodeSchema(
        node_id="ConditioningSetArea",
        display_name="Conditioning (Set Area)",
        category="conditioning",
        description="Limit a conditioning to a rectangle of the image, with a strength.",
        inputs=(
            Input("conditioning", CONDITIONING, "The conditioning to place."),
            Input(
                "width", INT, "Area width in pixels (multiple of 8).", default=64, min=64, max=16384, step=8
            ),
            Input(
                "height", INT, "Area height in pixels (multiple of 8).", default=64, min=64, max=16384, step=8
            ),
            Input("x", INT, "Left edge in pixels.", default=0, min=0, max=16384, step=8),
            Input("y", INT, "Top edge in pixels.", default=0, min=0, max=16384, step=8),
            Input(
                "strength",
                FLOAT,
                "Weight of this area's prediction.",
                default=1.0,
                min=0.0,
                max=10.0,
                step=0.01,
            ),
        ),
        outputs=(Output("CONDITIONING", CONDITIONING, "The conditioning with its area set."),),
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        conditioning: Conditioning,
        width: int,
        height: int,
        x: int,
        y: int,
        strength: float,
    ) -> tuple[Conditioning]:
        area = (height // 8, width // 8, y // 8, x // 8)
        return ([replace(e, area=area, strength=strength) for e in conditioning],)


class ConditioningZeroOut(Node):
    SCHEMA = NodeSchema(
        node_id="ConditioningZeroOut",
        display_name="ConditioningZeroOut",
        category="advanced/conditioning",
        description="Replace the embeddings (and pooled output) with zeros, e.g. an empty negative for a pooled-output model.",
        inputs=(Input("conditioning", CONDITIONING, "The conditioning to zero."),),
        outputs=(Output("CONDITIONING", CONDITIONING, "Zeroed conditioning of the same shape."),),
    )

    def run(self, ctx: NodeContext, *, conditioning: Conditioning) -> tuple[Conditioning]:
        zeroed = [
            replace(
                e,
                embeds=torch.zeros_like(e.embeds),
                pooled=None if e.pooled is None else torch.zeros_like(e.pooled),
            )
            for e in conditioning
        ]
        return (zeroed,)


NODES: list[type[Node]] = [
    CLIPTextEncode,
    ConditioningCombine,
    ConditioningSetArea,
    ConditioningZeroOut,
]
