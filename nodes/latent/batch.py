"""ComfyUI's latent batch nodes (``.latent`` files are in :mod:`nodes.latent.files`).

Batch bookkeeping follows ComfyUI: ``batch_index`` lists, per batch item, which item of the
original batch it is (the sampler draws item ``i``'s noise as the ``batch_index[i]``-th of one
seeded batch), and ``noise_mask`` [B|1, 1, H, W] follows the items it belongs to.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from engine.context import NodeContext
from engine.node import Node, OutputSizes
from engine.schema import COMBO, INT, LATENT, Input, NodeSchema, Output
from nodes.core.tensor_sizes import joined, repeated
from nodes.latent.transforms import check_same_space, match_to, repeat_to_batch, samples_of, with_samples
from nodes.latent.vae import MAX_RESOLUTION, LatentError

_OUT = (Output("LATENT", LATENT, "The resulting latent."),)


def _in(name: str, description: str = "A latent.") -> Input:
    return Input(name, LATENT, description)


def _resolve_dim(name: str, ndim: int) -> int:
    """``x``/``y``/``t`` (a leading ``-`` is handled by the caller) → a tensor dimension."""
    return {"x": ndim - 1, "y": ndim - 2, "t": ndim - 3}[name.lstrip("-")]


# --- batches ----------------------------------------------------------------------------------
class LatentBatch(Node):
    SCHEMA = NodeSchema(
        node_id="LatentBatch",
        display_name="Batch Latents (DEPRECATED)",
        category="latent/batch",
        description="Join two latents into one batch (samples2 resized to samples1's size); batch_index lists "
        "both inputs' items.",
        inputs=(_in("samples1"), _in("samples2")),
        outputs=_OUT,
        deprecated=True,
    )

    def run(self, ctx: NodeContext, *, samples1: dict, samples2: dict) -> tuple[dict]:
        s1 = samples_of(samples1, "samples1")
        check_same_space(samples1, samples2, "samples2")
        s2 = match_to(s1, samples_of(samples2, "samples2"), "samples2", repeat_batch=False)
        index = list(samples1.get("batch_index", range(s1.shape[0]))) + list(
            samples2.get("batch_index", range(s2.shape[0]))
        )
        return ({**samples1, "samples": torch.cat((s1, s2.to(s1.dtype)), dim=0), "batch_index": index},)

    @classmethod
    def estimate_outputs(cls, *, samples1: Any = None, samples2: Any = None, **_: Any) -> OutputSizes:
        return (joined([samples1, samples2]),)


AUTOGROW_MAX = 50  # ComfyUI's Autogrow template: latents.latent0 .. latents.latent49, at least 2


def batch_latents(latents: list[dict]) -> dict:
    """One LATENT holding every item of ``latents`` (later ones resized to the first's size) with
    their batch indices listed in order."""
    first = samples_of(latents[0], "latents.latent0")
    parts, index = [], []
    for n, latent in enumerate(latents):
        s = samples_of(latent, f"latents.latent{n}")
        check_same_space(latents[0], latent, f"latents.latent{n}")
        parts.append(match_to(first, s, f"latents.latent{n}", repeat_batch=False).to(first.dtype))
        index += list(latent.get("batch_index", range(s.shape[0])))
    return {**latents[0], "samples": torch.cat(parts, dim=0), "batch_index": index}


class BatchLatentsNode(Node):
    SCHEMA = NodeSchema(
        node_id="BatchLatentsNode",
        display_name="Batch Latents",
        category="latent",
        description="Join 2 to 50 latents into one batch (later ones resized to the first's size).",
        inputs=tuple(
            Input(f"latents.latent{i}", LATENT, f"Latent #{i + 1}.", optional=i >= 2)
            for i in range(AUTOGROW_MAX)
        ),
        outputs=_OUT,
    )

    def run(self, ctx: NodeContext, **latents: dict) -> tuple[dict]:
        # connected slots in slot order; unconnected optional slots do not arrive at all
        given = [
            latents[f"latents.latent{i}"] for i in range(AUTOGROW_MAX) if f"latents.latent{i}" in latents
        ]
        return (batch_latents(given),)


class RepeatLatentBatch(Node):
    SCHEMA = NodeSchema(
        node_id="RepeatLatentBatch",
        display_name="Repeat Latent Batch",
        category="latent/batch",
        description="Repeat the whole batch `amount` times (with its noise masks and batch indices).",
        inputs=(_in("samples"), Input("amount", INT, "How many copies.", default=1, min=1, max=64)),
        outputs=_OUT,
    )

    def run(self, ctx: NodeContext, *, samples: dict, amount: int) -> tuple[dict]:
        s = samples_of(samples, "samples")
        out = with_samples(samples, s.repeat(amount, *([1] * (s.ndim - 1))))
        mask = samples.get("noise_mask")
        if isinstance(mask, torch.Tensor) and mask.shape[0] > 1:
            out["noise_mask"] = mask.repeat(amount, *([1] * (mask.ndim - 1)))
        if "batch_index" in samples:
            index = list(samples["batch_index"])
            offset = max(index) - min(index) + 1
            out["batch_index"] = index + [i + k * offset for k in range(1, amount) for i in index]
        return (out,)

    @classmethod
    def estimate_outputs(cls, *, samples: Any = None, amount: Any = None, **_: Any) -> OutputSizes:
        return (repeated(samples, amount),)


class LatentFromBatch(Node):
    SCHEMA = NodeSchema(
        node_id="LatentFromBatch",
        display_name="Get Latent From Batch",
        category="latent/batch",
        description="Take `length` items starting at batch_index (negative counts from the end; clamped to the "
        "batch).",
        inputs=(
            _in("samples"),
            Input(
                "batch_index",
                INT,
                "First item (0-based; -1 is the last).",
                default=0,
                min=-MAX_RESOLUTION,
                max=MAX_RESOLUTION,
            ),
            Input("length", INT, "How many items.", default=1, min=1, max=64),
        ),
        outputs=_OUT,
    )

    def run(self, ctx: NodeContext, *, samples: dict, batch_index: int, length: int) -> tuple[dict]:
        s = samples_of(samples, "samples")
        size = s.shape[0]
        start = batch_index + size if batch_index < 0 else batch_index
        start = max(0, min(size - 1, start))
        length = min(size - start, length)
        out = with_samples(samples, s[start : start + length].clone())
        mask = samples.get("noise_mask")
        if isinstance(mask, torch.Tensor):
            if mask.shape[0] == 1:
                out["noise_mask"] = mask.clone()
            else:
                out["noise_mask"] = repeat_to_batch(mask, size)[start : start + length].clone()
        if "batch_index" in samples:
            out["batch_index"] = list(samples["batch_index"])[start : start + length]
        else:
            out["batch_index"] = list(range(start, start + length))
        return (out,)


class RebatchLatents(Node):
    SCHEMA = NodeSchema(
        node_id="RebatchLatents",
        display_name="Rebatch Latents",
        category="latent/batch",
        description="Regroup a list of latent batches into batches of batch_size (a change of size starts a new "
        "batch); all-ones noise masks are dropped.",
        inputs=(
            _in("latents", "Latent batches (a list)."),
            Input("batch_size", INT, "Items per output batch.", default=1, min=1, max=4096),
        ),
        outputs=(Output("LATENT", LATENT, "The new batches (a list).", is_list=True),),
        input_is_list=True,
    )

    def run(self, ctx: NodeContext, *, latents: list[dict], batch_size: list[int]) -> tuple[list[dict]]:
        size = int(batch_size[0])
        batches: list[dict] = []
        current: list[tuple[torch.Tensor, torch.Tensor, int]] = []  # (sample, mask, batch index) per item
        processed = 0
        for n, latent in enumerate(latents):
            items = _items(latent, f"latents[{n}]", processed)
            processed += len(items)
            if current and items and items[0][0].shape[-2:] != current[0][0].shape[-2:]:
                batches.append(_join(current[:size]))
                current = []
            current += items
            while len(current) > size:
                batches.append(_join(current[:size]))
                current = current[size:]
        if current:
            batches.append(_join(current[:size]))
        return (batches,)


def _items(latent: dict, name: str, offset: int) -> list[tuple[torch.Tensor, torch.Tensor, int]]:
    """One latent split into items with a full-resolution mask each (ones where it had none)."""
    s = samples_of(latent, name)
    b, h, w = s.shape[0], s.shape[-2] * 8, s.shape[-1] * 8
    mask = latent.get("noise_mask")
    if not isinstance(mask, torch.Tensor):
        mask = torch.ones(b, 1, h, w)
    mask = mask.reshape(-1, 1, mask.shape[-2], mask.shape[-1]).float()
    if mask.shape[-2:] != (h, w):
        mask = torch.nn.functional.interpolate(mask, size=(h, w), mode="bilinear")
    if mask.shape[0] < b:
        mask = mask.repeat(math.ceil(b / mask.shape[0]), 1, 1, 1)[:b]
    index = list(latent.get("batch_index", [offset + i for i in range(b)]))
    return [(s[i : i + 1], mask[i : i + 1], index[i]) for i in range(b)]


def _join(items: list[tuple[torch.Tensor, torch.Tensor, int]]) -> dict:
    mask = torch.cat([m for _, m, _ in items])
    out: dict[str, Any] = {
        "samples": torch.cat([s for s, _, _ in items]),
        "batch_index": [i for _, _, i in items],
    }
    if float(mask.mean()) != 1.0:
        out["noise_mask"] = mask
    return out


class LatentBatchSeedBehavior(Node):
    SCHEMA = NodeSchema(
        node_id="LatentBatchSeedBehavior",
        display_name="LatentBatchSeedBehavior",
        category="latent/advanced",
        description="'fixed': every item gets the first item's noise; 'random': each item its own (batch_index "
        "removed).",
        inputs=(
            _in("samples"),
            Input(
                "seed_behavior",
                COMBO,
                "How batch items get their noise.",
                options=("random", "fixed"),
                default="fixed",
            ),
        ),
        outputs=_OUT,
    )

    def run(self, ctx: NodeContext, *, samples: dict, seed_behavior: str) -> tuple[dict]:
        s = samples_of(samples, "samples")
        out = dict(samples)
        if seed_behavior == "random":
            out.pop("batch_index", None)
        elif seed_behavior == "fixed":
            first = list(samples.get("batch_index", [0]))[0]
            out["batch_index"] = [first] * s.shape[0]
        return (out,)


# --- slicing and joining along x / y / t -----------------------------------------------------
class LatentConcat(Node):
    SCHEMA = NodeSchema(
        node_id="LatentConcat",
        display_name="LatentConcat",
        category="latent/advanced",
        description="Join two latents along x, y or t (time); '-' puts samples2 first.",
        inputs=(
            _in("samples1"),
            _in("samples2"),
            Input("dim", COMBO, "Axis to join along.", options=("x", "-x", "y", "-y", "t", "-t")),
        ),
        outputs=_OUT,
    )

    def run(self, ctx: NodeContext, *, samples1: dict, samples2: dict, dim: str) -> tuple[dict]:
        s1 = samples_of(samples1, "samples1")
        check_same_space(samples1, samples2, "samples2")
        s2 = repeat_to_batch(samples_of(samples2, "samples2"), s1.shape[0])
        axis = _resolve_dim(dim, s1.ndim)
        if axis < 2 or s2.ndim != s1.ndim:
            raise LatentError(
                f"dim {dim!r} needs latents with that axis; samples1 has shape {list(s1.shape)}"
            )
        others = [d for d in range(s1.ndim) if d not in (0, axis)]
        if any(s1.shape[d] != s2.shape[d] for d in others):
            raise LatentError(
                f"samples2 has shape {list(s2.shape)} and samples1 {list(s1.shape)}: all sizes but "
                f"the {dim.lstrip('-')} axis must agree"
            )
        pair = (s2, s1) if dim.startswith("-") else (s1, s2)
        return (with_samples(samples1, torch.cat(pair, dim=axis)),)


class LatentCut(Node):
    SCHEMA = NodeSchema(
        node_id="LatentCut",
        display_name="LatentCut",
        category="latent/advanced",
        description="Keep `amount` elements along x, y or t from index (negative counts from the end; clamped).",
        inputs=(
            _in("samples"),
            Input("dim", COMBO, "Axis to cut along.", options=("x", "y", "t")),
            Input(
                "index",
                INT,
                "First element kept.",
                default=0,
                min=-MAX_RESOLUTION,
                max=MAX_RESOLUTION,
                step=1,
            ),
            Input("amount", INT, "How many elements.", default=1, min=1, max=MAX_RESOLUTION, step=1),
        ),
        outputs=_OUT,
    )

    def run(self, ctx: NodeContext, *, samples: dict, dim: str, index: int, amount: int) -> tuple[dict]:
        s = samples_of(samples, "samples")
        axis = _resolve_dim(dim, s.ndim)
        if axis < 2:
            raise LatentError(f"dim {dim!r}: samples has shape {list(s.shape)}, which has no {dim} axis")
        length = s.shape[axis]
        if index >= 0:
            index = min(index, length - 1)
            amount = min(length - index, amount)
        else:
            index = max(index, -length)
            amount = min(-index, amount)
        return (with_samples(samples, torch.narrow(s, axis, index % length, amount)),)


class LatentCutToBatch(Node):
    SCHEMA = NodeSchema(
        node_id="LatentCutToBatch",
        display_name="LatentCutToBatch",
        category="latent/advanced",
        description="Cut the latent into slices of slice_size along t, x or y and stack them as batch items "
        "(a remainder is dropped).",
        inputs=(
            _in("samples"),
            Input("dim", COMBO, "Axis to cut along.", options=("t", "x", "y")),
            Input("slice_size", INT, "Elements per slice.", default=1, min=1, max=MAX_RESOLUTION, step=1),
        ),
        outputs=_OUT,
    )

    def run(self, ctx: NodeContext, *, samples: dict, dim: str, slice_size: int) -> tuple[dict]:
        s = samples_of(samples, "samples")
        axis = _resolve_dim(dim, s.ndim)
        if axis < 2:
            return (samples,)  # ComfyUI: a 4-D latent has no t axis; unchanged
        moved = s.movedim(axis, 1)
        if moved.shape[1] < slice_size:
            slice_size = moved.shape[1]
        else:
            moved = moved[:, : moved.shape[1] // slice_size * slice_size]
        out = moved.reshape(-1, slice_size, *moved.shape[2:]).movedim(1, axis)
        return (with_samples(samples, out),)


NODES: list[type[Node]] = [
    LatentBatch,
    BatchLatentsNode,
    RepeatLatentBatch,
    LatentFromBatch,
    RebatchLatents,
    LatentBatchSeedBehavior,
    LatentConcat,
    LatentCut,
    LatentCutToBatch,
]
