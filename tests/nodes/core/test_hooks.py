"""SamplingHooks as a spec: how patches' hooks combine and in which order the sampler meets them."""

from __future__ import annotations

from typing import Any

import torch

from nodes.core.sampling_hooks import BlockPatch, ModelCall, RunInfo, SamplingHooks, merge_all


def _call(**kwargs: Any) -> ModelCall:
    return ModelCall(torch.zeros(2, 1), torch.tensor([5.0]), None, kwargs, ("uncond", "cond"))


def test_first_patch_wraps_outermost_and_forward_kwargs_reach_the_forward_last() -> None:
    seen: list[str] = []

    def wrapper(name: str) -> Any:
        def wrap(apply: Any, call: ModelCall) -> torch.Tensor:
            seen.append(f"{name} in")
            out = apply(call.with_kwargs({name: True}))
            seen.append(f"{name} out")
            return out

        return wrap

    def forward(call: ModelCall) -> torch.Tensor:
        seen.append(f"forward {sorted(call.cond_kwargs)}")
        return call.x_in + 1

    hooks = merge_all(
        [
            SamplingHooks(model_wrappers=(wrapper("a"),)),
            SamplingHooks(model_wrappers=(wrapper("b"),), forward_kwargs=(lambda call: {"extra": 1},)),
        ]
    )
    out = hooks.apply_model(forward)(_call(text=0))
    assert torch.equal(out, torch.ones(2, 1))
    assert seen == ["a in", "b in", "forward ['a', 'b', 'extra', 'text']", "b out", "a out"]


def test_merge_concatenates_in_patch_order_last_cfg_function_wins_flags_or() -> None:
    calls: list[int] = []
    first = SamplingHooks(
        run_start=(lambda info: calls.append(1),),
        cfg_function=lambda args: torch.zeros(1),
        disable_cfg1_optimization=True,
        block_patches=(BlockPatch("attn2_patch", print),),
    )
    second = SamplingHooks(run_start=(lambda info: calls.append(2),), cfg_function=lambda args: torch.ones(1))
    merged = first.merged(second)
    merged.start_run(RunInfo(None, 1, 4))
    assert calls == [1, 2]
    assert merged.cfg_function is second.cfg_function and merged.disable_cfg1_optimization
    assert first.merged(SamplingHooks()).cfg_function is first.cfg_function
    assert merged.transformer_options() == {"patches": {"attn2_patch": [print]}}
    assert SamplingHooks().transformer_options() == {}
    assert SamplingHooks().apply_model(lambda call: call.x_in)(_call()).shape == (2, 1)


def test_predict_wrappers_wrap_the_guided_step_first_patch_outermost() -> None:
    seen: list[str] = []

    def wrapper(name: str) -> Any:
        def wrap(predict: Any, x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
            seen.append(name)
            return predict(x * 2, sigma)

        return wrap

    hooks = merge_all(
        [SamplingHooks(predict_wrappers=(wrapper("a"),)), SamplingHooks(predict_wrappers=(wrapper("b"),))]
    )
    out = hooks.predict(lambda x, sigma: x + sigma)(torch.ones(1), torch.tensor([0.5]))
    assert seen == ["a", "b"] and torch.equal(out, torch.tensor([4.5]))
    assert torch.equal(
        SamplingHooks().predict(lambda x, sigma: x)(torch.ones(1), torch.zeros(1)), torch.ones(1)
    )
