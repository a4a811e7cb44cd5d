"""ComfyUI's conditioning property nodes: what each sets on the entries, pair order, timestep
ranges, the default entry that fills only what the other entries leave, ConditioningMultiply."""

from __future__ import annotations

from typing import Any

import torch

from nodes.core.cond import CondEntry
from nodes.encode.conditioning_props import (
    ConditioningMultiply,
    ConditioningSetDefaultCombine,
    ConditioningSetProperties,
    ConditioningSetPropertiesAndCombine,
    ConditioningTimestepsRange,
    PairConditioningCombine,
    PairConditioningSetDefaultCombine,
    PairConditioningSetProperties,
    PairConditioningSetPropertiesAndCombine,
)
from nodes.load.lora_hooks import HookGroup, LoraHook
from nodes.sample import cond_batch as cb


def _entry(value: float) -> CondEntry:
    return CondEntry(embeds=torch.full((1, 77, 4), value), pooled=torch.full((1, 2), value))


def _hooks(strength: float) -> HookGroup:
    return HookGroup((LoraHook(None, None, strength, 0.0),))


def test_set_properties_sets_mask_hooks_and_range() -> None:
    mask = torch.ones(8, 8)
    (out,) = ConditioningSetProperties().run(
        None, cond_NEW=[_entry(1)], strength=0.5, set_cond_area="mask bounds", mask=mask,
        hooks=_hooks(1.0), timesteps=(0.2, 0.8),
    )  # fmt: skip
    extras = out[0].extras
    assert extras["mask"].shape == (1, 8, 8) and extras["mask_strength"] == 0.5
    assert extras["set_area_to_bounds"] is True
    assert (extras["start_percent"], extras["end_percent"]) == (0.2, 0.8)
    assert extras["hooks"] == _hooks(1.0)
    # without the optional inputs nothing is set
    (bare,) = ConditioningSetProperties().run(
        None, cond_NEW=[_entry(1)], strength=1.0, set_cond_area="default"
    )
    assert dict(bare[0].extras) == {}


def test_hooks_add_to_the_hooks_an_entry_already_has() -> None:
    (first,) = ConditioningSetProperties().run(
        None, cond_NEW=[_entry(1)], strength=1.0, set_cond_area="default", hooks=_hooks(1.0)
    )
    (second,) = ConditioningSetProperties().run(
        None, cond_NEW=first, strength=1.0, set_cond_area="default", hooks=_hooks(2.0)
    )
    assert second[0].extras["hooks"].hooks == _hooks(1.0).hooks + _hooks(2.0).hooks


def test_combine_variants_keep_the_old_entries_first() -> None:
    a, b, c, d = ([_entry(v)] for v in (1, 2, 3, 4))
    (one,) = ConditioningSetPropertiesAndCombine().run(
        None, cond=a, cond_NEW=b, strength=1.0, set_cond_area="default", timesteps=(0.0, 0.5)
    )
    assert [float(e.embeds[0, 0, 0]) for e in one] == [1, 2]
    assert "start_percent" not in one[0].extras and one[1].extras["end_percent"] == 0.5
    pos, neg = PairConditioningSetPropertiesAndCombine().run(
        None, positive=a, negative=b, positive_NEW=c, negative_NEW=d, strength=1.0, set_cond_area="default"
    )
    assert [float(e.embeds[0, 0, 0]) for e in pos] == [1, 3] and [float(e.embeds[0, 0, 0]) for e in neg] == [
        2,
        4,
    ]
    pos, neg = PairConditioningSetProperties().run(
        None, positive_NEW=a, negative_NEW=b, strength=1.0, set_cond_area="default", hooks=_hooks(1.0)
    )
    assert pos[0].extras["hooks"] == neg[0].extras["hooks"] == _hooks(1.0)
    pos, neg = PairConditioningCombine().run(None, positive_A=a, negative_A=b, positive_B=c, negative_B=d)
    assert [float(e.embeds[0, 0, 0]) for e in pos + neg] == [1, 3, 2, 4]


def test_default_combine_marks_the_default_entries() -> None:
    (out,) = ConditioningSetDefaultCombine().run(None, cond=[_entry(1)], cond_DEFAULT=[_entry(2)])
    assert "default" not in out[0].extras and out[1].extras["default"] is True
    pos, neg = PairConditioningSetDefaultCombine().run(
        None, positive=[_entry(1)], negative=[_entry(2)], positive_DEFAULT=[_entry(3)],
        negative_DEFAULT=[_entry(4)], hooks=_hooks(1.0),
    )  # fmt: skip
    assert pos[1].extras["default"] and neg[1].extras["hooks"] == _hooks(1.0)


def _calc(entries: list[CondEntry]) -> tuple[torch.Tensor, list[float]]:
    """The positive branch for a zero latent, with a model call that returns each entry's value."""
    seen: list[float] = []

    def call(xs: torch.Tensor, sigma: torch.Tensor, conds: Any, rows: int, branches: Any) -> torch.Tensor:
        values = [float(c.entry.embeds[0, 0, 0]) for c in conds]
        seen.extend(values)
        return torch.cat([torch.full_like(xs[:rows], v) for v in values])

    prepared = cb.prepare(entries, (8, 8), lambda p: 1.0 - p)
    job = cb.RequestConds(slice(0, 1), {"positive": prepared})
    out = cb.calc_cond_batch(call, [job], ["positive"], torch.zeros(1, 4, 8, 8), torch.tensor([0.5]))[0]
    return out, seen


def test_a_default_entry_fills_only_what_the_other_entries_leave() -> None:
    left_half = CondEntry(embeds=torch.full((1, 77, 4), 1.0), area=(8, 4, 0, 0))
    default = ConditioningSetDefaultCombine().run(None, cond=[left_half], cond_DEFAULT=[_entry(5.0)])[0]
    out, _ = _calc(default)
    # far right: only the default (5); far left: the area entry (1), the default weighted by 0 there
    assert torch.allclose(out[..., 7], torch.full_like(out[..., 7], 5.0))
    assert torch.allclose(out[..., 0], torch.full_like(out[..., 0], 1.0))
    # an entry covering everything at weight 1 leaves nothing: the default is not even run
    covered = ConditioningSetDefaultCombine().run(None, cond=[_entry(1.0)], cond_DEFAULT=[_entry(5.0)])[0]
    out, seen = _calc(covered)
    assert seen == [1.0] and torch.equal(out, torch.ones_like(out))
    # alone, the default is the whole prediction
    out, _ = _calc(ConditioningSetDefaultCombine().run(None, cond=[], cond_DEFAULT=[_entry(5.0)])[0])
    assert torch.allclose(out, torch.full_like(out, 5.0))


def test_timesteps_range_gives_the_range_and_what_is_before_and_after() -> None:
    assert ConditioningTimestepsRange().run(None, start_percent=0.25, end_percent=0.75) == (
        (0.25, 0.75),
        (0.0, 0.25),
        (0.75, 1.0),
    )
    schema = ConditioningTimestepsRange.SCHEMA
    assert [o.name for o in schema.outputs] == ["TIMESTEPS_RANGE", "BEFORE_RANGE", "AFTER_RANGE"]


def test_conditioning_multiply_scales_embeds_and_pooled() -> None:
    (out,) = ConditioningMultiply().run(None, conditioning=[_entry(2.0)], multiplier=-1.5)
    assert torch.equal(out[0].embeds, torch.full((1, 77, 4), -3.0))
    assert torch.equal(out[0].pooled, torch.full((1, 2), -3.0))


def test_the_schemas_are_comfyuis() -> None:
    props = ConditioningSetProperties.SCHEMA
    assert [i.name for i in props.inputs] == [
        "cond_NEW",
        "strength",
        "set_cond_area",
        "mask",
        "hooks",
        "timesteps",
    ]
    assert [i.optional for i in props.inputs] == [False, False, False, True, True, True]
    assert [o.name for o in PairConditioningSetProperties.SCHEMA.outputs] == ["positive", "negative"]
    assert [i.name for i in PairConditioningSetDefaultCombine.SCHEMA.inputs] == [
        "positive", "negative", "positive_DEFAULT", "negative_DEFAULT", "hooks",
    ]  # fmt: skip
