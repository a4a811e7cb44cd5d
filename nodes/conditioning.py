"""Prompt encoding and conditioning utilities.

``CONDITIONING`` in Loom is a ``list[CondEntry]``: each entry is one encoded prompt with
``embeds`` [1, T, D] (T a multiple of 77: one 77-token window per chunk of a long prompt),
``pooled`` [1, P] or None (SDXL's projected clip_g output), an optional ``area`` and
``strength`` (ConditioningSetArea), and ``extras`` for what other nodes add. A sampler averages
the predictions of all entries of one side, weighted by strength over their area, as ComfyUI does.

Encoding (``encode_prompt``) follows ComfyUI's ``CLIPTextEncode``: weights parsed and tokens
chunked by :mod:`nodes.prompt_weights`; each text encoder of the family encodes every chunk,
takes hidden state ``layer`` (the family default, or CLIPSetLastLayer's choice), applies the final
layer norm if the family says so, and the per-token weighting; SDXL's encoders are concatenated
along the feature axis and the pooled output of the first chunk is kept.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import torch

from engine.context import NodeContext
from engine.node import Node
from engine.schema import CLIP, CONDITIONING, FLOAT, INT, STRING, Batching, Input, NodeSchema, Output
from nodes import prompt_weights as pw


@dataclass(frozen=True)
class CondEntry:
    """One encoded prompt (see the module docstring)."""

    embeds: torch.Tensor  # (1, T, D)
    pooled: torch.Tensor | None = None  # (1, P)
    area: tuple[int, int, int, int] | None = None  # (h, w, y, x) in latent cells (pixels / 8)
    strength: float = 1.0
    extras: Mapping[str, Any] = field(default_factory=dict)


Conditioning = list[CondEntry]


class EncoderSpec(Protocol):
    """What encoding needs from a family's text encoder description (``TextEncoderSpec``)."""

    @property
    def name(self) -> str: ...
    @property
    def default_layer(self) -> int: ...
    @property
    def final_norm(self) -> bool: ...
    @property
    def pooled(self) -> bool: ...


@dataclass(frozen=True)
class TextEncoder:
    """A ready text encoder: its spec, tokenizer, module (on the compute device) and the index
    into ``hidden_states`` to use (the family default or CLIPSetLastLayer's choice)."""

    spec: EncoderSpec
    tokenizer: Any
    module: Any
    layer: int


@contextmanager
def text_encoders(ctx: NodeContext, clip: Any) -> Iterator[list[TextEncoder]]:
    """The CLIP handle's encoders, resident for the duration of the ``with`` block."""
    with ctx.models.use(clip) as modules:
        tokenizers = modules.tokenizers  # loaded with the module (TextEncodersHandle)
        yield [
            TextEncoder(spec, tokenizers[spec.name], modules[spec.name], clip.hidden_state_index(spec.name))
            for spec in clip.specs()
        ]


def _final_norm(module: Any) -> Any:
    norm = getattr(module, "final_layer_norm", None)
    return norm if norm is not None else module.text_model.final_layer_norm


def _encode_one(enc: TextEncoder, text: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    tok = enc.tokenizer
    ids = {"bos": tok.bos_token_id, "eos": tok.eos_token_id, "pad": tok.pad_token_id}

    def tokenize_word(word: str) -> list[int]:
        return list(tok(word, add_special_tokens=False)["input_ids"])

    chunks = pw.chunk_tokens(pw.parse_weights(text), tokenize_word, **ids)
    weighted = any(c.has_weights for c in chunks)
    batch = [c.ids for c in chunks] + ([pw.empty_chunk(**ids).ids] if weighted else [])
    device = next(enc.module.parameters()).device
    out = enc.module(torch.tensor(batch, device=device), output_hidden_states=True)
    hidden = out.hidden_states[enc.layer]
    if enc.spec.final_norm:
        hidden = _final_norm(enc.module)(hidden)  # (n_chunks [+1], 77, D)
    if weighted:
        z = pw.apply_weights(hidden[:-1], hidden[-1], chunks)
    else:
        z = hidden.reshape(1, -1, hidden.shape[-1])  # chunks concatenated: (1, 77 * n, D)
    pooled = out.text_embeds[0:1] if enc.spec.pooled else None
    return z, pooled


@torch.no_grad()
def encode_prompt(text: str, encoders: Sequence[TextEncoder]) -> CondEntry:
    """Encode ``text`` with every text encoder of a family into one :class:`CondEntry`."""
    parts, pooled = [], None
    for enc in encoders:
        z, p = _encode_one(enc, text)
        parts.append(z)
        pooled = p if p is not None else pooled
    embeds = torch.cat(parts, dim=-1).float().cpu()
    return CondEntry(embeds=embeds, pooled=None if pooled is None else pooled.float().cpu())


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
            return ([encode_prompt(text, encoders)],)


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
        description="Replace the embeddings (and pooled output) with zeros, e.g. an SDXL empty negative.",
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


CONDITIONING_NODES: list[type[Node]] = [
    CLIPTextEncode,
    ConditioningCombine,
    ConditioningSetArea,
    ConditioningZeroOut,
]
