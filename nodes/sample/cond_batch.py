"""Conditioning at sampling time: which entries apply where and when, and their batched model calls.

ComfyUI's rules (``comfy/samplers.py``: ``process_conds``, ``get_area_and_mult``,
``_calc_cond_batch``, ``create_cond_with_same_area_if_none``), read for behaviour and written anew:

- an entry's **area** (h, w, y, x in latent cells, or ``extras["area_percentage"]`` as fractions
  of the latent's size) crops the model input; its prediction is weighted
  by ``strength`` and feathered linearly over ``min(8, side // 4)`` cells along every edge that does
  not touch the image border; a **mask** (``extras["mask"]``, resized to the latent) replaces the
  feathering and is scaled by ``extras["mask_strength"]``; ``set_area_to_bounds`` turns the mask's
  bounding box into the area;
- a **timestep range** (``extras["start_percent"]`` / ``["end_percent"]``) drops the entry while
  sigma is above sigma(start) or below sigma(end);
- every area entry gets a counterpart with the same area in each other branch, carrying the
  prompt of the smallest entry there that encloses it;
- a **default** entry (``extras["default"]``, ConditioningSetDefaultCombine) applies only where its
  branch's other entries of the step leave weight: its weight is ``relu(1 - sum(their mult))``, and
  it is skipped where that is zero everywhere;
- entries with different weight hooks (``extras["hooks"]``) never share a model call;
- per step, entries whose crops and prompts have equal shapes run as **one** model call (the
  branches in reverse order, so CFG's batch is [uncond, cond]); each branch's prediction is
  ``sum(out * mult) / sum(mult)`` over its entries (the denominator starts at 1e-37).

Stacked jobs (coalesced requests) are rows of one batch: every job has its own conditioning,
applied to its rows only, and all jobs' entries share the model calls.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from nodes.core.cond import CondEntry

Area = tuple[int, int, int, int]  # (h, w, y, x) in latent cells
FEATHER = 8


@dataclass(frozen=True)
class Cond:
    """One conditioning entry prepared for a run (ComfyUI's processed cond dict)."""

    entry: CondEntry  # the prompt (embeds, pooled, extras) the model call uses
    area: Area | None
    strength: float
    mask: torch.Tensor | None  # (Bm, h, w) at the latent's size, already times mask_strength
    sigma_start: float | None  # dropped while sigma > sigma_start
    sigma_end: float | None  # dropped while sigma < sigma_end


def _mask_bounds(mask: torch.Tensor) -> Area:
    """ComfyUI's ``set_area_to_bounds``: the bounding box of the non-zero mask, at least 8x8."""
    bounds = mask.abs().amax(dim=0)
    ys, xs = torch.nonzero(bounds, as_tuple=True)
    if ys.numel() == 0:
        return (8, 8, 0, 0)
    y0, y1, x0, x1 = int(ys.min()), int(ys.max()), int(xs.min()), int(xs.max())
    return (max(8, y1 - y0 + 1), max(8, x1 - x0 + 1), y0, x0)


def prepare(
    entries: Sequence[CondEntry], size: tuple[int, int], percent_to_sigma: Callable[[float], float]
) -> list[Cond]:
    """Entries of one branch resolved for a latent of ``size`` (h, w): masks resized, areas set,
    timestep ranges turned into sigmas."""
    out = []
    for e in entries:
        area, mask = e.area, None
        if area is None and e.extras.get("area_percentage") is not None:  # ConditioningSetAreaPercentage
            ph, pw, py, px = e.extras["area_percentage"]
            area = (
                max(1, round(ph * size[0])),
                max(1, round(pw * size[1])),
                round(py * size[0]),
                round(px * size[1]),
            )
        if e.extras.get("mask") is not None:
            m = torch.as_tensor(e.extras["mask"]).float()
            m = m.reshape(-1, *m.shape[-2:])
            if tuple(m.shape[-2:]) != size:
                m = torch.nn.functional.interpolate(
                    m.unsqueeze(1), size=size, mode="bilinear", align_corners=False
                ).squeeze(1)
            if e.extras.get("set_area_to_bounds"):
                area = _mask_bounds(m)
            mask = m * float(e.extras.get("mask_strength", 1.0))
        start, end = e.extras.get("start_percent"), e.extras.get("end_percent")
        out.append(
            Cond(
                e,
                area,
                float(e.strength),
                mask,
                percent_to_sigma(float(start)) if start is not None else None,
                percent_to_sigma(float(end)) if end is not None else None,
            )
        )
    return out


def _inside(a: Area, outer: Area) -> bool:
    return (
        a[2] >= outer[2]
        and a[3] >= outer[3]
        and a[2] + a[0] <= outer[2] + outer[0]
        and a[3] + a[1] <= outer[3] + outer[1]
    )


def add_same_area_counterparts(branches: Mapping[str, list[Cond]]) -> None:
    """ComfyUI's ``create_cond_with_same_area_if_none`` for every pair of branches (in place):
    an area entry of one branch gets, in each other branch, an entry with its area, strength, mask
    and range but the prompt of the smallest entry there that encloses it (an area-less one
    encloses everything but loses to any enclosing area)."""
    for name, conds in branches.items():
        for c in list(conds):
            if c.area is None:
                continue
            for other, targets in branches.items():
                if other == name:
                    continue
                smallest: Cond | None = None
                for t in list(targets):
                    if t.area is None:
                        smallest = smallest or t
                    elif _inside(c.area, t.area):
                        if (
                            smallest is None
                            or smallest.area is None
                            or math.prod(smallest.area[:2]) > math.prod(t.area[:2])
                        ):
                            smallest = t
                if smallest is None or smallest.area == c.area:
                    continue
                targets.append(replace(c, entry=smallest.entry))


@dataclass
class _Item:
    """A cond ready for one step: its model input crop, weights and where its output goes."""

    x: torch.Tensor
    mult: torch.Tensor | None  # None: the whole crop weighs 1 (no area, no mask, strength 1)
    cond: Cond
    branch: int
    rows: slice
    area: Area | None


def _area_and_mult(c: Cond, x: torch.Tensor, sigma: float, branch: int, rows: slice) -> _Item | None:
    """ComfyUI's ``get_area_and_mult`` for the rows of one job; None when the range excludes it."""
    if c.sigma_start is not None and sigma > c.sigma_start:
        return None
    if c.sigma_end is not None and sigma < c.sigma_end:
        return None
    h, w = x.shape[-2:]
    area = c.area
    crop = x
    if area is not None:
        ah, aw = min(h - area[2], area[0]), min(w - area[3], area[1])
        area = (ah, aw, area[2], area[3])
        crop = x[:, :, area[2] : area[2] + ah, area[3] : area[3] + aw]
    if c.mask is not None:
        m = c.mask[: crop.shape[0]]
        if area is not None:
            m = m[:, area[2] : area[2] + area[0], area[3] : area[3] + area[1]]
        m = m.to(crop).unsqueeze(1).repeat(crop.shape[0] // m.shape[0], crop.shape[1], 1, 1)
        mult = m * c.strength
    elif area is None and c.strength == 1.0:
        return _Item(crop, None, c, branch, rows, area)
    else:
        mult = torch.ones_like(crop) * c.strength
        if area is not None:
            _feather(mult, area, (h, w))
    return _Item(crop, mult, c, branch, rows, area)


def _feather(mult: torch.Tensor, area: Area, full: tuple[int, int]) -> None:
    """Linear ramps over the edges of ``area`` that are inside the image (ComfyUI's fuzz)."""
    for dim in range(2):
        size, offset = area[dim], area[2 + dim]
        ramp = min(FEATHER, mult.shape[2 + dim] // 4)
        for t in range(ramp):
            factor = (t + 1) / ramp
            if offset != 0:
                mult.narrow(2 + dim, t, 1).mul_(factor)
            if size + offset < full[dim]:
                mult.narrow(2 + dim, size - 1 - t, 1).mul_(factor)


def _embeds_compatible(a: torch.Tensor, b: torch.Tensor) -> bool:
    """ComfyUI's ``CONDCrossAttn.can_concat``: same width, token lengths within an lcm factor of 4."""
    if a.shape[0] != b.shape[0] or a.shape[2] != b.shape[2]:
        return False
    return math.lcm(a.shape[1], b.shape[1]) // min(a.shape[1], b.shape[1]) <= 4


def _references(e: CondEntry) -> tuple[Any, ...]:
    """What must match for two entries' reference latents to batch (ComfyUI's CONDList and
    CONDConstant rules): the latents' shapes, in order, and the method."""
    refs = e.extras.get("reference_latents") or ()
    return tuple(tuple(r.shape) for r in refs), e.extras.get("reference_latents_method")


def _can_concat(a: _Item, b: _Item) -> bool:
    ea, eb = a.cond.entry, b.cond.entry
    return (
        a.x.shape == b.x.shape
        and _embeds_compatible(ea.embeds, eb.embeds)
        and (ea.pooled is None) == (eb.pooled is None)
        and ea.extras.get("control") is eb.extras.get("control")
        and ea.extras.get("gligen") is eb.extras.get("gligen")
        and ea.extras.get("hooks") is eb.extras.get("hooks")
        and _references(ea) == _references(eb)
    )


@dataclass(frozen=True)
class RequestConds:
    """The rows of one request (job) in the batch and its prepared conditioning per branch name."""

    rows: slice
    branches: Mapping[str, list[Cond]]


# (x crops, sigma per row, cond entries of the items, rows per item, branch index per item) -> outputs
BatchCall = Callable[[torch.Tensor, torch.Tensor, Sequence[Cond], int, Sequence[int]], torch.Tensor]


def calc_cond_batch(
    call: BatchCall,
    jobs: Sequence[RequestConds],
    names: Sequence[str | None],
    x: torch.Tensor,
    sigma: torch.Tensor,
) -> list[torch.Tensor]:
    """The denoised prediction of each named branch (``None``: skipped, zeros) for the batch ``x``."""
    to_run: list[_Item] = []
    defaults: list[_Item] = []
    for i, name in enumerate(names):
        if name is None:
            continue
        for job in jobs:
            s = float(sigma[job.rows.start])
            for c in job.branches.get(name, []):
                item = _area_and_mult(c, x[job.rows], s, i, job.rows)
                if item is not None:
                    (defaults if c.entry.extras.get("default") else to_run).append(item)
    if defaults:
        to_run += _default_items(defaults, to_run, x)
    # Each branch's rows covered by exactly one whole-crop item of weight 1: sum(out * 1) / (1 + 1e-37)
    # is that item's output bit for bit, so it is used as is (no accumulators).
    spots = [(item.branch, item.rows.start) for item in to_run]
    direct = all(item.mult is None for item in to_run) and len(set(spots)) == len(spots)
    outs = [torch.zeros_like(x) for _ in names]
    counts = [] if direct else [torch.ones_like(x) * 1e-37 for _ in names]
    while to_run:
        first = to_run[0]
        picked = [k for k, item in enumerate(to_run) if _can_concat(item, first)]
        group = [to_run.pop(k) for k in reversed(picked)]  # ComfyUI's order: [uncond..., cond...]
        sig = torch.cat([sigma[item.rows] for item in group])
        output = call(
            torch.cat([item.x for item in group]),
            sig,
            [item.cond for item in group],
            first.x.shape[0],
            [item.branch for item in group],
        ).chunk(len(group))
        for item, out in zip(group, output, strict=True):
            if direct:
                outs[item.branch][item.rows] = out
                continue
            target, count = outs[item.branch][item.rows], counts[item.branch][item.rows]
            if item.area is not None:
                h, w, y, x0 = item.area
                target = target[:, :, y : y + h, x0 : x0 + w]
                count = count[:, :, y : y + h, x0 : x0 + w]
            mult = item.mult if item.mult is not None else torch.ones_like(out)
            target += out * mult
            count += mult
    return outs if direct else [o / c for o, c in zip(outs, counts, strict=True)]


def _default_items(defaults: Sequence[_Item], items: Sequence[_Item], x: torch.Tensor) -> list[_Item]:
    """ComfyUI's ``finalize_default_conds``: each default item over the whole latent, weighted by
    what its branch's other items leave of 1 in its rows (dropped where they cover everything)."""
    out = []
    for d in defaults:
        left = torch.ones_like(x[d.rows])
        for item in items:
            if item.branch != d.branch or item.rows != d.rows:
                continue
            mult = item.mult if item.mult is not None else torch.ones_like(item.x)
            if item.area is not None:
                h, w, y, x0 = item.area
                left[:, :, y : y + h, x0 : x0 + w] -= mult
            else:
                left -= mult
        left = torch.relu(left)
        if float(left.max()) > 0.0:
            out.append(replace(d, x=x[d.rows], area=None, mult=left))
    return out


def lcm_repeat(embeds: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Token windows repeated to a common length (ComfyUI's ``CONDCrossAttn.concat``)."""
    target = math.lcm(*[e.shape[1] for e in embeds])
    return [e.repeat(1, target // e.shape[1], 1) for e in embeds]


def model_kwargs_key(conds: Sequence[Cond], rows: int, size: tuple[int, int]) -> tuple[Any, ...]:
    """Cache key for the keyword inputs of a call (the entries' identities, rows and size)."""
    return (tuple(id(c.entry) for c in conds), rows, size)
