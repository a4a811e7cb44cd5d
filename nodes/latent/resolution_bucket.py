"""ComfyUI's ResolutionBucket (training data preparation): group latents and their conditioning by
height and width, one batch per size, in the order the sizes first appear.

Both inputs are whole lists (``input_is_list``): latent dicts, each holding a batch, and for each a
list with one conditioning entry per sample of that batch. Both outputs are lists, one item per
bucket.
"""

from __future__ import annotations

from typing import Any

import torch

from engine.context import NodeContext
from engine.node import Node
from engine.schema import CONDITIONING, LATENT, Input, NodeSchema, Output


class BucketError(ValueError):
    """Latents and conditioning that cannot be paired; the message names the input and the item."""


def bucket_by_resolution(latents: list[Any], conditioning: list[Any]) -> tuple[list[dict], list[list[Any]]]:
    """(one latent dict per size, one conditioning list per size), sizes in first-seen order."""
    if not latents:
        raise BucketError("latents: the list is empty; connect a list of latents to bucket")
    if len(latents) != len(conditioning):
        raise BucketError(
            f"conditioning: expected one entry per latent ({len(latents)}), found {len(conditioning)}; "
            "give each latent its conditioning list"
        )
    samples: dict[tuple[int, int], list[torch.Tensor]] = {}
    conds: dict[tuple[int, int], list[Any]] = {}
    for i, (latent, cond) in enumerate(zip(latents, conditioning, strict=True)):
        batch = latent.get("samples") if isinstance(latent, dict) else None
        if not isinstance(batch, torch.Tensor) or batch.ndim not in (4, 5):
            raise BucketError(f"latents[{i}]: expected samples [B, C, H, W] or [B, T, C, H, W]")
        cond_items = list(cond) if isinstance(cond, list | tuple) else [cond]
        if len(cond_items) != batch.shape[0]:
            raise BucketError(
                f"conditioning[{i}]: expected {batch.shape[0]} entries (one per sample of latents[{i}]), "
                f"found {len(cond_items)}"
            )
        size = (int(batch.shape[-2]), int(batch.shape[-1]))
        samples.setdefault(size, []).extend(batch.unbind(0))
        conds.setdefault(size, []).extend(cond_items)
    return [{"samples": torch.stack(s)} for s in samples.values()], list(conds.values())


class ResolutionBucket(Node):
    SCHEMA = NodeSchema(
        node_id="ResolutionBucket",
        display_name="Resolution Bucket",
        category="training",
        description="Group latents and their conditioning by resolution: one batch per height × width.",
        inputs=(
            Input("latents", LATENT, "List of latent dicts to bucket by resolution."),
            Input("conditioning", CONDITIONING, "List of conditioning lists (one per latent)."),
        ),
        outputs=(
            Output("latents", LATENT, "One batched latent per resolution bucket.", is_list=True),
            Output("conditioning", CONDITIONING, "One conditioning list per bucket.", is_list=True),
        ),
        input_is_list=True,
    )

    def run(self, ctx: NodeContext, *, latents: list[Any], conditioning: list[Any]) -> tuple[list, list]:
        return bucket_by_resolution(list(latents), list(conditioning))


NODES = [ResolutionBucket]
