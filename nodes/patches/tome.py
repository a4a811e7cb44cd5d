"""Token merging (ToMe for Stable Diffusion) as a MODEL patch: ``TomePatchModel`` (ComfyUI's name).

Bolya & Hoffman 2023, "Token Merging for Fast Stable Diffusion" (https://arxiv.org/abs/2303.17604),
through the ``tomesd`` package (``tomesd.apply_patch`` on a diffusers ``UNet2DConditionModel``).
Self-attention tokens at the highest resolution are merged by ``ratio`` before attention and
unmerged after, which trades a little image quality for speed (most at large sizes on GPUs; on a
CPU convolutions dominate, see ``nodes/bench/README.md``).

The patch travels with the handle (``handle.with_patch``), so the patched UNet is a different
model for the memory manager and the cache, and the unpatched one is never changed. ``use_rand``
is off so that a seed gives the same image on every run (tomesd's random destination choice forks
the process's global RNG state).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.context import NodeContext
from engine.node import Node
from engine.schema import FLOAT, MODEL, Input, NodeSchema, Output


@dataclass(frozen=True)
class TomePatch:
    """A :class:`nodes.handles.Patch`: tomesd on the UNet with the given merge ratio."""

    ratio: float
    max_downsample: int = 1

    @property
    def key(self) -> str:
        return f"tome:{self.ratio:.4f}:{self.max_downsample}"

    def apply(self, module: Any, handle: Any) -> None:
        import tomesd

        tomesd.apply_patch(module, ratio=self.ratio, max_downsample=self.max_downsample, use_rand=False)


class TomePatchModel(Node):
    SCHEMA = NodeSchema(
        node_id="TomePatchModel",
        display_name="Tome Patch Model",
        category="model_patches",
        description="Merge similar self-attention tokens (ToMe) for speed; trades a little quality.",
        inputs=(
            Input("model", MODEL, "The diffusion model to patch."),
            Input("ratio", FLOAT, "Fraction of tokens merged (0 = off; 0.3–0.5 typical).", default=0.3,
                  min=0.0, max=0.75, step=0.01),
        ),
        outputs=(Output("MODEL", MODEL, "The model with token merging applied."),),
    )

    def run(self, ctx: NodeContext, *, model: Any, ratio: float) -> tuple[Any]:
        if ratio <= 0:
            return (model,)
        return (model.with_patch(TomePatch(round(float(ratio), 4))),)
