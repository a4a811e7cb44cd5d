"""``LotusConditioning``: the fixed conditioning Lotus' depth and normal models are sampled with.

Lotus (He et al. 2024, "Lotus: Diffusion-based Visual Foundation Model for High-quality Dense
Prediction") fine-tunes SD2 with a frozen text encoder and an empty prompt, so its conditioning never
changes. As ComfyUI's node, Loom ships that encoder output (2 tokens x 1024, from ComfyUI's
``comfy_extras/nodes_lotus.py``) as data, ``data/lotus_null_conditioning.json``, instead of running
the encoder.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from engine.context import NodeContext
from engine.node import Node
from engine.schema import CONDITIONING, NodeSchema, Output
from nodes.core.cond import CondEntry, Conditioning

EMBEDDING_FILE = Path(__file__).parent / "data" / "lotus_null_conditioning.json"


def lotus_embedding(path: Path = EMBEDDING_FILE) -> torch.Tensor:
    """The shipped null-prompt embedding, (1, 2, 1024) float32."""
    table = json.loads(path.read_text(encoding="utf-8"))
    return torch.tensor(table["values"], dtype=torch.float32).reshape(table["shape"])


class LotusConditioning(Node):
    SCHEMA = NodeSchema(
        node_id="LotusConditioning",
        display_name="LotusConditioning",
        category="conditioning/lotus",
        description="The fixed null-prompt conditioning of the Lotus depth/normal models (2 tokens x 1024).",
        inputs=(),
        outputs=(Output("conditioning", CONDITIONING, "Lotus' conditioning."),),
    )

    def run(self, ctx: NodeContext) -> tuple[Conditioning]:
        return ([CondEntry(embeds=lotus_embedding())],)


NODES = (LotusConditioning,)
